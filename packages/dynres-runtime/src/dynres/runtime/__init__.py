"""dynres runtime: controller, load balancer, message queue, loops, backends, simulator, CLI."""

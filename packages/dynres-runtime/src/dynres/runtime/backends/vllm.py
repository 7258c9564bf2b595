"""vLLM backend: one vLLM v1 ``AsyncLLM`` engine per :class:`~dynres.runtime.protocols.Replica`.

How each replica operation maps onto vLLM:

======================  =====================================================================
``generate``            ``AsyncLLM.generate`` on token ids, ``output_kind=DELTA`` and
                        ``logprobs=0`` (the sampled token's log-prob); streamed internally so
                        that an abort still returns every token produced so far. A request
                        with ``partial_token_ids`` resumes: prompt + partial becomes the prompt,
                        ``max_tokens`` shrinks by the partial length, and the result
                        concatenates partial and new tokens/log-probs.
``abort``               ``AsyncLLM.abort(ids)``; the stream ends with ``finish_reason="abort"``.
``pause`` / ``resume``  ``pause_generation(mode="keep", clear_cache=False)`` /
                        ``resume_generation()``: requests stay queued with their KV cache.
``sleep`` / ``wake_up`` ``AsyncLLM.sleep(level)`` / ``wake_up(tags)``. On CPU vLLM only pauses the
                        scheduler and frees no memory (logged once as a warning).
``update_weights``      buckets written as safetensors files in ``/dev/shm``, then
                        ``collective_rpc("dynres_load_weight_files")`` on the
                        :class:`DynresWorkerExtension`, which feeds them through the worker's
                        ``model_runner.reload_weights(weights_iterator=...)`` (layer-wise reload +
                        post-load processing); then ``reset_prefix_cache()``.
``health``              ``AsyncLLM.errored`` / ``check_health()`` plus our in-flight count.
======================  =====================================================================

Why the worker extension and not ``model.load_weights``: after loading, vLLM's CPU linear layers
keep their weights in a processed (repacked) form and the original parameters read back as
zeros, so writing tensors into parameters directly changes nothing; ``reload_weights`` re-runs
the post-load processing. Why not the built-in ``collective_rpc("reload_weights",
weights_path=dir)``: it works too, but it repoints the engine's ``model_config.model`` at the
temporary directory and was a little slower. Why files in ``/dev/shm`` and not tensors over the RPC:
``collective_rpc`` arguments cross two process hops (client -> engine core -> worker) and torch
tensors do not survive that serialisation; raw bytes do, but were several times slower than a
RAM-backed file that the worker memory-maps. docs/real-runs.md ("How weights reach a vLLM replica") has
the timings of the three ways.

Log-probs are vLLM's default ``logprobs_mode`` (raw log-softmax, before temperature); pass
``engine_kwargs={"logprobs_mode": "processed_logprobs"}`` for the sampling distribution.
Per-request SamplingParams extras can ride in ``GenerationRequest.extra["sampling"]``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynres.core.errors import BackendError, BackendTimeoutError, MissingExtraError
from dynres.runtime.backends.extras import RunningMean
from dynres.runtime.backends.weights import WeightBuckets, remove_bucket_files, write_bucket_files
from dynres.runtime.protocols import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    OperationCosts,
    ReplicaHealth,
    ReplicaKind,
    WeightUpdate,
)

log = logging.getLogger(__name__)

WORKER_EXTENSION = "dynres.runtime.backends.vllm.DynresWorkerExtension"
"""Qualified name of the worker extension that loads weight files (vLLM ``worker_extension_cls``)."""

_CPU_SLEEP_WARNED = False


def _import_vllm():
    """Import the vLLM pieces the replica needs, or raise MissingExtraError naming ``vllm``."""
    try:
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise MissingExtraError("vllm", "vllm") from exc
    return AsyncLLM, AsyncEngineArgs, SamplingParams, RequestOutputKind, current_platform


_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
"""vLLM's finish reasons that map onto ours as they are (others, e.g. None, end as "stop")."""


class DynresWorkerExtension:
    """Mixed into each vLLM worker (``worker_extension_cls``): loads weight files in place."""

    def dynres_load_weight_files(self, paths: list[str]) -> int:
        """Reload the model from safetensors files (HF names); return the tensors read (count)."""
        from safetensors.torch import load_file

        count = 0

        def tensors():
            nonlocal count
            # One file (bucket) at a time: peak extra memory is one bucket, not the model.
            for path in paths:
                for item in load_file(path).items():
                    count += 1
                    yield item

        runner = self.model_runner  # type: ignore[attr-defined]  # a vLLM worker's attribute: this class is mixed into one
        runner.reload_weights(weights_iterator=tensors())
        return count


@dataclass(frozen=True)
class VllmReplicaConfig:
    """Engine arguments of one vLLM replica (see ``vllm.engine.arg_utils.AsyncEngineArgs``)."""

    model: str
    """Model directory (HF layout) or hub name."""
    dtype: str = "auto"
    """Weights/activation dtype ("auto", "float32", "bfloat16", ...)."""
    max_model_len: int | None = None
    """Longest prompt + response (tokens); None = the model's maximum."""
    gpu_memory_utilization: float = 0.9
    """Fraction of accelerator memory the engine may take (hybrid replicas use a smaller one)."""
    enable_sleep_mode: bool = True
    """Ask for vLLM sleep mode; silently off where the platform lacks it (CPU)."""
    seed: int = 0
    """Seed of the engine's sampling RNG (vLLM ``seed``); a request's own ``seed`` overrides it."""
    enforce_eager: bool = False
    """Disable CUDA graphs / torch.compile (faster start, slower decode)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of common prefixes (reset after every weight update)."""
    skip_tokenizer_init: bool = True
    """Token-id prompts only: no tokenizer is loaded."""
    ignore_eos: bool = False
    """Generate to ``max_tokens`` even after EOS (benchmarks and tests)."""
    stop_token_ids: tuple[int, ...] | None = None
    """Extra stop tokens; None = the model config's ``eos_token_id`` (needed without a tokenizer)."""
    weight_dir: str | None = None
    """Where weight buckets are written for loading (None = /dev/shm, else the temp dir)."""
    cpu_kv_cache_gib: float | None = 1.0
    """On CPU: KV cache size (GiB) exported as VLLM_CPU_KVCACHE_SPACE when that is unset (None = vLLM's default)."""
    op_timeout_s: float = 300.0
    """Timeout of each control operation (seconds)."""
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Any other ``AsyncEngineArgs`` field, passed through unchanged."""

    @classmethod
    def for_kind(
        cls,
        kind: ReplicaKind,
        model: str,
        *,
        gpu_memory_utilization: float = 0.9,
        standalone_gpu_memory_utilization: float | None = None,
        **kwargs: Any,
    ) -> VllmReplicaConfig:
        """Build a config whose memory fraction follows the rollout keys (standalone null -> shared)."""
        util = gpu_memory_utilization
        if kind == ReplicaKind.STANDALONE and standalone_gpu_memory_utilization is not None:
            util = standalone_gpu_memory_utilization
        return cls(model=model, gpu_memory_utilization=util, **kwargs)


def _model_eos_ids(model_dir: str) -> tuple[int, ...]:
    """EOS id(s) from ``generation_config.json`` / ``config.json`` of a local model dir (may be empty)."""
    import json

    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(model_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        if isinstance(eos, int):
            ids.append(eos)
        elif isinstance(eos, list):
            ids.extend(int(e) for e in eos)
        if ids:
            break
    return tuple(dict.fromkeys(ids))


class _Running:
    """Book-keeping of one in-flight request (tokens so far, abort flag)."""

    __slots__ = ("abort_requested", "logprobs", "token_ids")

    def __init__(self) -> None:
        """Start with no tokens."""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.abort_requested = False


class VllmReplica:
    """A :class:`Replica` backed by one vLLM v1 ``AsyncLLM`` engine (one process group per replica).

    Build it with ``await VllmReplica.create(...)`` (the engine starts in a thread: it takes
    seconds even for a tiny model, see backend.json's start times). On CPU, ``sleep``/``wake_up``
    pause and resume the engine but free no memory: vLLM's CPU worker ignores sleep mode.
    """

    def __init__(self, replica_id: str, kind: ReplicaKind, config: VllmReplicaConfig, engine: Any) -> None:
        """Wrap an already started ``AsyncLLM`` (use :meth:`create` to start one)."""
        _, _, self._SamplingParams, self._OutputKind, platform = _import_vllm()
        self.replica_id = replica_id
        self.kind = kind
        self.config = config
        self.engine = engine
        self.weight_version = 0
        self._on_cpu = bool(platform.is_cpu())
        self._running: dict[str, _Running] = {}
        self.generated_tokens = 0
        """Response tokens generated here, added when a request finishes or is aborted (tokens)."""
        self._sleeping = False
        self._paused = False
        self._closed = False
        self._avg = {op: RunningMean() for op in ("sleep", "wake_up", "abort", "update_weights")}
        if config.stop_token_ids is not None:
            self._stop_ids = tuple(config.stop_token_ids)
        else:
            self._stop_ids = _model_eos_ids(config.model) if os.path.isdir(config.model) else ()

    # ------------------------------------------------------------------ construction
    @classmethod
    def engine_args(cls, config: VllmReplicaConfig) -> Any:
        """Translate a :class:`VllmReplicaConfig` into ``AsyncEngineArgs``."""
        _, AsyncEngineArgs, _, _, platform = _import_vllm()
        kwargs: dict[str, Any] = dict(
            model=config.model,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            # Sleep mode needs the cumem allocator (CUDA); asking for it elsewhere is an error.
            enable_sleep_mode=config.enable_sleep_mode and platform.is_sleep_mode_available(),
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=config.enable_prefix_caching,
            skip_tokenizer_init=config.skip_tokenizer_init,
            worker_extension_cls=WORKER_EXTENSION,
        )
        kwargs.update(config.engine_kwargs)
        return AsyncEngineArgs(**kwargs)

    @classmethod
    async def create(
        cls, replica_id: str, config: VllmReplicaConfig, kind: ReplicaKind = ReplicaKind.STANDALONE
    ) -> VllmReplica:
        """Start an engine for ``config`` without blocking the event loop; return the replica."""
        AsyncLLM, *_, platform = _import_vllm()
        if platform.is_cpu() and config.cpu_kv_cache_gib is not None:
            # vLLM's CPU worker sizes its KV cache from this variable (read in the spawned engine
            # processes, which inherit our environment); an explicit setting by the user wins.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{config.cpu_kv_cache_gib:g}")
        args = cls.engine_args(config)
        try:
            # from_engine_args spawns the engine-core process and waits for it (seconds): run it in
            # a thread. Constructed off-loop, AsyncLLM starts its output handler lazily on the
            # first request, i.e. on this (the caller's) loop.
            engine = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        except Exception as exc:
            raise BackendError(
                f"vLLM replica {replica_id!r} failed to start for model {config.model!r}: {exc}; "
                "check the model path, max_model_len (<= max_position_embeddings) and memory settings"
            ) from exc
        return cls(replica_id, kind, config, engine)

    # ------------------------------------------------------------------ helpers
    async def _timed(self, op: str, coro: Any, timeout: float | None = None) -> Any:
        """Await ``coro`` under the op timeout, record its duration, map errors to BackendError."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        limit = self.config.op_timeout_s if timeout is None else timeout
        try:
            result = await asyncio.wait_for(coro, limit)
        except TimeoutError as exc:
            raise BackendTimeoutError(
                f"vLLM replica {self.replica_id!r}: {op} did not finish within {limit:.0f} s; "
                "raise VllmReplicaConfig.op_timeout_s or check the engine's health"
            ) from exc
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"vLLM replica {self.replica_id!r}: {op} failed: {exc}") from exc
        if op in self._avg:
            self._avg[op].add(loop.time() - start)
        return result

    def _sampling_params(self, request: GenerationRequest, max_tokens: int) -> Any:
        """SamplingParams for one request: DELTA streaming, sampled-token log-probs, no detokenize."""
        extra = dict(request.extra.get("sampling", {})) if request.extra else {}
        return self._SamplingParams(
            max_tokens=max_tokens,
            temperature=request.temperature,
            seed=request.seed,
            logprobs=0,
            ignore_eos=self.config.ignore_eos,
            stop_token_ids=list(self._stop_ids) or None,
            detokenize=False,
            output_kind=self._OutputKind.DELTA,
            **extra,
        )

    def _result(self, request: GenerationRequest, run: _Running, finish: FinishReason) -> GenerationResult:
        """Build the result: the request's partial output followed by this run's tokens."""
        return GenerationResult(
            request_id=request.request_id,
            token_ids=list(request.partial_token_ids) + run.token_ids,
            logprobs=list(request.partial_logprobs) + run.logprobs,
            finish_reason=finish,
            replica_id=self.replica_id,
            weight_version=self.weight_version,
        )

    # ------------------------------------------------------------------ Replica protocol
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate until stop/limit; on abort return ``finish_reason="abort"`` with all tokens so far."""
        if self._closed:
            raise BackendError(f"vLLM replica {self.replica_id!r} is shut down; route the request elsewhere")
        rid = request.request_id
        if rid in self._running:
            raise BackendError(
                f"vLLM replica {self.replica_id!r}: request {rid!r} is already running here; "
                "request ids must be unique among in-flight requests"
            )
        run = _Running()
        remaining = request.max_tokens - len(request.partial_token_ids)
        if remaining <= 0:
            # A resumed request that had already used its budget: nothing left to generate.
            return self._result(request, run, "length")
        prompt = {"prompt_token_ids": list(request.prompt_token_ids) + list(request.partial_token_ids)}
        params = self._sampling_params(request, remaining)
        self._running[rid] = run
        finish = "abort"
        try:
            async for out in self.engine.generate(prompt, params, rid):
                comp = out.outputs[0]
                new = list(comp.token_ids)
                run.token_ids.extend(new)
                if comp.logprobs:
                    # logprobs=0 gives one dict per token holding only the sampled token.
                    run.logprobs.extend(float(d[t].logprob) for t, d in zip(new, comp.logprobs, strict=False))
                if out.finished:
                    # No break: vLLM ends the stream itself after the final output, and breaking
                    # would leave the generator to be closed later by the garbage collector.
                    finish = comp.finish_reason or "abort"
                elif run.abort_requested:
                    # The abort raced with add_request (it reached vLLM before the request did):
                    # abort again now that the request exists.
                    await self.engine.abort(rid)
        except Exception as exc:
            if self.engine.errored:
                raise BackendError(
                    f"vLLM replica {self.replica_id!r} engine died during {rid!r}: {exc}; restart the replica"
                ) from exc
            raise BackendError(f"vLLM replica {self.replica_id!r}: generate {rid!r} failed: {exc}") from exc
        finally:
            self._running.pop(rid, None)
        self.generated_tokens += len(run.token_ids)
        # An abort wins over whatever vLLM reported; an unknown reason counts as a normal stop.
        reason: FinishReason = "abort" if run.abort_requested else _FINISH_REASONS.get(finish, "stop")
        return self._result(request, run, reason)

    async def abort(self, request_ids: Sequence[str] | None = None) -> list[str]:
        """Abort the given in-flight requests (None = all); return the ids that were running."""
        ids = list(self._running) if request_ids is None else [r for r in request_ids if r in self._running]
        if not ids:
            return []
        for rid in ids:
            self._running[rid].abort_requested = True
        await self._timed("abort", self.engine.abort(ids))
        return ids

    async def pause(self) -> None:
        """Stop scheduling tokens, keep requests and their KV cache (``pause_generation(mode="keep")``)."""
        await self._timed("pause", self.engine.pause_generation(mode="keep", clear_cache=False))
        self._paused = True

    async def resume(self) -> None:
        """Resume after :meth:`pause` (``resume_generation``)."""
        await self._timed("resume", self.engine.resume_generation())
        self._paused = False

    async def sleep(self, level: int = 1) -> None:
        """``AsyncLLM.sleep(level)``: in-flight requests end as aborted; on CPU no memory is freed."""
        global _CPU_SLEEP_WARNED
        if self._on_cpu and not _CPU_SLEEP_WARNED:
            _CPU_SLEEP_WARNED = True
            log.warning(
                "vLLM on CPU has no sleep mode: replica %s pauses but frees no memory "
                "(KV cache and weights stay allocated)",
                self.replica_id,
            )
        # vLLM's sleep aborts what is still running; flag it so those results say "abort".
        for run in self._running.values():
            run.abort_requested = True
        await self._timed("sleep", self.engine.sleep(level))
        self._sleeping = True

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """``AsyncLLM.wake_up(tags)`` with tags among "weights", "kv_cache" (None = all)."""
        await self._timed("wake_up", self.engine.wake_up(list(tags) if tags is not None else None))
        self._sleeping = bool(await self.engine.is_sleeping())

    async def update_weights(self, update: WeightUpdate) -> None:
        """Load ``update`` (a :class:`WeightBuckets` payload) into the engine and reset the prefix cache."""
        payload = update.payload
        if payload is None:
            # Simulation-style update without tensors: only the version moves.
            self.weight_version = update.version
            return
        if not isinstance(payload, WeightBuckets):
            raise BackendError(
                f"vLLM replica {self.replica_id!r}: weight update payload is {type(payload).__name__}; "
                "export weights with a dynres trainer engine (payload must be WeightBuckets)"
            )

        async def load() -> None:
            owned: list[str] = []
            files = list(payload.files)
            if not files:
                # Writing is CPU-bound: keep it off the event loop.
                owned = await asyncio.to_thread(
                    write_bucket_files, payload.buckets, self.config.weight_dir, f"dynres-{self.replica_id}"
                )
                files = owned
            try:
                await self.engine.collective_rpc("dynres_load_weight_files", args=(files,))
            finally:
                if owned:
                    await asyncio.to_thread(remove_bucket_files, owned)
            # Cached prefixes hold KV computed with the old weights.
            if not await self.engine.reset_prefix_cache():
                log.warning("replica %s: prefix cache not reset (requests still running hold blocks)", self.replica_id)

        await self._timed("update_weights", load())
        self.weight_version = update.version

    async def health(self) -> ReplicaHealth:
        """Report whether the engine serves, requests in flight, and whether it sleeps."""
        if self._closed:
            return ReplicaHealth(healthy=False, detail="shut down")
        if self.engine.errored:
            return ReplicaHealth(healthy=False, in_flight=len(self._running), detail=str(self.engine.dead_error))
        try:
            await asyncio.wait_for(self.engine.check_health(), self.config.op_timeout_s)
        except Exception as exc:
            return ReplicaHealth(healthy=False, in_flight=len(self._running), detail=f"check_health: {exc}")
        return ReplicaHealth(healthy=True, in_flight=len(self._running), sleeping=self._sleeping)

    def costs(self) -> OperationCosts:
        """Measured mean duration of this replica's own sleep / wake_up / abort / update_weights (s)."""
        return OperationCosts(
            sleep_s=self._avg["sleep"].mean,
            wake_up_s=self._avg["wake_up"].mean,
            abort_s=self._avg["abort"].mean,
            update_weights_s=self._avg["update_weights"].mean,
        )

    async def shutdown(self) -> None:
        """Abort what runs and stop the engine processes (idempotent)."""
        if self._closed:
            return
        try:
            if self._running and not self.engine.errored:
                await self.abort()
        finally:
            self._closed = True
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.shutdown)
            # AsyncLLM.__del__ calls shutdown() again; when that only happens at interpreter exit
            # it fails noisily on torn-down module globals. The engine is already down: make the
            # second call a no-op on this instance.
            engine.shutdown = lambda *args, **kwargs: None
            del engine
            gc.collect()

    # ------------------------------------------------------------------ extras for tests/tools
    @property
    def in_flight(self) -> int:
        """Requests running on this replica (count)."""
        return len(self._running)

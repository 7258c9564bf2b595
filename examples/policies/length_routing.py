"""`LengthRouting`: the `default` policy's switching, plus length-aware routing of requests.

Use it by path, as any policy file::

    dynres run examples/tiny-grpo-longtail-cpu.yaml \
        --set async_training.dynamic_schedule_policy=examples/policies/length_routing.py:LengthRouting

It predicts a response's length from what the runtime saw of the same prompt (its earlier samples,
``RequestContext.prompt_lengths``) and of the same sample (finished siblings), and keeps the
responses predicted long off the hybrid replicas: a hybrid is aborted at its next deactivation,
so a long response started there is likely cut. Only without partial rollout does the cut lose
the response's tokens (with it, the response resumes elsewhere and a hybrid's speed is worth more
than the re-prefill), so only then does it route. Everything else keeps the built-in rule (fewest
requests in flight). Switching is verl's
`default` rule unchanged, so a comparison with `default` isolates the routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import Any

from pydantic import Field

from dynres.core.errors import PolicyValidationError
from dynres.core.requests import RequestContext
from dynres.policies.default import DefaultPolicy


class LengthRouting(DefaultPolicy):
    """`default`, with responses predicted long kept on standalone replicas."""

    name = "length_routing"

    class Params(DefaultPolicy.Params):
        """`default`'s params plus the threshold of a long response."""

        long_ratio: float = Field(
            1.5,
            gt=0.0,
            description="A response is long when its predicted length is at least this many times the mean "
            "predicted length so far (ratio).",
        )
        warmup_predictions: int = Field(
            16,
            ge=1,
            description="Predictions to see before judging any response long: the mean of a handful says "
            "little about the workload (count).",
        )

    params: Params

    def __init__(self, params: Params | Mapping[str, Any] | None = None) -> None:
        """Start with no prediction seen."""
        super().__init__(params)
        self._predictions = 0
        self._mean_prediction = 0.0

    def predict_length(self, request: RequestContext) -> float | None:
        """Mean of the prompt's earlier lengths and the sample's finished siblings, at least what the
        request already generated (tokens); None when neither was seen."""
        seen = request.prompt_lengths + request.sibling_lengths
        if not seen:
            return None
        return max(fmean(seen), float(request.generated_tokens))

    def route(self, request: RequestContext) -> str | None:
        """The least-loaded standalone replica for a response predicted long while hybrids are routable
        and a cut would lose its tokens (no partial rollout); None (the built-in rule) otherwise."""
        predicted = request.predicted_tokens
        if predicted is None or request.partial_rollout:
            return None
        # The running mean of every prediction is the scale "long" is measured against: it follows the
        # workload without a per-run token threshold.
        self._predictions += 1
        self._mean_prediction += (predicted - self._mean_prediction) / self._predictions
        standalone = [r for r in request.replicas if r.kind == "standalone"]
        if not standalone or len(standalone) == len(request.replicas):
            return None
        if self._predictions <= self.params.warmup_predictions:
            return None
        if predicted < self.params.long_ratio * self._mean_prediction:
            return None
        return min(standalone, key=lambda r: r.in_flight).replica_id

    def state_dict(self) -> dict[str, Any]:
        """`default`'s state plus the predictions seen and their running mean, so that a resumed run
        judges "long" against the same scale (count, tokens)."""
        return {**super().state_dict(), "predictions": self._predictions, "mean_prediction": self._mean_prediction}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; reject missing keys or values of the wrong kind."""
        own = {"predictions", "mean_prediction"}
        if not own <= state.keys():
            raise PolicyValidationError(
                f"policy {self.name!r}: state lacks {sorted(own - state.keys())}; pass what state_dict() returned"
            )
        predictions, mean = state["predictions"], state["mean_prediction"]
        if isinstance(predictions, bool) or not isinstance(predictions, int) or predictions < 0:
            raise PolicyValidationError(f"policy {self.name!r}: predictions={predictions!r} is not a count >= 0")
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not 0 <= mean < float("inf"):
            raise PolicyValidationError(f"policy {self.name!r}: mean_prediction={mean!r} is not tokens >= 0")
        super().load_state_dict({k: v for k, v in state.items() if k not in own})
        self._predictions, self._mean_prediction = predictions, float(mean)

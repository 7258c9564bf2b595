"""Prompt groups (what a prompt source yields) and samples (what the message queue holds).

A **sample** is one prompt group: a prompt and its ``n`` responses (``rollout.n``). The
rollouter turns each :class:`PromptGroup` into ``n`` :class:`GenerationRequest` objects with
request ids ``"<sample_id>/<i>"``, and puts one :class:`Sample` into the queue when all ``n``
responses are finished.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from dynres.runtime.protocols import GenerationRequest, GenerationResult


@dataclass(frozen=True)
class PromptGroup:
    """One prompt to roll out ``n`` times; the unit a prompt source yields."""

    sample_id: str
    """Unique id of the sample (prompt group) within the run."""
    prompt_token_ids: Sequence[int]
    """Prompt tokens (any int sequence; ``range`` keeps simulated prompts cheap)."""
    n: int = 1
    """Responses to generate for the prompt (``rollout.n``, count)."""
    max_tokens: int = 1024
    """Token limit of each response (count)."""
    temperature: float = 1.0
    """Sampling temperature of each response."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Backend data shared by all responses (copied into each request's ``extra``)."""
    response_extra: Sequence[Mapping[str, Any]] | None = None
    """Per-response backend data (e.g. a simulated response length); one mapping per response."""
    prompt_id: str | None = None
    """The prompt's identity across epochs: groups of the same prompt share it, so a length
    prediction can use the prompt's earlier response lengths (None: unknown)."""

    def __post_init__(self) -> None:
        """Check that ``n`` >= 1 and that ``response_extra`` has one entry per response."""
        if self.n < 1:
            raise ValueError(f"PromptGroup {self.sample_id!r}: n must be >= 1, got {self.n}")
        if self.response_extra is not None and len(self.response_extra) != self.n:
            raise ValueError(
                f"PromptGroup {self.sample_id!r}: response_extra has {len(self.response_extra)} "
                f"entries but n={self.n}; give one mapping per response"
            )

    def request_id(self, index: int) -> str:
        """Request id of response ``index`` (stable across abort and retry)."""
        return f"{self.sample_id}/{index}"

    def requests(self) -> list[GenerationRequest]:
        """The ``n`` generation requests of this group, with no partial output yet."""
        out = []
        for i in range(self.n):
            extra = dict(self.extra)
            if self.response_extra is not None:
                extra.update(self.response_extra[i])
            out.append(
                GenerationRequest(
                    request_id=self.request_id(i),
                    sample_id=self.sample_id,
                    prompt_token_ids=self.prompt_token_ids,
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    extra=extra,
                    prompt_id=self.prompt_id,
                )
            )
        return out


@dataclass(frozen=True)
class Sample:
    """A finished prompt group, tagged with the weight versions it was generated with."""

    group: PromptGroup
    """The prompt group the sample answers."""
    responses: tuple[GenerationResult, ...]
    """One finished result per response, in request order."""
    start_version: int
    """Weight version of the replicas when the sample was admitted (staleness is counted from it)."""
    finish_version: int
    """Newest weight version that produced any of its last tokens."""
    started_s: float
    """Run-clock time the sample was admitted (seconds since run start)."""
    finished_s: float
    """Run-clock time its last response finished (seconds since run start)."""
    aborts: int = 0
    """Generation attempts of its responses that were aborted and retried (count)."""

    @property
    def sample_id(self) -> str:
        """The sample's id (its prompt group's id)."""
        return self.group.sample_id

    def staleness(self, trainer_version: int) -> int:
        """Weight versions between the sample's start and the trainer's current version (count)."""
        return trainer_version - self.start_version


# ---- JSON codec (checkpoints) -------------------------------------------------------------
# Token and log-prob sequences become lists; ``extra`` mappings must hold JSON values.


def group_to_dict(g: PromptGroup) -> dict[str, Any]:
    """A prompt group as JSON-serialisable data."""
    return {
        "sample_id": g.sample_id,
        "prompt_token_ids": list(g.prompt_token_ids),
        "n": g.n,
        "max_tokens": g.max_tokens,
        "temperature": g.temperature,
        "extra": dict(g.extra),
        "response_extra": None if g.response_extra is None else [dict(e) for e in g.response_extra],
        "prompt_id": g.prompt_id,
    }


def group_from_dict(d: Mapping[str, Any]) -> PromptGroup:
    """Inverse of :func:`group_to_dict`."""
    return PromptGroup(
        sample_id=d["sample_id"],
        prompt_token_ids=list(d["prompt_token_ids"]),
        n=int(d["n"]),
        max_tokens=int(d["max_tokens"]),
        temperature=float(d["temperature"]),
        extra=dict(d.get("extra") or {}),
        response_extra=d.get("response_extra"),
        prompt_id=d.get("prompt_id"),
    )


def result_to_dict(r: GenerationResult) -> dict[str, Any]:
    """A generation result as JSON-serialisable data."""
    return {
        "request_id": r.request_id,
        "token_ids": list(r.token_ids),
        "logprobs": [float(x) for x in r.logprobs],
        "finish_reason": r.finish_reason,
        "replica_id": r.replica_id,
        "weight_version": r.weight_version,
    }


def result_from_dict(d: Mapping[str, Any]) -> GenerationResult:
    """Inverse of :func:`result_to_dict`."""
    return GenerationResult(
        request_id=d["request_id"],
        token_ids=list(d["token_ids"]),
        logprobs=list(d["logprobs"]),
        finish_reason=d["finish_reason"],
        replica_id=d["replica_id"],
        weight_version=int(d["weight_version"]),
    )


def sample_to_dict(s: Sample) -> dict[str, Any]:
    """A finished sample as JSON-serialisable data."""
    return {
        "group": group_to_dict(s.group),
        "responses": [result_to_dict(r) for r in s.responses],
        "start_version": s.start_version,
        "finish_version": s.finish_version,
        "started_s": s.started_s,
        "finished_s": s.finished_s,
        "aborts": s.aborts,
    }


def sample_from_dict(d: Mapping[str, Any]) -> Sample:
    """Inverse of :func:`sample_to_dict`."""
    return Sample(
        group=group_from_dict(d["group"]),
        responses=tuple(result_from_dict(r) for r in d["responses"]),
        start_version=int(d["start_version"]),
        finish_version=int(d["finish_version"]),
        started_s=float(d["started_s"]),
        finished_s=float(d["finished_s"]),
        aborts=int(d.get("aborts", 0)),
    )


class Repeat(Sequence[float]):
    """``length`` copies of ``value`` in O(1) memory: the per-token log-probs of simulated and fake replicas."""

    __slots__ = ("_len", "_value")

    def __init__(self, length: int, value: float = 0.0) -> None:
        """``length`` items, each ``value``."""
        self._len = max(0, int(length))
        self._value = value

    def __len__(self) -> int:
        """Number of items."""
        return self._len

    @overload
    def __getitem__(self, i: int) -> float: ...
    @overload
    def __getitem__(self, i: slice) -> Repeat: ...
    def __getitem__(self, i: Any) -> Any:
        """Item ``i`` (always ``value``) or a shorter Repeat for a slice."""
        if isinstance(i, slice):
            return Repeat(len(range(*i.indices(self._len))), self._value)
        if not -self._len <= i < self._len:
            raise IndexError("Repeat index out of range")
        return self._value

    def __iter__(self) -> Iterator[float]:
        """Yield ``value`` ``length`` times."""
        for _ in range(self._len):
            yield self._value

    def __eq__(self, other: object) -> bool:
        """Equal to another sequence with the same items."""
        if isinstance(other, Repeat):
            return self._len == other._len and (self._len == 0 or self._value == other._value)
        if isinstance(other, Sequence):
            return len(other) == self._len and all(v == self._value for v in other)
        return NotImplemented

    def __repr__(self) -> str:
        """Repeat(length, value)."""
        return f"Repeat({self._len}, {self._value!r})"

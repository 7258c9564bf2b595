"""A random tiny Qwen2 causal LM and a toy verifiable reward, for tests and the tiny example.

Nothing here downloads anything: the model is random-initialised from a ``Qwen2Config`` and
saved with ``save_pretrained`` into a directory that both vLLM and ``transformers`` can load.
The default shape (hidden 64, 2 layers, 2 heads of head_dim 32, vocab 512) is about 0.13 M
parameters, small enough that a CPU vLLM engine starts in seconds and a train step takes
milliseconds.

The toy task is verifiable without a tokenizer: the first prompt token is a *rule* token
(:data:`RULE_EVEN` or :data:`RULE_ODD`) and the reward is the fraction of response tokens whose
parity matches the rule. A random policy scores about 0.5, so a policy-gradient step has a
clear signal to climb.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynres.runtime.backends.extras import require_module

RULE_EVEN = 1
"""Rule token: reward counts even response tokens."""
RULE_ODD = 2
"""Rule token: reward counts odd response tokens."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the random tiny Qwen2 (counts; head_dim = hidden / heads must be 32, 64, ...)."""

    vocab_size: int = 512
    """Vocabulary size (tokens)."""
    hidden_size: int = 64
    """Model width (features)."""
    intermediate_size: int = 128
    """MLP width (features)."""
    num_hidden_layers: int = 2
    """Transformer layers (count)."""
    num_attention_heads: int = 2
    """Query heads (count); head_dim = hidden_size / num_attention_heads."""
    num_key_value_heads: int = 1
    """Key/value heads (count; grouped-query attention when below the query heads)."""
    max_position_embeddings: int = 512
    """Longest sequence the model accepts (tokens); vLLM's max_model_len must not exceed it."""
    eos_token_id: int = 0
    """Token id that ends a response (vLLM stops there unless ``ignore_eos``)."""
    tie_word_embeddings: bool = False
    """Untied by default so that lm_head can be changed alone in tests."""


def _torch():
    """Import torch or raise MissingExtraError naming the ``torch`` extra."""
    return require_module("torch", "torch")


def _transformers():
    """Import transformers or raise MissingExtraError naming the ``torch`` extra."""
    return require_module("transformers", "torch")


def tiny_qwen2_config(spec: TinyModelSpec | None = None, *, dtype: str = "float32"):
    """Return a ``transformers.Qwen2Config`` for ``spec`` (dtype: "float32" or "bfloat16")."""
    spec = spec or TinyModelSpec()
    tf = _transformers()
    if spec.hidden_size % spec.num_attention_heads:
        raise ValueError("hidden_size must be a multiple of num_attention_heads")
    return tf.Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=spec.eos_token_id,
        eos_token_id=spec.eos_token_id,
        torch_dtype=dtype,
        use_sliding_window=False,
    )


def build_tiny_model(spec: TinyModelSpec | None = None, *, seed: int = 0, dtype: str = "float32"):
    """Build a random-initialised ``Qwen2ForCausalLM`` (in memory, CPU, eval mode)."""
    torch = _torch()
    tf = _transformers()
    config = tiny_qwen2_config(spec, dtype=dtype)
    # Seed a private generator state so building a model never disturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.Qwen2ForCausalLM(config)
        # The default init (std 0.02) gives near-uniform logits; a wider lm_head makes greedy
        # decoding decisive, so that a weight change visibly changes greedy output in tests.
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 0.5)
    model.to(getattr(torch, dtype))
    return model.eval()


def save_tiny_model(
    path: str | Path, spec: TinyModelSpec | None = None, *, seed: int = 0, dtype: str = "float32"
) -> Path:
    """Build a random tiny Qwen2 and save it (config + safetensors) into directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = build_tiny_model(spec, seed=seed, dtype=dtype)
    model.save_pretrained(path, safe_serialization=True)
    # vLLM reads generation_config.json for defaults; write a minimal one so that no
    # sampling default (top_k, repetition penalty ...) sneaks in from elsewhere.
    gen = {"eos_token_id": model.config.eos_token_id, "bos_token_id": model.config.bos_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen))
    return path


def make_prompts(n: int, *, length: int = 8, vocab_size: int = 512, seed: int = 0) -> list[list[int]]:
    """Return ``n`` toy prompts (token ids): a rule token followed by ``length - 1`` random tokens."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        rule = RULE_EVEN if i % 2 == 0 else RULE_ODD
        # Body tokens avoid the special ids 0..2 so the rule token stays unambiguous.
        prompts.append([rule] + [rng.randrange(3, vocab_size) for _ in range(length - 1)])
    return prompts


def prompt_token_limits(n: int, *, median: int, sigma: float, cap: int, seed: int = 0) -> list[int]:
    """Per-prompt response lengths of the long-tail task (tokens): ``min(cap, max(1, round(median x
    exp(sigma x Z))))`` with ``Z`` standard normal, one draw per prompt, so a prompt's responses are
    as long in every epoch while lengths across prompts are lognormal (heavy-tailed up to ``cap``)."""
    rng = random.Random(f"lengths-{seed}")  # its own stream: the prompts stay those of make_prompts(seed)
    return [min(cap, max(1, round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))) for _ in range(n)]


def parity_reward(prompt_token_ids: Sequence[int], response_token_ids: Sequence[int]) -> float:
    """Toy verifiable reward in [0, 1]: fraction of response tokens with the rule's parity."""
    if not response_token_ids:
        return 0.0
    want = 0 if (prompt_token_ids and prompt_token_ids[0] == RULE_EVEN) else 1
    hits = sum(1 for t in response_token_ids if t % 2 == want)
    return hits / len(response_token_ids)


def hf_greedy(model, prompt_token_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of ``prompt_token_ids`` with a HF causal LM (tokens, no EOS stop)."""
    torch = _torch()
    ids = torch.tensor([list(prompt_token_ids)], dtype=torch.long, device=model.device)
    out: list[int] = []
    with torch.no_grad():
        # A plain loop without KV cache: the models here are tiny and this avoids depending on
        # generate()'s defaults (EOS handling, generation_config) across transformers versions.
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids).logits[0, -1]
            nxt = int(torch.argmax(logits.float()))
            out.append(nxt)
            ids = torch.cat([ids, ids.new_tensor([[nxt]])], dim=1)
    return out

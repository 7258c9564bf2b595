"""Engine adapters import without their extras and raise MissingExtraError naming the extra."""

from __future__ import annotations

import sys

import pytest

from dynres.core.errors import MissingExtraError


@pytest.fixture()
def hide(monkeypatch):
    """Make the named top-level modules unimportable (as if not installed)."""

    def _hide(*names: str) -> None:
        for name in names:
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                monkeypatch.delitem(sys.modules, mod)
            monkeypatch.setitem(sys.modules, name, None)

    return _hide


def test_vllm_missing_names_the_vllm_extra(hide):
    from dynres.runtime.backends import vllm as backend

    hide("vllm")
    with pytest.raises(MissingExtraError, match=r"dynres-runtime\[vllm\]") as info:
        backend._import_vllm()
    assert info.value.extra == "vllm"


def test_torch_missing_names_the_torch_extra(hide):
    from dynres.runtime.backends import torch_engine, weights
    from dynres.runtime.realrun import tiny_task as tiny_model

    hide("torch", "transformers", "safetensors")
    for fn in (
        torch_engine._torch,
        tiny_model._torch,
        weights._torch,
        weights._safetensors_torch,
        tiny_model._transformers,
    ):
        with pytest.raises(MissingExtraError, match=r"\[torch\]"):
            fn()
    with pytest.raises(MissingExtraError, match=r"\[torch\]"):
        torch_engine.TorchTrainEngine(object())


def test_megatron_missing_names_the_megatron_extra(hide):
    from dynres.runtime.backends import megatron

    hide("megatron")
    with pytest.raises(MissingExtraError, match=r"\[megatron\]"):
        megatron.import_megatron_core()

"""Issue #27 item 1: transformers picks a package's kernels (flash-linear-attention) at import for every tensor,
and Triton cannot read CPU tensors, so a CPU run on a machine with the GPU extras installed crashed at the
prefill. The choice must follow the tensors' device (engine/backends.py: kernels_follow_device).

No GPU here: a stand-in `fla` package whose kernels refuse CPU tensors as Triton does is put where transformers
looks for it, and a fresh copy of transformers' real Qwen3.5 modeling module is imported so that its real
`use_kernel_func_from_hub_with_fallback` picks the stand-in, exactly as it picks fla on a CUDA machine."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from ddtree_viz.engine.backends import by_device, kernels_follow_device
from tests.tiny import hybrid_config

FRESH = "transformers.models.qwen3_5._kernel_choice_probe"


def _refuses_cpu(name):
    def kernel(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and not a.is_cuda for a in (*args, *kwargs.values())):
            raise ValueError(f"{name}: Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")
        raise AssertionError("no CUDA tensors in these tests")
    return kernel


@pytest.fixture
def modeling_with_gpu_kernels(monkeypatch):
    """transformers' Qwen3.5 modeling module imported afresh while a CPU-refusing `fla` is importable."""
    fla = types.ModuleType("fla")
    ops = types.ModuleType("fla.ops")
    gdr = types.ModuleType("fla.ops.gated_delta_rule")
    gdr.chunk_gated_delta_rule = _refuses_cpu("chunk_gated_delta_rule")
    gdr.fused_recurrent_gated_delta_rule = _refuses_cpu("fused_recurrent_gated_delta_rule")
    fla.ops, ops.gated_delta_rule = ops, gdr
    for name, module in (("fla", fla), ("fla.ops", ops), ("fla.ops.gated_delta_rule", gdr)):
        monkeypatch.setitem(sys.modules, name, module)
    real = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    spec = importlib.util.spec_from_file_location(FRESH, real.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, FRESH, fresh)
    spec.loader.exec_module(fresh)
    return real, fresh


def _model(module, seed=0):
    torch.manual_seed(seed)
    return module.Qwen3_5ForCausalLM(hybrid_config()).eval()


def test_the_stand_in_reproduces_the_crash(modeling_with_gpu_kernels):
    """Without the switch, transformers' choice (made at import) sends CPU tensors to the GPU kernel."""
    _, fresh = modeling_with_gpu_kernels
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(ValueError, match="cpu tensor"):
        _model(fresh)(input_ids=ids)


def test_cpu_tensors_take_the_torch_form(modeling_with_gpu_kernels):
    """After kernels_follow_device, a CPU forward gives exactly what transformers gives with no package kernel."""
    real, fresh = modeling_with_gpu_kernels
    model = _model(fresh)
    assert kernels_follow_device(model) >= 2  # the two delta-rule kernels at least
    assert kernels_follow_device(model) == 0  # idempotent
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    reference = _model(real)
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_by_device_dispatches_on_the_first_tensor():
    calls = []
    fn = by_device(lambda *a, **k: calls.append("kernel"), lambda *a, **k: calls.append("reference"))
    fn(torch.zeros(2), 3)
    fn(x=torch.zeros(1))
    assert calls == ["reference", "reference"]
    if torch.cuda.is_available():
        fn(torch.zeros(2, device="cuda"))
        assert calls[-1] == "kernel"

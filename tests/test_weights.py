"""The weight formats' package (engine/weights/, issue #66): every format behind one protocol, chosen in one registry.

Each registered format recognises its own small config by name and reads it back as a spec naming it; each module of
the package that holds a FORMAT is registered (one file and one registry line make a format); each format's plain
reference (`dequantize`, from its stored parts) is its checkpoints' dequantization by hand; and nothing outside
engine/weights reads a config's quant_method or compares a string with one (an AST check that refuses a made-up
case too). Loading each format through load_pair is tests/test_fp8.py's, test_int4.py's and test_int4_formats.py's.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

from ddtree_viz.engine.weights import autoround, base, fp8, int4_common, plain, registry
from ddtree_viz.errors import ModelLoadError
from tests.test_int4_formats import awq_by_hand, by_hand, gptq_quantize, store

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ROOT / "ddtree_viz" / "engine" / "weights"
METHODS = {m for f in registry.FORMATS.values() for m in f.methods}


@pytest.mark.parametrize("name", sorted(registry.FORMATS))
def test_every_format_reads_its_own_config_back_by_name(name):
    fmt = registry.FORMATS[name]
    assert isinstance(fmt, base.WeightFormat) and isinstance(fmt.layout, base.FastLayout) and fmt.name == name
    config = {"quantization_config": fmt.example()} if fmt.methods else {}
    spec = registry.spec_of(config, "target")
    assert registry.format_of(spec) is fmt
    if fmt.methods:
        assert isinstance(spec, base.Spec) and spec.format == name and fmt.example()["quant_method"] in fmt.methods
        assert spec.label(torch.bfloat16)  # people read it
    else:
        assert spec is None and fmt.example() == {}


def test_each_method_has_one_format_and_each_format_module_is_registered():
    assert len(registry.BY_METHOD) == sum(len(f.methods) for f in registry.FORMATS.values())
    with_format = set()
    for path in sorted(WEIGHTS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FORMAT" for t in n.targets)
               for n in tree.body):
            with_format.add(importlib.import_module(f"ddtree_viz.engine.weights.{path.stem}").FORMAT)
    assert with_format == set(registry.FORMATS.values())
    assert {fp8.Fp8Linear, int4_common.Int4Linear} <= set(registry.KEPT) and torch.nn.Linear not in registry.KEPT
    assert registry.layout_of(torch.nn.Linear(2, 2)) is plain.FORMAT.layout
    assert registry.layout_of(torch.nn.ReLU()) is None


def test_an_unknown_method_lists_every_format_that_loads():
    """The refusal's words as they were before the registry (the first five formats'), each format's listed."""
    for method in ("bitsandbytes", ["gptq"], 4, None):
        with pytest.raises(ModelLoadError) as info:
            registry.spec_of({"quantization_config": {"quant_method": method}}, "target")
        message = str(info.value)
        assert message.startswith(
            f"target config quantization_config: quant_method {method!r} is not supported (the FP8 layout, "
            "quant_method 'fp8', and 4-bit weights in compressed-tensors' pack-quantized format, GPTQ's, AWQ's")
        assert message.endswith(" load)")
        assert all(f.described in message for f in registry.FORMATS.values())


def test_stored_parameters_count_each_format_s_parts():
    shapes = {"a.qweight": [2, 8], "a.scales": [1, 8], "a.qzeros": [1, 1], "a.g_idx": [16], "scales": [5],
              "b.weight_packed": [4, 2], "b.weight_scale": [4, 1], "b.weight_shape": [2],
              "c.weight": [3, 3], "c.weight_scale_inv": [1, 1], "d.scales": [2, 2]}
    counts = {name: registry.stored_parameters(name, shape, shapes) for name, shape in shapes.items()}
    assert counts == {"a.qweight": 128, "a.scales": 0, "a.qzeros": 0, "a.g_idx": 0, "scales": 5,
                      "b.weight_packed": 64, "b.weight_scale": 0, "b.weight_shape": 0,
                      "c.weight": 9, "c.weight_scale_inv": 0, "d.scales": 4}


@pytest.mark.parametrize("packing", ["gptq", "gptq_v2", "awq", "auto_round:auto_gptq", "auto_round",
                                     "auto_round:auto_awq"])
def test_each_4bit_format_s_reference_is_its_dequantization_by_hand(packing):
    """A weight [40, 48] in groups of 16 (asymmetric), stored as the format stores it: `dequantize` from those parts
    equals GPTQModel's / AutoAWQ's dequantization computed one field at a time; `check` passes it and refuses it
    with a part missing, as loading does."""
    q = gptq_quantize(torch.randn(40, 48, generator=torch.Generator().manual_seed(0)), 16, False, False, 0)
    stored = autoround.PACKINGS.get(packing, packing)
    parts: dict[str, torch.Tensor] = {}
    store(parts, "", q, stored, g_idx=packing in ("gptq", "gptq_v2"))
    qc = ({"quant_method": "awq", "bits": 4, "group_size": 16} if packing == "awq" else
          {"quant_method": "gptq", "bits": 4, "group_size": 16, "sym": False, "checkpoint_format": packing}
          if packing.startswith("gptq") else
          {"quant_method": "auto-round", "bits": 4, "group_size": 16, "sym": False, "packing_format": packing})
    spec = registry.spec_of({"quantization_config": qc}, "target")
    fmt = registry.format_of(spec)
    hand = awq_by_hand(parts, "", 16) if stored == "awq" else by_hand(parts, "", stored, 16)
    assert torch.equal(fmt.dequantize(parts, spec), hand)
    fmt.check("layer.", parts, spec, "target")
    with pytest.raises(ModelLoadError, match="layer.qzeros is missing"):
        fmt.check("layer.", {k: v for k, v in parts.items() if k != "qzeros"}, spec, "target")


def test_fp8_and_pack_quantized_references_and_checks():
    w = torch.randn(40, 48, generator=torch.Generator().manual_seed(1))
    spec = fp8.Fp8Spec((16, 16))
    weight, scale = fp8.quantize(w, spec.block)
    parts = {"": weight, fp8.SCALE_SUFFIX: scale}
    assert torch.equal(fp8.FORMAT.dequantize(parts, spec), weight.float() * scale.repeat_interleave(16, 0)
                       .repeat_interleave(16, 1)[:40, :48])
    fp8.FORMAT.check("x.weight", parts, spec, "target")
    with pytest.raises(ModelLoadError, match=r"scales x.weight_scale_inv have shape \[3, 2\]"):
        fp8.FORMAT.check("x.weight", {"": weight, fp8.SCALE_SUFFIX: scale[:, :2]}, spec, "target")
    int4_spec = int4_common.Int4Spec(16, False)
    packed = int4_common.quantize(w, int4_spec)
    ct = registry.FORMATS["compressed-tensors"]
    assert torch.equal(ct.dequantize(packed, int4_spec), int4_common.dequantize(packed, int4_spec))
    ct.check("x.", packed, int4_spec, "target")
    bad = packed["weight_scale"].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ModelLoadError, match=r"x.weight_scale holds 1 non-finite value \(NaN"):
        ct.check("x.", {**packed, "weight_scale": bad}, int4_spec, "target")


def test_plain_weights_go_through_as_stored():
    t = torch.randn(3, 2, dtype=torch.bfloat16)
    state = registry.format_of(None).state(["w"], {"w": t}.__getitem__, None, torch.float32, "drafter")
    assert state["w"] is t and torch.equal(plain.FORMAT.dequantize({"": t}, None), t.float())


# ---- the registry is the only place a format is chosen ---------------------------------------------------------


def format_choices(source: str, path: str = "<source>") -> list[str]:
    """'path:line' for each place `source` reads a config's quant_method (the string "quant_method") or compares a
    value with a registered quant_method (==, !=, in, not in, against the string or a tuple, list or set holding
    it): choosing a format, which only engine/weights/registry.py does."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Constant) and node.value == "quant_method":
            found.append(f"{path}:{node.lineno} reads quant_method")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(v, ast.Constant) and v.value in METHODS for v in values):
                    found.append(f"{path}:{node.lineno} compares with {ast.unparse(side)}")
    return sorted(found, key=lambda f: int(f.split(":")[1].split()[0]))


# The benchmarks' --fp8 / --int4 flags name which random weights a bench run builds (benchmarks/gpu/: weights ==
# "fp8"); they never read a checkpoint's config, so they are no format choice.
NOT_CHECKED = ("ddtree_viz/engine/weights/", "ddtree_viz/benchmarks/")


def test_no_module_outside_the_weights_package_chooses_a_format():
    found = []
    for path in sorted((ROOT / "ddtree_viz").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(NOT_CHECKED):
            found += format_choices(path.read_text(encoding="utf-8"), rel)
    assert found == []


def test_the_format_check_refuses_what_it_should():
    source = ("qc = config.get('quant_method')\n"
              "if method == 'gptq': pass\n"
              "if method in ('awq', 'other'): pass\n"
              "if 'fp8' != kind: pass\n"
              "if kind == 'int4' or name in ['plain']: pass\n")
    assert format_choices(source) == ["<source>:1 reads quant_method", "<source>:2 compares with 'gptq'",
                                      "<source>:3 compares with ('awq', 'other')", "<source>:4 compares with 'fp8'"]
    assert {"fp8", "compressed-tensors", "gptq", "awq", "auto-round", "intel/auto-round"} == METHODS


def test_kept_modules_say_their_bytes():
    """What a step reads of each kept kind (gpu_bench's weight_bytes_of): FP8's bytes and scales, 4-bit's words and
    zero points and scales; every other parameter apart."""
    from ddtree_viz.benchmarks.gpu.memory import weight_bytes_of

    model = torch.nn.Sequential(torch.nn.Linear(48, 40, bias=False), torch.nn.Linear(40, 48, bias=False),
                                torch.nn.LayerNorm(48))
    assert fp8.quantize_linears(model, (16, 16), skip=("1",)) == 1
    assert int4_common.quantize_linears(model, int4_common.Int4Spec(16, False)) == 1  # the plain one left
    q = model[1]
    words = q.weight_packed.numel() * 4 + q.weight_zero_point.numel() * 4
    assert weight_bytes_of(model) == {"bytes": 40 * 48 + 3 * 3 * 4 + words + 48 * 3 * 2 + 48 * 2 * 4,
                                      "quantized_bytes": 40 * 48 + words, "scale_bytes": 3 * 3 * 4 + 48 * 3 * 2,
                                      "other_bytes": 48 * 2 * 4}

"""4-bit weight-only checkpoints in compressed-tensors' pack-quantized layout (engine/weights/compressed_tensors.py,
int4_common.py; issue #29's W4A16): a tiny hybrid and its DFlash drafter saved in it load through `load_pair` /
`run --target DIR --draft DIR`, their weights equal to the checkpoint dequantized by hand (numpy bit operations, one field at a time, in float32), and
decode identical to greedy and to that hand-dequantized model's own generation. Every bad layout is refused with
the tensor's name.

The target is symmetric with groups of 128 over 192-wide rows (the last group partial); the drafter asymmetric with
groups of 32 (zero points packed along the rows, 8 to a word: rows not a multiple of 8 leave the last word part
empty)."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ddtree_viz.engine.weights import compressed_tensors, int4_common as int4
from ddtree_viz.engine.models import load_pair
from ddtree_viz.errors import ModelLoadError
from ddtree_viz.trace import Trace
from tests import tiny

HIDDEN = 192
TARGET_SPEC = int4.Int4Spec(128, True, ("lm_head", "re:.*in_proj_a", "re:.*in_proj_b"))
DRAFT_SPEC = int4.Int4Spec(32, False, ())
NOT_CONVERTED = ("lm_head", "model.embed_tokens", "linear_attn.in_proj_a", "linear_attn.in_proj_b")
LABEL = "int4 w4a16 group 128 sym (dequantized to float32)"
DRAFT_LABEL = "int4 w4a16 group 32 asym (dequantized to float32)"


def _to_int4_layout(directory, spec: int4.Int4Spec, skip=NOT_CONVERTED) -> None:
    """Rewrite a saved model directory in the pack-quantized layout (parts + quantization_config)."""
    def change(state, config):
        converted = compressed_tensors.quantize_state(state, spec, lambda name: not any(s in name for s in skip))
        state.clear()
        state.update(converted)
        config["quantization_config"] = compressed_tensors.config_entry(spec)

    tiny.edit_checkpoint(directory, change)


def field(words: np.ndarray, index: int, along: int) -> np.ndarray:
    """The signed 4-bit values at `index` along the packed dim (word index // 8, bits 4 * (index % 8) ..)."""
    w = np.take(words.view(np.uint32), index // 8, axis=along)
    return ((w >> np.uint32(4 * (index % 8))) & np.uint32(0xF)).astype(np.int64) - 8


def by_hand(parts: dict, group: int, symmetric: bool) -> torch.Tensor:
    """(q - z) x scale, one column at a time, in float32 (the reference for the loader)."""
    out, inn = parts["weight_shape"].tolist()
    packed, scale = parts["weight_packed"].numpy(), parts["weight_scale"].float().numpy()
    zero = None if symmetric else np.stack([field(parts["weight_zero_point"].numpy(), r, 0) for r in range(out)])
    result = np.empty((out, inn), dtype=np.float32)
    for c in range(inn):
        g = c // group
        q = field(packed, c, 1).astype(np.float32)
        if zero is not None:
            q = q - zero[:, g]
        result[:, c] = q * scale[:, g]
    return torch.from_numpy(result)


def hand_dequantized(directory, spec: int4.Int4Spec) -> dict[str, torch.Tensor]:
    state = load_file(str(directory / "model.safetensors"))
    out = {}
    for name, tensor in state.items():
        if name.endswith("weight_packed"):
            prefix = name.removesuffix("weight_packed")
            parts = {p: state[prefix + p] for p in int4.PARTS if prefix + p in state}
            out[prefix + "weight"] = by_hand(parts, spec.group, spec.symmetric)
        elif not any(name.endswith(p) for p in int4.PARTS):
            out[name] = tensor
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(int4 target dir, int4 drafter dir, the hand-dequantized target model)."""
    root = tmp_path_factory.mktemp("int4")
    target, draft = tiny.save_pair(tiny.tiny_pair(hidden=HIDDEN), root / "plain")
    int4_target, int4_draft = root / "int4" / "target", root / "int4" / "draft"
    shutil.copytree(target, int4_target)
    shutil.copytree(draft, int4_draft)
    _to_int4_layout(int4_target, TARGET_SPEC)
    _to_int4_layout(int4_draft, DRAFT_SPEC, skip=())
    reference = tiny.target_model(hidden=HIDDEN)
    reference.load_state_dict(hand_dequantized(int4_target, TARGET_SPEC))
    return int4_target, int4_draft, reference


def test_the_layout_is_compressed_tensors_pack_quantized(checkpoints):
    """Eight fields a word along the columns (q + 8, the first in the low bits), scales [out, groups] in bf16, zero
    points packed along the rows, the shape as (out, in); the modules not converted as they were."""
    int4_target, int4_draft, _ = checkpoints
    state = load_file(str(int4_target / "model.safetensors"))
    gate = "model.layers.0.mlp.gate_proj."
    packed, scale = state[gate + "weight_packed"], state[gate + "weight_scale"]
    assert packed.dtype == torch.int32 and tuple(packed.shape) == (384, 24)
    assert tuple(scale.shape) == (384, 2) and scale.dtype == torch.bfloat16
    assert state[gate + "weight_shape"].tolist() == [384, 192] and gate + "weight" not in state
    assert gate + "weight_zero_point" not in state and state["lm_head.weight"].dtype == torch.float32
    values = torch.tensor([[-8, -1, 0, 7, 3, -5, 2, 1, 6]])
    words = int4.pack(values, 1)
    assert words.tolist() == [[int(np.int32(np.uint32(0x9A3BF870))), 0xE]]  # nibbles q + 8, low bits first
    assert torch.equal(int4.unpack(words, 9, 1), values.int())
    drafter = load_file(str(int4_draft / "model.safetensors"))
    zero = [k for k in drafter if k.endswith("weight_zero_point")]
    rows = {k: drafter[k.replace("zero_point", "shape")][0] for k in zero}
    assert zero and all(drafter[k].shape[0] == math.ceil(rows[k] / 8) for k in zero)
    config = json.loads((int4_target / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"


def slow_pack(values: torch.Tensor, dim: int) -> torch.Tensor:
    """The obviously correct pack: each word the sum of its eight fields (q + 8) << 4j in int64, then read as int32."""
    v = (values.to(torch.int64) + 8) if dim == 1 else (values.to(torch.int64) + 8).T
    rows, cols = v.shape
    v = torch.nn.functional.pad(v, (0, -cols % 8)).reshape(rows, -1, 8)
    words = (v << (torch.arange(8, dtype=torch.int64) * 4)).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words if dim == 1 else words.T.contiguous()


@pytest.mark.parametrize("shape", [(1, 8), (1, 384), (3, 9), (384, 1), (75, 136), (16, 64)])
@pytest.mark.parametrize("dim", [0, 1])
def test_pack_is_the_fields_summed(shape, dim):
    """int4.pack (two fields a byte, four bytes a word) equals the int64 sum of shifted fields, one-row and one-column
    tensors, partial words and the sign bit (a top field of 8 or more) included; unpack inverts it."""
    values = torch.randint(-8, 8, shape, generator=torch.Generator().manual_seed(shape[0] * 7 + dim))
    words = int4.pack(values, dim)
    assert words.dtype == torch.int32 and torch.equal(words, slow_pack(values, dim))
    assert torch.equal(int4.unpack(words, shape[dim], dim), values.int())


def test_loads_as_dequantized_by_hand(checkpoints):
    """Target and drafter weights equal the checkpoint dequantized by hand in float32, bit for bit; the precision
    says what was loaded."""
    int4_target, int4_draft, reference = checkpoints
    pair = load_pair(str(int4_target), str(int4_draft))
    tiny.assert_same_weights(pair.target.state_dict(), reference.state_dict())
    drafter = hand_dequantized(int4_draft, DRAFT_SPEC)
    for name, tensor in pair.drafter.state_dict().items():
        assert torch.equal(tensor, drafter[name]), name
    assert pair.target_precision == LABEL and pair.draft_precision == DRAFT_LABEL
    bf16 = load_pair(str(int4_target), str(int4_draft), dtype="bfloat16")
    name = "model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(bf16.target.state_dict()[name], reference.state_dict()[name].to(torch.bfloat16))  # rounded once


@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_run_decodes_int4_target_as_its_greedy(checkpoints, capsys, tmp_path, engine):
    """`run --target INT4 --draft INT4` on both engines: identical to greedy, equal to the hand-dequantized model's own
    generation, the precision printed and in the trace."""
    int4_target, int4_draft, reference = checkpoints
    out, trace = tiny.run_quantized(int4_target, int4_draft, engine, tmp_path, capsys)
    assert LABEL in out and "of the checkpoint's" not in out  # a packed weight counts its 4-bit values
    assert trace.settings["target_precision"] == LABEL and trace.settings["draft_precision"] == DRAFT_LABEL
    tiny.assert_generated_by(trace, reference)


@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_a_plain_drafter_quantized_at_load_drafts_for_the_same_output(checkpoints, capsys, tmp_path, engine):
    """--draft-weights int4 (issue #67 item 1: the 27B's drafter in 0.83 GiB, not 3.22): a plain drafter's Linears
    made 4-bit at load, symmetric in groups of 128, drafting for the plain target on both engines: the output is
    still greedy's and the same as with the plain drafter (the drafter only proposes), the precision printed and
    in the trace; a drafter stored quantized is refused, as is another format."""
    plain_target, plain_draft = checkpoints[0].parent.parent / "plain" / "target", checkpoints[0].parent.parent / "plain" / "draft"
    label = "int4 w4a16 group 128 sym (quantized at load; 4-bit weights, float32 activations)"
    out, trace = tiny.run_quantized(plain_target, plain_draft, engine, tmp_path, capsys, "--draft-weights", "int4")
    assert label in out and trace.settings["draft_precision"] == label
    _, plain = tiny.run_quantized(plain_target, plain_draft, engine, tmp_path, capsys)
    assert trace.output_ids == plain.output_ids and plain.settings["draft_precision"] == "float32"
    # the 4-bit weights drafted: the first round's tree from the same context, its log-probs not the plain drafter's
    first, first_plain = trace.steps[0].nodes, plain.steps[0].nodes
    assert [n.logprob for n in first] != [n.logprob for n in first_plain]
    pair = load_pair(str(plain_target), str(plain_draft), draft_weights="int4")
    linears = [m for m in pair.drafter.modules() if isinstance(m, torch.nn.Linear)]
    quantized = [m for m in pair.drafter.modules() if isinstance(m, int4.Int4Linear)]
    assert quantized and not linears and all(m.group == 128 and m.weight_zero_point is None for m in quantized)
    from ddtree_viz.engine.costs import pair_key  # its costs are not the plain drafter's: cached apart

    assert pair_key(pair, "runner", 8) != pair_key(load_pair(str(plain_target), str(plain_draft)), "runner", 8)
    from ddtree_viz.errors import InputError

    with pytest.raises(InputError, match="quantizes a drafter of plain weights; this one is stored as int4 w4a16 group 32"):
        load_pair(str(plain_target), str(checkpoints[1]), draft_weights="int4")
    with pytest.raises(InputError, match="--draft-weights must be one of int4, not 'fp8'"):
        load_pair(str(plain_target), str(plain_draft), draft_weights="fp8")


def test_precision_audit_of_a_drafter_quantized_at_load(checkpoints, tmp_path, capsys):
    """`analyze --draft-weights-b int4`: what a 4-bit drafter costs in acceptance. A: the plain pair; B: the same
    with its drafter made 4-bit at load. Both sides greedy's output (the drafter only proposes), each side's
    acceptance its own traces', B's drafter labelled; `none` takes A's --draft-weights off for B."""
    from ddtree_viz import cli

    plain = checkpoints[0].parent.parent / "plain"
    label = "int4 w4a16 group 128 sym (quantized at load; 4-bit weights, float32 activations)"
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n\nclass A:\n")
    for flags, (a_label, b_label) in (((), ("float32", label)), (("--draft-weights", "int4"), (label, "float32"))):
        out = tmp_path / f"out{len(flags)}"
        rc = cli.main(["analyze", "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "16",
                       "--budget", "4", "--no-speedup", "--target", str(plain / "target"), "--draft",
                       str(plain / "draft"), *flags, "--draft-weights-b", "int4" if not flags else "none"])
        assert rc == 0, capsys.readouterr().err
        audit = json.loads((out / "summary.json").read_text())["precision_audit"]
        assert (audit["a"]["draft_precision"], audit["b"]["draft_precision"]) == (a_label, b_label)
        assert audit["prompts_compared"] == 2
        for row in audit["per_prompt"]:
            a, b = Trace.load(out / row["file_a"]), Trace.load(out / row["file_b"])
            assert a.output_ids == a.greedy_ids == b.output_ids == b.greedy_ids and row["part_at"] is None
            assert b.settings["draft_precision"] == b_label
        capsys.readouterr()


def test_4bit_weights_kept_are_the_checkpoints_parts(checkpoints):
    """keep_quantized (a CUDA GPU's default): each quantized Linear of target and drafter holds the checkpoint's parts
    as stored (int4.Int4Linear: about half a byte a parameter), the modules left out stay plain, the precision says
    so; transformers' forward gives the hand-dequantized model's logits bit for bit (float32 on a CPU: the weight
    dequantized for the call), and the kept drafter drafts the dequantized drafter's trees node for node (through
    the static drafter, the function its CUDA graphs capture, the same trees, log-probs within 1e-5)."""

    int4_target, int4_draft, reference = checkpoints
    pair, plain = (load_pair(str(int4_target), str(int4_draft), keep_quantized=keep) for keep in (True, False))
    for model, directory in ((pair.target, int4_target), (pair.drafter, int4_draft)):
        stored = load_file(str(directory / "model.safetensors"))
        kept = {n: m for n, m in model.named_modules() if isinstance(m, int4.Int4Linear)}
        assert {f"{n}.weight_packed" for n in kept} == {k for k in stored if k.endswith("weight_packed")}
        for name, m in kept.items():
            for part, tensor in m.parts().items():
                assert torch.equal(tensor, stored[f"{name}.{part}"]), (name, part)
        params = sum(m.in_features * m.out_features for m in kept.values())
        nbytes = sum(t.numel() * t.element_size() for m in kept.values() for t in m.parts().values())
        assert nbytes / params < 0.6  # float32 dequantized: 4 bytes a parameter
    assert type(pair.target.model.layers[0].linear_attn.in_proj_a) is torch.nn.Linear
    assert type(pair.target.lm_head) is torch.nn.Linear
    for loaded in (pair, plain):
        tiny.assert_parameters_counted(loaded, reference)
    assert pair.target_precision == LABEL.replace("dequantized to float32", "4-bit weights, float32 activations")
    assert pair.draft_precision == DRAFT_LABEL.replace("dequantized to float32", "4-bit weights, float32 activations")
    assert pair.drafter.activations == (torch.device("cpu"), torch.float32)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(pair.target(input_ids=ids).logits, reference(input_ids=ids).logits)
    tiny.assert_kept_drafter_drafts_as_plain(pair, plain)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_runner_with_4bit_weights_kept_decodes_the_hand_dequantized_greedy(checkpoints, fused):
    """The static runner over Int4Linear weights on the CPU (the function its CUDA graphs capture, the 4-bit GEMM
    there): its greedy and its DDTree equal the hand-dequantized model's own greedy, token for token, in float32.
    Fused: the 4-bit parts stacked (words and scales as one storage each), the bf16 in_proj_b / in_proj_a a run of
    their own."""
    from ddtree_viz.engine.fused import FusedRuns

    int4_target, int4_draft, reference = checkpoints
    pair, runner = tiny.kept_runner(int4_target, int4_draft, fused)
    if fused:
        gdn, attention, mlp = runner._fused[0, "mixer"], runner._fused[3, "mixer"], runner._fused[0, "mlp"]
        assert isinstance(gdn, FusedRuns) and gdn.counts == (2, 2)  # qkv + z in 4 bits, b + a plain
        assert [type(r).__name__ for r in gdn.runs] == ["FusedInt4Linear", "FusedLinear"]
        assert isinstance(attention, int4.FusedInt4Linear) and isinstance(mlp, int4.FusedInt4Linear)
        layer = pair.target.model.layers[0].mlp
        assert layer.up_proj.weight_packed.data_ptr() == mlp.packed[layer.gate_proj.out_features].data_ptr()
        assert layer.up_proj.weight_scale.data_ptr() == mlp.scale[layer.gate_proj.out_features].data_ptr()
    tiny.assert_runner_decodes_as(pair, runner, reference)


def test_activation_order_and_channel_scales_dequantize_by_group_index():
    """weight_g_idx (activation order) picks each column's group; strategy "channel" is one scale a row."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(9, 20, generator=g)
    spec = int4.Int4Spec(8, False)
    parts = int4.quantize(w, spec)
    order = torch.randperm(20, generator=g) // 8  # a permuted column -> group map, 3 groups
    parts["weight_g_idx"] = order.to(torch.int32)
    q = torch.stack([torch.from_numpy(field(parts["weight_packed"].numpy(), c, 1)) for c in range(20)], 1).float()
    z = torch.stack([torch.from_numpy(field(parts["weight_zero_point"].numpy(), r, 0)) for r in range(9)]).float()
    expect = (q - z[:, order]) * parts["weight_scale"].float()[:, order]
    assert torch.equal(int4.dequantize(parts, spec), expect)
    channel = int4.Int4Spec(0, True)
    parts = int4.quantize(w, channel)
    assert tuple(parts["weight_scale"].shape) == (9, 1)
    assert (int4.dequantize(parts, channel) - w).abs().max() <= parts["weight_scale"].float().max() / 2 + 1e-6


GATE = "model.layers.0.mlp.gate_proj."
WEIGHTS = ("quantization_config", "config_groups", "group_0", "weights")


def _set(config, keys, **values):
    for k in keys:
        config = config[k]
    config.update(values)


BAD_LAYOUTS = {
    "missing scales": (lambda s, c: s.pop(GATE + "weight_scale"),
                       f"{GATE}weight is packed but {GATE}weight_scale is missing"),
    "mis-shaped scales": (lambda s, c: s.update({GATE + "weight_scale": torch.ones(384, 3, dtype=torch.bfloat16)}),
                          f"{GATE}weight_scale has shape [384, 3]; weight [384, 192] in groups of 128 needs [384, 2]"),
    "packed not int32": (lambda s, c: s.update({GATE + "weight_packed": s[GATE + "weight_packed"].to(torch.int64)}),
                         f"{GATE}weight_packed is int64, not int32"),
    "mis-shaped packed": (lambda s, c: s.update({GATE + "weight_packed": s[GATE + "weight_packed"][:, :20].clone()}),
                          f"{GATE}weight_packed has shape [384, 20]"),
    "missing shape": (lambda s, c: s.pop(GATE + "weight_shape"), f"{GATE}weight_shape is missing"),
    "scales without packed weight": (lambda s, c: s.update({"model.layers.0.mlp.extra.weight_scale": torch.ones(1, 1)}),
                                     "model.layers.0.mlp.extra.weight_scale has no packed weight"),
    "asymmetric without zero points": (lambda s, c: _set(c, WEIGHTS, symmetric=False),
                                       "weight_zero_point is missing"),
    "missing weight": (lambda s, c: [s.pop(GATE + p) for p in ("weight_packed", "weight_scale", "weight_shape")],
                       "target weights missing from"),
    "unknown format": (lambda s, c: c["quantization_config"].update(format="marlin-24"),
                       "format 'marlin-24' is not supported (only 'pack-quantized')"),
    "8-bit weights": (lambda s, c: _set(c, WEIGHTS, num_bits=8), "weights of 8 bits of type 'int' are not supported"),
    "activations quantized": (lambda s, c: _set(c, WEIGHTS[:-1], input_activations={"num_bits": 8}),
                              "quantizes activations; only weight-only checkpoints (W4A16) load"),
    "tensor strategy": (lambda s, c: _set(c, WEIGHTS, strategy="tensor"), "weight strategy 'tensor' is not supported"),
    "bad group size": (lambda s, c: _set(c, WEIGHTS, group_size=0), "group_size must be a whole number >= 1, not 0"),
    "hostile shape": (lambda s, c: s.update({GATE + "weight_shape": torch.tensor([10 ** 12, 192])}),
                      f"{GATE}weight_packed has shape [384, 24]; weight [1000000000000, 192] in groups of 128 needs"),
    "shape not two whole numbers": (lambda s, c: s.update({GATE + "weight_shape": torch.tensor([384.0, 192.0])}),
                                    f"{GATE}weight_shape must hold (out, in)"),
    "g_idx outside the groups": (lambda s, c: s.update({GATE + "weight_g_idx": torch.full((192,), 7)}),
                                 f"{GATE}weight_g_idx names groups outside 0 .. 1"),
    "quantized kv cache": (lambda s, c: c["quantization_config"].update(kv_cache_scheme={"num_bits": 8}),
                           "a quantized KV cache (kv_cache_scheme) is not supported"),
    "sparse weights": (lambda s, c: c["quantization_config"].update(sparsity_config={"format": "sparse-24-bitmask"}),
                       "sparse weights ('sparse-24-bitmask') are not supported"),
    # issue #64: a NaN / inf scale loaded silently, every output token '!' and called identical to greedy
    "NaN scale": (lambda s, c: s[GATE + "weight_scale"].__setitem__((5, 1), math.nan),
                  f"target tensor {GATE}weight_scale holds 1 non-finite value (NaN; the first at [5, 1])"),
    "inf scale": (lambda s, c: s[GATE + "weight_scale"].__setitem__((0, 0), math.inf),
                  f"target tensor {GATE}weight_scale holds 1 non-finite value (inf; the first at [0, 0])"),
}


@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_bad_layouts_are_refused(checkpoints, tmp_path, case):
    int4_target, int4_draft, _ = checkpoints
    broken = tmp_path / "target"
    shutil.copytree(int4_target, broken)
    change, message = BAD_LAYOUTS[case]
    tiny.edit_checkpoint(broken, change)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(broken), str(int4_draft))
    assert message in str(info.value)


def test_precision_audit_of_a_4bit_target_beside_its_plain_one(checkpoints, tmp_path, capsys):
    """analyze's precision audit with B the 4-bit target and A the plain one it was made from (the same drafter):
    each side's precision and figures its own, where the two greedy decodings part computed from the traces."""
    from tests.test_fp8 import _analyze

    int4_target, _, _ = checkpoints
    plain = int4_target.parent.parent / "plain"
    out, summary, captured = _analyze(tmp_path, capsys, "--target", str(plain / "target"), "--draft",
                                      str(plain / "draft"), "--target-b", str(int4_target))
    audit = summary["precision_audit"]
    assert (audit["a"]["target_precision"], audit["b"]["target_precision"]) == ("float32", LABEL)
    assert audit["b"]["mean_acceptance"] == summary["b"]["mean_acceptance"] and audit["prompts_compared"] == 4
    for row in audit["per_prompt"]:
        a, b = Trace.load(out / row["file_a"]), Trace.load(out / row["file_b"])
        n = min(len(a.greedy_ids), len(b.greedy_ids))
        parted = [k for k in range(n) if a.greedy_ids[k] != b.greedy_ids[k]]
        assert row["part_at"] == (parted[0] if parted else None)
    assert f"B: target {LABEL}, drafter float32" in captured.out

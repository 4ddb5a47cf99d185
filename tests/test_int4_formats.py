"""4-bit GPTQ and AWQ checkpoints (engine/int4_formats.py): a tiny hybrid saved in GPTQModel's layout (qweight
packed along the inputs, qzeros along the outputs, v1 storing each zero point minus one, scales [groups, out],
g_idx) or AutoAWQ's GEMM layout (qweight [in, out / 8] and qzeros packed along the outputs in AWQ's interleaved
field order) loads through `load_pair` / `run --target DIR`, its weights equal to the checkpoint dequantized by hand
(scales[g, o] x (u[i, o] - zero[g, o]), each field read one at a time in numpy), kept packed or dequantized, and
decodes identical to greedy and to that hand-dequantized model's own generation. Every bad layout is refused by
name.

The layouts: GPTQ symmetric v1 with groups of 128 over 192-wide rows (the last group partial), in activation order
(a permuted g_idx), asymmetric v2 with groups of 32, per channel (group_size -1); AWQ with groups of 128 and 32."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ddtree_viz import cli
from ddtree_viz.engine import int4
from ddtree_viz.engine.models import load_pair
from ddtree_viz.errors import ModelLoadError
from ddtree_viz.trace import Trace
from tests import tiny

HIDDEN = 192
SKIP = ("lm_head", "embed_tokens", "in_proj_a", "in_proj_b")
LAYOUTS = {  # name: (group_size, sym, checkpoint_format ("awq": AutoAWQ's), activation order)
    "sym-v1": (128, True, "gptq", False),
    "sym-v1-actorder": (128, True, "gptq", True),
    "asym-v2": (32, False, "gptq_v2", False),
    "channel-asym-v1": (-1, False, "gptq", False),
    "awq-g128": (128, False, "awq", False),
    "awq-g32": (32, False, "awq", False),
}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's pack: field f of a word holds output 8c + AWQ_ORDER[f]


def gptq_quantize(w: torch.Tensor, group: int, sym: bool, actorder: bool, seed: int) -> dict[str, np.ndarray]:
    """A weight [out, in] round to nearest in GPTQ's terms: u [in, out] in 0..15, zero points [groups, out] (true
    values, 8 when symmetric), scales [groups, out] in float16, g_idx [in]."""
    out, inn = w.shape
    group = inn if group == -1 else group
    groups = -(-inn // group)
    g_idx = np.arange(inn) // group
    if actorder:
        g_idx = np.random.default_rng(seed).permutation(inn) // group
    wt = w.T.double().numpy()  # [in, out]
    scales, zeros = np.zeros((groups, out)), np.zeros((groups, out), dtype=np.int64)
    for g in range(groups):
        cols = wt[g_idx == g]
        if sym:
            scales[g], zeros[g] = np.maximum(np.abs(cols).max(0) / 7, 1e-8), 8
        else:
            lo, hi = np.minimum(cols.min(0), 0), np.maximum(cols.max(0), 0)
            scales[g] = np.maximum((hi - lo) / 14, 1e-8)  # 14 steps: v1's zero point (stored minus 1) never 16
            zeros[g] = np.clip(np.round(-lo / scales[g]), 0, 14)
    scales = scales.astype(np.float16)
    u = np.clip(np.round(wt / scales[g_idx].astype(np.float64)) + zeros[g_idx], 0, 15).astype(np.int64)
    return {"u": u, "zeros": zeros, "scales": scales, "g_idx": g_idx}


def pack_words(values: np.ndarray, axis: int) -> np.ndarray:
    """Eight 4-bit values a uint32 word along `axis`, value 8r + j in bits 4j (GPTQModel's pack), as int32."""
    values = np.moveaxis(values, axis, 0)
    rows = -(-values.shape[0] // 8)
    padded = np.zeros((rows * 8,) + values.shape[1:], dtype=np.uint64)
    padded[:values.shape[0]] = values
    words = np.zeros((rows,) + values.shape[1:], dtype=np.uint64)
    for j in range(8):
        words |= padded[j::8] << np.uint64(4 * j)
    return np.ascontiguousarray(np.moveaxis(words.astype(np.uint32).view(np.int32), 0, axis))


def awq_words(values: np.ndarray) -> np.ndarray:
    """AutoAWQ's pack of [rows, out] values: word c of a row holds outputs 8c .. 8c+7, output 8c + AWQ_ORDER[f] in
    bits 4f .. 4f+3."""
    rows, out = values.shape
    padded = np.zeros((rows, -(-out // 8) * 8), dtype=np.uint64)
    padded[:, :out] = values
    words = np.zeros((rows, padded.shape[1] // 8), dtype=np.uint64)
    for f, k in enumerate(AWQ_ORDER):
        words |= padded[:, k::8] << np.uint64(4 * f)
    return np.ascontiguousarray(words.astype(np.uint32).view(np.int32))


def to_layout(directory, layout: str) -> None:
    group, sym, fmt, actorder = LAYOUTS[layout]

    def change(state, config):
        for i, name in enumerate([n for n in state if n.endswith(".weight") and state[n].dim() == 2
                                  and not any(s in n for s in SKIP)]):
            q = gptq_quantize(state.pop(name), group, sym, actorder, i)
            prefix = name.removesuffix("weight")
            if fmt == "awq":
                state.update({prefix + "qweight": torch.from_numpy(awq_words(q["u"])),
                              prefix + "qzeros": torch.from_numpy(awq_words(q["zeros"])),
                              prefix + "scales": torch.from_numpy(q["scales"])})
                continue
            stored_zeros = q["zeros"] - (1 if fmt == "gptq" else 0)
            state.update({prefix + "qweight": torch.from_numpy(pack_words(q["u"], 0)),
                          prefix + "qzeros": torch.from_numpy(pack_words(stored_zeros, 1)),
                          prefix + "scales": torch.from_numpy(q["scales"]),
                          prefix + "g_idx": torch.from_numpy(q["g_idx"].astype(np.int32))})
        config["quantization_config"] = (
            {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
             "modules_to_not_convert": list(SKIP)} if fmt == "awq" else
            {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym, "desc_act": actorder,
             "checkpoint_format": fmt, "damp_percent": 0.01})

    tiny.edit_checkpoint(directory, change)


def awq_by_hand(state: dict, prefix: str, group: int) -> torch.Tensor:
    """AutoAWQ's dequantization, one field at a time: output o of input i is field AWQ_ORDER.index(o % 8) of word
    o // 8; scales[g, o] x (u[i, o] - zero[g, o]), g = i // group."""
    qweight, qzeros = (state[prefix + part].numpy().view(np.uint32) for part in ("qweight", "qzeros"))
    scales = state[prefix + "scales"].float().numpy()
    inn, out = qweight.shape[0], scales.shape[1]
    group = inn if group == -1 else group

    def field(words, o):
        return ((words[:, o // 8] >> np.uint32(4 * AWQ_ORDER.index(o % 8))) & np.uint32(0xF)).astype(np.float32)

    w = np.empty((out, inn), dtype=np.float32)
    g = np.arange(inn) // group
    for o in range(out):
        w[o] = scales[g, o] * (field(qweight, o) - field(qzeros, o)[g])
    return torch.from_numpy(w)


def by_hand(state: dict, prefix: str, fmt: str) -> torch.Tensor:
    """GPTQModel's dequantize_weight, one input i at a time: scales[g, o] x (u[i, o] - zero[g, o]), g = g_idx[i]."""
    qweight, qzeros = (state[prefix + part].numpy().view(np.uint32) for part in ("qweight", "qzeros"))
    scales, g_idx = state[prefix + "scales"].float().numpy(), state[prefix + "g_idx"].numpy()
    out = qweight.shape[1]
    zeros = np.stack([(qzeros[:, o // 8] >> np.uint32(4 * (o % 8))) & np.uint32(0xF) for o in range(out)], 1)
    zeros = zeros.astype(np.float32) + (1 if fmt == "gptq" else 0)
    w = np.empty((out, len(g_idx)), dtype=np.float32)
    for i, g in enumerate(g_idx):
        u = ((qweight[i // 8] >> np.uint32(4 * (i % 8))) & np.uint32(0xF)).astype(np.float32)
        w[:, i] = scales[g] * (u - zeros[g])
    return torch.from_numpy(w)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{layout: (target dir, the hand-dequantized target model)}, and the plain drafter's dir."""
    root = tmp_path_factory.mktemp("gptq")
    target, draft = tiny.save_pair(tiny.tiny_pair(hidden=HIDDEN), root / "plain")
    out = {}
    for layout in LAYOUTS:
        directory = root / layout
        shutil.copytree(target, directory)
        to_layout(directory, layout)
        state = load_file(str(directory / "model.safetensors"))
        reference = tiny.target_model(hidden=HIDDEN)
        group, _, fmt, _ = LAYOUTS[layout]
        prefixes = [n.removesuffix("qweight") for n in state if n.endswith("qweight")]
        hand = {p + "weight": awq_by_hand(state, p, group) if fmt == "awq" else by_hand(state, p, fmt)
                for p in prefixes}
        reference.load_state_dict({**{n: t for n, t in state.items() if not n.endswith(
            ("qweight", "qzeros", "scales", "g_idx"))}, **hand})
        out[layout] = (directory, reference)
    return out, draft


def label(layout: str, kept: bool) -> str:
    group, sym, fmt, _ = LAYOUTS[layout]
    groups = "per channel" if group == -1 else f"group {group}"
    how = "4-bit weights, float32 activations" if kept else "dequantized to float32"
    return f"int4 w4a16 {groups} {'sym' if sym else 'asym'} {fmt} ({how})"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_loads_as_dequantized_by_hand_kept_or_not(checkpoints, layout):
    """Dequantized at load: every weight GPTQModel's formula's, bit for bit in float32; kept (a CUDA GPU's
    default): each quantized Linear an Int4Linear whose parts are the checkpoint's translated (qweight^T word for
    word), the same logits bit for bit; the precision says which."""
    layouts, draft = checkpoints
    directory, reference = layouts[layout]
    plain = load_pair(str(directory), str(draft))
    tiny.assert_same_weights(plain.target.state_dict(), reference.state_dict())
    kept = load_pair(str(directory), str(draft), keep_quantized=True)
    stored = load_file(str(directory / "model.safetensors"))
    modules = {n: m for n, m in kept.target.named_modules() if isinstance(m, int4.Int4Linear)}
    orders = set()  # whether each weight's g_idx was the plain one (dropped) or not (kept)
    assert {f"{n}.qweight" for n in modules} == {k for k in stored if k.endswith("qweight")}
    awq = LAYOUTS[layout][2] == "awq"
    for name, m in modules.items():
        if awq:  # fields repacked along the inputs: the same values as the checkpoint's, by hand above
            assert m.weight_g_idx is None and m.weight_zero_point is not None
            continue
        assert torch.equal(m.weight_packed, stored[f"{name}.qweight"].T)
        g_idx, group = stored[f"{name}.g_idx"].long(), LAYOUTS[layout][0]
        ordinary = torch.equal(g_idx, torch.arange(m.in_features) // (m.in_features if group == -1 else group))
        assert (m.weight_g_idx is None) == ordinary and (m.weight_zero_point is None) == LAYOUTS[layout][1]
        orders.add(ordinary)
    assert awq or orders == ({True, False} if LAYOUTS[layout][3] else {True})  # activation order: where wider
    assert (plain.target_precision, kept.target_precision) == (label(layout, False), label(layout, True))
    assert {n for n, m in kept.target.named_modules() if isinstance(m, torch.nn.Linear)} >= {
        "lm_head", "model.layers.0.linear_attn.in_proj_a"}  # the modules left out stay plain
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(kept.target(input_ids=ids).logits, reference(input_ids=ids).logits)


@pytest.mark.parametrize("engine, layout", [("transformers", "sym-v1-actorder"), ("runner", "sym-v1-actorder"),
                                            ("runner", "awq-g32")])
def test_run_decodes_a_gptq_or_awq_target_as_its_greedy(checkpoints, capsys, tmp_path, engine, layout):
    """`run --target GPTQ|AWQ` on both engines: identical to greedy, equal to the hand-dequantized model's own
    generation, the precision printed and in the trace."""
    layouts, draft = checkpoints
    directory, reference = layouts[layout]
    trace_path = tmp_path / "t.json"
    rc = cli.main(["run", "--target", str(directory), "--draft", str(draft), "--prompt", "def f(x):",
                   "--max-new-tokens", "16", "--budget", "8", "--engine", engine, "--trace", str(trace_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "output identical to greedy for" in out and label(layout, False) in out
    trace = Trace.load(trace_path)
    ids = torch.tensor([list(trace.prompt_ids)])
    with torch.no_grad():
        generated = reference.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None,
                                       pad_token_id=0)
    n = len(trace.output_ids)
    assert n >= 8 and list(trace.output_ids) == generated[0, ids.shape[1]:].tolist()[:n]


GATE = "model.layers.0.mlp.gate_proj."
QC = ("quantization_config",)


def _config(c, **values):
    c["quantization_config"].update(values)


BAD_LAYOUTS = {
    "missing qzeros": (lambda s, c: s.pop(GATE + "qzeros"),
                       f"{GATE}qweight is GPTQ-packed but {GATE}qzeros is missing"),
    "mis-shaped scales": (lambda s, c: s.update({GATE + "scales": s[GATE + "scales"][:, :100].clone()}),
                          f"{GATE}scales has shape [2, 100], not [groups, 384]"),
    "mis-shaped qweight": (lambda s, c: s.update({GATE + "qweight": s[GATE + "qweight"][:20].clone()}),
                           f"{GATE}qweight has shape [20, 384]; 192 inputs (g_idx) need 24 rows"),
    "float qzeros": (lambda s, c: s.update({GATE + "qzeros": s[GATE + "qzeros"].float()}),
                     f"{GATE}qzeros is float32, not an integer type"),
    "g_idx outside the groups": (lambda s, c: s.update({GATE + "g_idx": torch.full((192,), 5, dtype=torch.int32)}),
                                 f"{GATE}g_idx names groups outside 0 .. 1"),
    "sym config, other zero points": (lambda s, c: s.update({GATE + "qzeros": torch.zeros_like(s[GATE + "qzeros"])}),
                                      f"{GATE}qzeros: the config says sym but the zero points are not all 8"),
    "v1 zero point 15": (lambda s, c: (_config(c, sym=False), s.update(
        {GATE + "qzeros": torch.full_like(s[GATE + "qzeros"], -1)})), f"{GATE}qzeros holds a GPTQ v1 zero point of 15"),
    "scales without qweight": (lambda s, c: s.update({"model.layers.0.mlp.extra.scales": torch.ones(1, 1)}),
                               "model.layers.0.mlp.extra.scales has no packed weight model.layers.0.mlp.extra.qweight"),
    "8-bit": (lambda s, c: _config(c, bits=8), "GPTQ weights of 8 bits are not supported (only 4)"),
    "marlin format": (lambda s, c: _config(c, checkpoint_format="marlin"),
                      "GPTQ checkpoint format 'marlin' is not supported"),
    "group size 0": (lambda s, c: _config(c, group_size=0), "group_size must be a whole number >= 1 or -1, not 0"),
}


AWQ_BAD_LAYOUTS = {
    "awq missing qzeros": (lambda s, c: s.pop(GATE + "qzeros"),
                           f"{GATE}qweight is AWQ-packed but {GATE}qzeros is missing"),
    "awq mis-shaped qzeros": (lambda s, c: s.update({GATE + "qzeros": s[GATE + "qzeros"][:, :40].clone()}),
                              f"{GATE}qzeros has shape [6, 40]; 384 outputs need [6, 48]"),
    "awq mis-shaped scales": (lambda s, c: s.update({GATE + "scales": s[GATE + "scales"][:4].clone()}),
                              f"{GATE}scales has shape [4, 384]; 192 inputs need [6, out]"),
    "awq gemv version": (lambda s, c: _config(c, version="gemv"), "AWQ version 'gemv' is not supported (only 'gemm')"),
    "awq without zero points": (lambda s, c: _config(c, zero_point=False), "AWQ without zero points is not supported"),
}
BAD_LAYOUTS.update({case: (*entry, "awq-g32") for case, entry in AWQ_BAD_LAYOUTS.items()})


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept"])
@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_bad_layouts_are_refused(checkpoints, tmp_path, case, keep):
    layouts, draft = checkpoints
    broken = tmp_path / "target"
    change, message, *base = BAD_LAYOUTS[case]
    shutil.copytree(layouts[base[0] if base else "sym-v1"][0], broken)
    tiny.edit_checkpoint(broken, change)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(broken), str(draft), keep_quantized=keep)
    assert message in str(info.value)


def test_the_config_is_gptqmodels(checkpoints):
    """The test checkpoints carry what GPTQModel writes: quant_method gptq, bits, group_size, sym, desc_act and the
    checkpoint format; int32 words, float16 scales."""
    layouts, _ = checkpoints
    directory, _ = layouts["sym-v1"]
    qc = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["checkpoint_format"] == "gptq" and qc["bits"] == 4
    state = load_file(str(directory / "model.safetensors"))
    assert state[GATE + "qweight"].dtype == torch.int32 and tuple(state[GATE + "qweight"].shape) == (24, 384)
    assert state[GATE + "scales"].dtype == torch.float16 and tuple(state[GATE + "qzeros"].shape) == (2, 48)
    assert np.all(state[GATE + "qzeros"].numpy().view(np.uint32) == 0x77777777)  # v1: 8 - 1 in every field

"""4-bit GPTQ and AWQ checkpoints (engine/weights/gptq.py, awq.py, autoround.py): a tiny hybrid saved in GPTQModel's layout (qweight
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
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ddtree_viz.engine.weights import int4_common as int4, registry
from ddtree_viz.engine.weights.autoround import packing as autoround_packing
from ddtree_viz.engine.models import load_pair
from ddtree_viz.errors import ModelLoadError
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
    "sym-v1-dynamic": (128, True, "gptq", False),
}
DYNAMIC = {  # GPTQModel's per-layer rules, in order: the first whose regex re.match-es a layer's name rules it
    "sym-v1-dynamic": {"-:.*self_attn\\.o_proj": {},  # left in 16 bits
                       "+:model\\.layers\\.1\\.mlp\\.": {"group_size": 32, "sym": False},
                       "model\\.layers\\.1\\.mlp\\.down_proj": {"group_size": 64},  # after the rule above: unused
                       "+:model\\.layers\\.2\\.mlp\\.down_proj": {"group_size": -1}},
}


def gptq_rule(layout: str, layer: str) -> tuple[bool, int, bool]:
    """(quantized, group, sym) of a layer under its layout's dynamic rules, read off GPTQModel's docs."""
    import re

    group, sym, *_ = LAYOUTS[layout]
    for key, entry in DYNAMIC.get(layout, {}).items():
        if re.match(key.removeprefix("-:").removeprefix("+:"), layer):
            return not key.startswith("-:"), entry.get("group_size", group), entry.get("sym", sym)
    return True, group, sym
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


def store(state: dict, prefix: str, q: dict[str, np.ndarray], packing: str, g_idx: bool = True) -> None:
    """One quantized weight (gptq_quantize's) into the state dict as `packing` ("gptq": v1, each zero point stored
    minus one; "gptq_v2"; "awq") stores it; GPTQ's with its g_idx unless told not."""
    if packing == "awq":
        state.update({prefix + "qweight": torch.from_numpy(awq_words(q["u"])),
                      prefix + "qzeros": torch.from_numpy(awq_words(q["zeros"])),
                      prefix + "scales": torch.from_numpy(q["scales"])})
        return
    stored_zeros = q["zeros"] - (1 if packing == "gptq" else 0)
    state.update({prefix + "qweight": torch.from_numpy(pack_words(q["u"], 0)),
                  prefix + "qzeros": torch.from_numpy(pack_words(stored_zeros, 1)),
                  prefix + "scales": torch.from_numpy(q["scales"])})
    if g_idx:
        state[prefix + "g_idx"] = torch.from_numpy(q["g_idx"].astype(np.int32))


def to_layout(directory, layout: str) -> tuple[dict[str, int], str]:
    """The checkpoint in GPTQModel's or AutoAWQ's layout; returns each packed weight's group and the packing."""
    group, sym, fmt, actorder = LAYOUTS[layout]
    groups = {}

    def change(state, config):
        for i, name in enumerate([n for n in state if n.endswith(".weight") and state[n].dim() == 2
                                  and not any(s in n for s in SKIP)]):
            quantized, g, symmetric = gptq_rule(layout, name.removesuffix(".weight"))
            if quantized:
                groups[name.removesuffix("weight")] = g
                store(state, name.removesuffix("weight"), gptq_quantize(state.pop(name), g, symmetric, actorder, i),
                      fmt)
        config["quantization_config"] = (
            {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
             "modules_to_not_convert": list(SKIP)} if fmt == "awq" else
            {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym, "desc_act": actorder,
             "checkpoint_format": fmt, "damp_percent": 0.01, **({"dynamic": DYNAMIC[layout]} if layout in DYNAMIC
                                                                else {})})

    tiny.edit_checkpoint(directory, change)
    return groups, fmt


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


def by_hand(state: dict, prefix: str, fmt: str, group: int | None = None) -> torch.Tensor:
    """GPTQModel's dequantize_weight, one input i at a time: scales[g, o] x (u[i, o] - zero[g, o]), g = g_idx[i]
    (without a g_idx, AutoRound's, i // group)."""
    qweight, qzeros = (state[prefix + part].numpy().view(np.uint32) for part in ("qweight", "qzeros"))
    scales = state[prefix + "scales"].float().numpy()
    inn = qweight.shape[0] * 8
    g_idx = state[prefix + "g_idx"].numpy() if prefix + "g_idx" in state else np.arange(inn) // (group or inn)
    out = qweight.shape[1]
    zeros = np.stack([(qzeros[:, o // 8] >> np.uint32(4 * (o % 8))) & np.uint32(0xF) for o in range(out)], 1)
    zeros = zeros.astype(np.float32) + (1 if fmt == "gptq" else 0)
    w = np.empty((out, len(g_idx)), dtype=np.float32)
    for i, g in enumerate(g_idx):
        u = ((qweight[i // 8] >> np.uint32(4 * (i % 8))) & np.uint32(0xF)).astype(np.float32)
        w[:, i] = scales[g] * (u - zeros[g])
    return torch.from_numpy(w)


def hand_checkpoints(root, layouts, write) -> tuple[dict, object]:
    """{layout: (target dir, the hand-dequantized target model, each packed weight's group)} for a tiny hybrid saved
    by `write(directory, layout)` (-> the groups and the packing: "gptq", "gptq_v2", "awq"), and the plain drafter's
    dir."""
    target, draft = tiny.save_pair(tiny.tiny_pair(hidden=HIDDEN), root / "plain")
    out = {}
    for layout in layouts:
        directory = root / layout
        shutil.copytree(target, directory)
        groups, packing = write(directory, layout)
        state = load_file(str(directory / "model.safetensors"))
        hand = {p + "weight": awq_by_hand(state, p, g) if packing == "awq" else by_hand(state, p, packing, g)
                for p, g in groups.items()}
        reference = tiny.target_model(hidden=HIDDEN)
        reference.load_state_dict({**{n: t for n, t in state.items() if not n.endswith(
            ("qweight", "qzeros", "scales", "g_idx"))}, **hand})
        out[layout] = (directory, reference, groups)
    return out, draft


def assert_refused(layouts, draft, tmp_path, base: str, change, message: str, keep: bool) -> None:
    """A copy of `base`'s checkpoint changed by change(state, config) is refused, kept or not, saying `message`."""
    broken = tmp_path / "target"
    shutil.copytree(layouts[base][0], broken)
    tiny.edit_checkpoint(broken, change)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(broken), str(draft), keep_quantized=keep)
    assert message in str(info.value)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return hand_checkpoints(tmp_path_factory.mktemp("gptq"), LAYOUTS, to_layout)


def label(layout: str, kept: bool) -> str:
    group, sym, fmt, _ = LAYOUTS[layout]
    groups = "per channel" if group == -1 else f"group {group}"
    how = "4-bit weights, float32 activations" if kept else "dequantized to float32"
    rules = f" ({len(DYNAMIC[layout]) - 1} layer rules)" if layout in DYNAMIC else ""  # the one in 16 bits not counted
    return f"int4 w4a16 {groups} {'sym' if sym else 'asym'} {fmt}{rules} ({how})"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_loads_as_dequantized_by_hand_kept_or_not(checkpoints, layout):
    """Dequantized at load: every weight GPTQModel's formula's, bit for bit in float32; kept (a CUDA GPU's
    default): each quantized Linear an Int4Linear whose parts are the checkpoint's translated (qweight^T word for
    word), the same logits bit for bit; the precision says which."""
    layouts, draft = checkpoints
    directory, reference, _ = layouts[layout]
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
        _, group, sym = gptq_rule(layout, name)
        g_idx, width = stored[f"{name}.g_idx"].long(), m.in_features if group == -1 else group
        ordinary = torch.equal(g_idx, torch.arange(m.in_features) // width)
        assert (m.weight_g_idx is None) == ordinary and (m.weight_zero_point is None) == sym and m.group == width
        orders.add(ordinary)
    assert awq or orders == ({True, False} if LAYOUTS[layout][3] else {True})  # activation order: where wider
    assert (plain.target_precision, kept.target_precision) == (label(layout, False), label(layout, True))
    for loaded in (plain, kept):
        tiny.assert_parameters_counted(loaded, reference)
    assert {n for n, m in kept.target.named_modules() if isinstance(m, torch.nn.Linear)} >= {
        "lm_head", "model.layers.0.linear_attn.in_proj_a"} | ({"model.layers.3.self_attn.o_proj"} if layout in DYNAMIC
                                                              else set())  # the modules left out stay plain
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(kept.target(input_ids=ids).logits, reference(input_ids=ids).logits)


@pytest.mark.parametrize("engine, layout", [("transformers", "sym-v1-actorder"), ("runner", "sym-v1-actorder"),
                                            ("runner", "awq-g32")])
def test_run_decodes_a_gptq_or_awq_target_as_its_greedy(checkpoints, capsys, tmp_path, engine, layout):
    """`run --target GPTQ|AWQ` on both engines: identical to greedy, equal to the hand-dequantized model's own
    generation, the precision printed and in the trace."""
    layouts, draft = checkpoints
    directory, reference, _ = layouts[layout]
    out, trace = tiny.run_quantized(directory, draft, engine, tmp_path, capsys)
    assert label(layout, False) in out
    tiny.assert_generated_by(trace, reference)


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
    "an 8-bit dynamic rule": (lambda s, c: c["quantization_config"]["dynamic"].update({"+:lm_head": {"bits": 8}}),
                              "dynamic '+:lm_head': GPTQ weights of 8 bits are not supported", "sym-v1-dynamic"),
    "a packed layer ruled out": (lambda s, c: _config(c, dynamic={"-:.*gate_proj": {}}),
                                 f"{GATE}qweight is packed but the config's per-layer rules (extra_config, dynamic) "
                                 f"leave {GATE.removesuffix('.')} unquantized"),
    "dynamic not an object": (lambda s, c: _config(c, dynamic=["x"]), "dynamic must be a JSON object"),
    "a dynamic rule's group not its scales'": (
        lambda s, c: _config(c, dynamic={"+:model\\.layers\\.0\\.mlp\\.gate": {"group_size": 64}}),
        f"{GATE}weight_scale has shape [384, 2]; weight [384, 192] in groups of 64 needs [384, 3]"),
    # issue #64: a NaN / inf scale loaded silently, every output token '!' and called identical to greedy
    "NaN scale": (lambda s, c: s[GATE + "scales"].__setitem__((1, 7), math.nan),
                  f"target tensor {GATE}scales holds 1 non-finite value (NaN; the first at [1, 7])"),
    "inf scale": (lambda s, c: s[GATE + "scales"].__setitem__((3, 0), -math.inf),
                  f"target tensor {GATE}scales holds 1 non-finite value (inf; the first at [3, 0])", "asym-v2"),
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
    "awq NaN and inf scales": (lambda s, c: s[GATE + "scales"][2, :3].copy_(torch.tensor([math.inf, math.nan, 1.0])),
                               f"target tensor {GATE}scales holds 2 non-finite values (NaN and inf; the first at [2, 0])"),
}
BAD_LAYOUTS.update({case: (*entry, "awq-g32") for case, entry in AWQ_BAD_LAYOUTS.items()})


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept"])
@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_bad_layouts_are_refused(checkpoints, tmp_path, case, keep):
    change, message, *base = BAD_LAYOUTS[case]
    assert_refused(*checkpoints, tmp_path, base[0] if base else "sym-v1", change, message, keep)


def test_the_config_is_gptqmodels(checkpoints):
    """The test checkpoints carry what GPTQModel writes: quant_method gptq, bits, group_size, sym, desc_act and the
    checkpoint format; int32 words, float16 scales."""
    layouts, _ = checkpoints
    directory, _, _ = layouts["sym-v1"]
    qc = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["checkpoint_format"] == "gptq" and qc["bits"] == 4
    state = load_file(str(directory / "model.safetensors"))
    assert state[GATE + "qweight"].dtype == torch.int32 and tuple(state[GATE + "qweight"].shape) == (24, 384)
    assert state[GATE + "scales"].dtype == torch.float16 and tuple(state[GATE + "qzeros"].shape) == (2, 48)
    assert np.all(state[GATE + "qzeros"].numpy().view(np.uint32) == 0x77777777)  # v1: 8 - 1 in every field


# ------------------------------------------------------------------------------------------------------------
# AutoRound (Intel's auto-round): GPTQ's or AWQ's words under its packing_format, per-layer rules in extra_config
# ------------------------------------------------------------------------------------------------------------

AUTOROUND = {  # name: (packing_format, group_size, sym, extra_config)
    # the default packing (GPTQ v1, no g_idx), layers set apart: one by name (groups of 32), one asymmetric, the
    # attention output left in 16 bits by a regex, and the lm_head quantized (AutoRound's quant_lm_head: outside the
    # blocks, so named in extra_config)
    "ar-gptq-sym": ("auto_round:auto_gptq", 128, True,
                    {"model.layers.1.mlp.down_proj": {"group_size": 32}, "model.layers.2.mlp.up_proj": {"sym": False},
                     ".*self_attn\\.o_proj.*": {"bits": 16, "data_type": "float"},
                     "lm_head": {"bits": 4, "group_size": 64, "sym": False, "data_type": "int"}}),
    "ar-gptq-asym": ("auto_round:auto_gptq", 32, False, {}),
    # zero points as they are; a layer's own name wins over a regex before it that also finds it (its other keys
    # the config's)
    "ar-native-asym": ("auto_round", 64, False, {".*mlp\\.down_proj.*": {"group_size": 128, "sym": True},
                                                 "model.layers.0.mlp.down_proj": {"group_size": 32}}),
    "ar-gptqmodel": ("auto_round:gptqmodel", 128, False, {}),  # with a g_idx, zero points as they are
    "ar-awq-sym": ("auto_round:auto_awq", 128, True, {}),
    "ar-awq-asym": ("auto_round:auto_awq", 32, False, {}),
}


# how each packing stores its words, from auto-round's export and inference code (its GPTQ_FORMAT subtracts one from
# each zero point, GPTQ_FORMAT_NO_ZP does not; gptqmodel's writes a g_idx)
AUTOROUND_STORES = {"auto_round:auto_gptq": "gptq", "auto_round": "gptq_v2", "auto_round:gptqmodel": "gptq_v2",
                    "auto_round:auto_awq": "awq"}


def autoround_rule(layout: str, layer: str) -> tuple[int, int, bool]:
    """(bits, group, sym) of a layer, by AutoRound's rule read off its docs: an extra_config key equal to the
    layer's name, else the first key with '.*' in it that re.search finds in the name, over the config's values."""
    import re

    _, group, sym, extra = AUTOROUND[layout]
    entry = extra.get(layer) or next((e for k, e in extra.items() if ".*" in k and re.search(k, layer)), {})
    return entry.get("bits", 4), entry.get("group_size", group), entry.get("sym", sym)


def to_autoround(directory, layout: str) -> tuple[dict[str, int], str]:
    """The checkpoint in AutoRound's export: each 4-bit layer as its packing stores it; returns each packed layer's
    group and how its words are stored (for the dequantization by hand)."""
    packing, group, sym, extra = AUTOROUND[layout]
    groups = {}

    def change(state, config):
        names = [n for n in state if n.endswith(".weight") and state[n].dim() == 2
                 and (n.removesuffix(".weight") in extra or not any(s in n for s in SKIP))]
        for i, name in enumerate(names):
            prefix = name.removesuffix("weight")
            bits, g, symmetric = autoround_rule(layout, prefix.removesuffix("."))
            if bits == 16:
                continue
            groups[prefix] = g
            store(state, prefix, gptq_quantize(state.pop(name), g, symmetric, False, i), AUTOROUND_STORES[packing],
                  g_idx=packing == "auto_round:gptqmodel")
        config["quantization_config"] = {
            "quant_method": "auto-round", "bits": 4, "group_size": group, "sym": sym, "data_type": "int",
            "packing_format": packing, "autoround_version": "0.9.0", "iters": 200,
            "block_name_to_quantize": "model.layers", **({"extra_config": extra} if extra else {})}

    tiny.edit_checkpoint(directory, change)
    return groups, AUTOROUND_STORES[packing]


@pytest.fixture(scope="module")
def autoround(tmp_path_factory):
    return hand_checkpoints(tmp_path_factory.mktemp("autoround"), AUTOROUND, to_autoround)


@pytest.mark.parametrize("layout", sorted(AUTOROUND))
def test_autoround_loads_as_dequantized_by_hand_kept_or_not(autoround, layout):
    """Each packing format read as AutoRound's inference reads it: dequantized, every weight equal to the formula
    by hand bit for bit in float32; kept, each packed layer an Int4Linear of its own group and zero-point scheme
    (extra_config's rules: by name first, then regex; a 16-bit layer plain), the same logits bit for bit."""
    layouts, draft = autoround
    directory, reference, groups = layouts[layout]
    plain = load_pair(str(directory), str(draft))
    tiny.assert_same_weights(plain.target.state_dict(), reference.state_dict())
    kept = load_pair(str(directory), str(draft), keep_quantized=True)
    modules = {n: m for n, m in kept.target.named_modules() if isinstance(m, int4.Int4Linear)}
    assert {f"{n}." for n in modules} == set(groups)
    for name, m in modules.items():
        _, group, sym = autoround_rule(layout, name)
        assert (m.group, m.weight_zero_point is None, m.weight_g_idx) == (group, sym, None), name
    if layout == "ar-gptq-sym":
        assert type(kept.target.get_submodule("model.layers.3.self_attn.o_proj")) is torch.nn.Linear
        assert type(kept.target.lm_head) is int4.Int4Linear
        tiny.assert_kept_drafter_drafts_as_plain(kept, plain)  # through a 4-bit lm_head, kept
        assert plain.target_precision == ("int4 w4a16 group 128 sym auto_round:auto_gptq (3 layer rules) "
                                          "(dequantized to float32)")
    for loaded in (plain, kept):
        tiny.assert_parameters_counted(loaded, reference)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(kept.target(input_ids=ids).logits, reference(input_ids=ids).logits)


@pytest.mark.parametrize("engine, layout", [("transformers", "ar-native-asym"), ("runner", "ar-gptq-sym")])
def test_run_decodes_an_autoround_target_as_its_greedy(autoround, capsys, tmp_path, engine, layout):
    """`run --target AUTOROUND`: identical to greedy and to the hand-dequantized model's own generation; through the
    runner, layers of different groups and zero-point schemes side by side (one fused group of two kinds)."""
    layouts, draft = autoround
    directory, reference, _ = layouts[layout]
    out, trace = tiny.run_quantized(directory, draft, engine, tmp_path, capsys)
    assert AUTOROUND[layout][0] in out and "of the checkpoint's" not in out
    tiny.assert_generated_by(trace, reference)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_runner_over_kept_autoround_layers_of_several_schemes(autoround, fused):
    """The runner over an AutoRound target kept as stored (a CUDA GPU's default; on the CPU the same Int4Linears,
    each dequantized for its call): a gate / up group of two schemes fused as two runs, a layer in groups of 32, a
    4-bit lm_head; its greedy is the hand-dequantized model's, token for token, and DDTree's output too."""
    from ddtree_viz.engine.fused import FusedRuns

    layouts, draft = autoround
    directory, reference, _ = layouts["ar-gptq-sym"]
    pair, runner = tiny.kept_runner(directory, draft, fused)
    assert type(pair.target.lm_head) is int4.Int4Linear and pair.target.model.layers[1].mlp.down_proj.group == 32
    if fused:
        split, whole = runner._fused[2, "mlp"], runner._fused[0, "mlp"]
        assert isinstance(split, FusedRuns) and split.counts == (1, 1)  # gate_proj sym, up_proj asym
        assert isinstance(whole, int4.FusedInt4Linear)
    tiny.assert_runner_decodes_as(pair, runner, reference)


def test_an_autoround_drafter_loads_and_drafts_as_dequantized(autoround, tmp_path):
    """A drafter saved by AutoRound (asymmetric, GPTQ v1 words) loads through `--draft` as its dequantization by hand,
    bit for bit; kept, it drafts the dequantized drafter's trees node for node, and its precision says so."""
    layouts, draft = autoround
    quantized = tmp_path / "draft"
    shutil.copytree(draft, quantized)
    groups, stored = to_autoround(quantized, "ar-gptq-asym")
    state = load_file(str(quantized / "model.safetensors"))
    target = layouts["ar-gptq-asym"][0]
    plain, kept = (load_pair(str(target), str(quantized), keep_quantized=keep) for keep in (False, True))
    weights = plain.drafter.state_dict()
    assert len(groups) == 8 and all(torch.equal(weights[p + "weight"], by_hand(state, p, stored, g))
                                    for p, g in groups.items())
    assert kept.draft_precision == "int4 w4a16 group 32 asym auto_round:auto_gptq (4-bit weights, float32 activations)"
    tiny.assert_kept_drafter_drafts_as_plain(kept, plain)


def _extra(c, layer, **entry):
    c["quantization_config"].setdefault("extra_config", {})[layer] = entry


UP = "model.layers.0.mlp.up_proj"
AUTOROUND_BAD = {  # case: (change, message, base layout)
    "fp8 packing": (lambda s, c: _config(c, packing_format="auto_round:fp8_static"),
                    "AutoRound packing_format 'auto_round:fp8_static' is not supported", "ar-gptq-asym"),
    "mx_fp data": (lambda s, c: _config(c, data_type="mx_fp"), "AutoRound data_type 'mx_fp' is not supported",
                   "ar-gptq-asym"),
    "8-bit activations": (lambda s, c: _config(c, act_bits=8),
                          "activations quantized to 8 bits (act_bits) are not supported", "ar-gptq-asym"),
    "8-bit weights": (lambda s, c: _config(c, bits=8), "AutoRound weights of 8 bits are not supported",
                      "ar-gptq-asym"),
    "an 8-bit layer": (lambda s, c: _extra(c, UP, bits=8),
                       f"extra_config '{UP}': AutoRound weights of 8 bits are not supported", "ar-gptq-asym"),
    "packed, said unquantized": (lambda s, c: _extra(c, UP, bits=16),
                                 f"{UP}.qweight is packed but the config's per-layer rules (extra_config, dynamic) "
                                 f"leave {UP} unquantized",
                                 "ar-gptq-asym"),
    "a layer's group not its scales'": (lambda s, c: _extra(c, UP, group_size=64),
                                        f"{UP}.scales has shape", "ar-gptq-asym"),
    "missing qzeros": (lambda s, c: s.pop(UP + ".qzeros"), f"{UP}.qweight is GPTQ-packed but {UP}.qzeros is missing",
                       "ar-native-asym"),
    "awq sym, other zero points": (lambda s, c: s.update({UP + ".qzeros": torch.zeros_like(s[UP + ".qzeros"])}),
                                   f"{UP}.qzeros: the config says sym but the zero points are not all 8", "ar-awq-sym"),
    "extra_config not an object": (lambda s, c: _config(c, extra_config=[UP]), "extra_config must be a JSON object",
                                   "ar-gptq-asym"),
    "NaN scale": (lambda s, c: s[UP + ".scales"].__setitem__((1, 2), math.nan),
                  f"target tensor {UP}.scales holds 1 non-finite value (NaN; the first at [1, 2])", "ar-gptq-asym"),
    "awq inf scale": (lambda s, c: s[UP + ".scales"].__setitem__((0, 9), math.inf),
                      f"target tensor {UP}.scales holds 1 non-finite value (inf; the first at [0, 9])", "ar-awq-asym"),
}


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "kept"])
@pytest.mark.parametrize("case", sorted(AUTOROUND_BAD))
def test_bad_autoround_layouts_are_refused(autoround, tmp_path, case, keep):
    change, message, base = AUTOROUND_BAD[case]
    assert_refused(*autoround, tmp_path, base, change, message, keep)


def test_a_gptq_weight_needs_its_g_idx(checkpoints, tmp_path):
    """GPTQModel and AutoGPTQ always write g_idx: without it a GPTQ checkpoint is refused (AutoRound's is not)."""
    assert_refused(*checkpoints, tmp_path, "asym-v2", lambda s, c: s.pop(GATE + "g_idx"),
                   f"{GATE}qweight is GPTQ-packed but {GATE}g_idx is missing", keep=False)


@pytest.mark.parametrize("packing, stored", [("auto_round:auto_gptq", "gptq"), ("auto_round", "gptq_v2"),
                                             ("auto_round:gptqmodel", "gptq_v2"), ("auto_round:auto_awq", "awq"),
                                             ("auto", "gptq"), ("auto_round:gptq", "gptq"), ("auto_round:awq", "awq"),
                                             (None, "gptq")])
def test_autoround_packing_names(packing, stored):
    """Each of AutoRound's packing names, the older ones its loader normalises and none at all (its default), read as
    the layout auto-round's inference reads it as."""
    qc = {"quant_method": "intel/auto-round", "bits": 4, "group_size": 128, "sym": True,
          **({"packing_format": packing} if packing else {})}
    assert autoround_packing(registry.spec_of({"quantization_config": qc}, "target")) == stored

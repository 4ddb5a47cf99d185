"""4-bit checkpoints in GPTQ's and AWQ's layouts, read by us as the pack-quantized layout of engine/int4.py.

Most community 4-bit Qwen3.6-27B checkpoints are GPTQ's (GPTQModel: symmetric, groups of 128 or 32, often in
activation order); some are AWQ's (AutoAWQ's GEMM layout). Both store, in place of each quantized Linear's
`weight`, 4-bit unsigned values u in [0, 15], zero points and scales, and the real weight is
W[o, i] = scales[g, o] x (u[i, o] - zero[g, o]) with g the input's group.

GPTQ (`quant_method` "gptq", bits 4, group_size (-1: one group a row), sym, desc_act, checkpoint_format "gptq" |
"gptq_v2", or `format`; absent means "gptq"):

    qweight  int32 [in / 8, out]: eight fields a word along the inputs, input 8r + j of column o in bits 4j ..
             4j+3 of qweight[r, o]
    qzeros   int32 [groups, out / 8]: packed as u is but along the outputs; "gptq" (v1) stores each zero point
             minus 1, "gptq_v2" as it is
    scales   float16 [groups, out]
    g_idx    int32 [in]: the group of each input (column // group_size unless in activation order)

(GPTQModel's dequantize_weight.) That is int4.py's layout transposed, with its signed values offset by 8: q = u - 8
and z = zero - 8 give (q - z) = (u - zero), and int4's field holds q + 8 = u, so `weight_packed` is qweight^T word
for word, `weight_zero_point` qzeros^T (v1: each field plus one), `weight_scale` scales^T.

AWQ (`quant_method` "awq", bits 4, group_size, zero_point true, version "gemm"):

    qweight  int32 [in, out / 8]: eight fields a word along the outputs, in AutoAWQ's interleaved order (field f,
             bits 4f .. 4f+3, of qweight[i, c] holds output 8c + AWQ_ORDER[f] of input i)
    qzeros   int32 [groups, out / 8]: the zero points as they are, packed as qweight is
    scales   float16 [groups, out]

(AutoAWQ's unpack_awq + reverse_awq_order.) Its fields are unpacked, put in output order and packed again along
the inputs.

AutoRound (Intel's auto-round; `quant_method` "auto-round", older "intel/auto-round"; bits 4, group_size, sym,
data_type "int", packing_format) stores one of the two layouts above, as its inference code reads them
(auto_round/inference/backend.py): "auto_round:auto_gptq" (the default, and what a symmetric export writes) is GPTQ
v1 (each zero point minus one), "auto_round" and "auto_round:gptqmodel" are GPTQ with the zero points as they are
(gptqmodel's with a g_idx, the others without: the groups are then column // group_size), "auto_round:auto_awq"
AWQ's GEMM layout. Its `extra_config` sets layers apart ({layer name or regex: {bits, group_size, sym, ...}}; a
layer of 16 bits is stored plain): each weight is read with its own group and zero-point scheme (int4.Int4Spec.at,
AutoRound's rule: the exact name first, else the first regex found in the name). Refused: another packing format
(FP8, MXFP / NVFP4, llm-compressor's, which is compressed-tensors), data type, bit width (in the config or any
extra_config entry) or quantized activations (act_bits below 16).

Each checkpoint is translated here, one weight at a time as it is read, into int4's parts (`translate`), and from
there loads exactly as a pack-quantized one: dequantized at load, or kept packed on one CUDA GPU (int4.Int4Linear,
the 4-bit GEMM). Symmetric GPTQ checkpoints (sym: every zero point 8) carry no zero point after
translation; a g_idx that is the plain column // group_size is dropped (the groups are then whole, so the weight
fuses and the one-row kernel fits). Refused, naming the tensor: a part missing or mis-shaped, scales holding NaN or
inf (int4.refuse_nonfinite; the zero points are packed integers, never NaN), a symmetric config whose zero points are
not all 8, a GPTQ v1 zero point of 15 (16 does not fit 4 bits), another bit width, checkpoint format or AWQ version.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import torch

from ..errors import ModelLoadError
from . import int4

PARTS = ("qweight", "qzeros", "scales", "g_idx")
AWQ_PARTS = PARTS[:3]
FORMATS = ("gptq", "gptq_v2")
AUTOROUND_METHODS = ("auto-round", "intel/auto-round")
# AutoRound's packing formats as the layouts they store (its inference/backend.py: GPTQ_FORMAT "zp+-1",
# GPTQ_FORMAT_NO_ZP, AWQ_FORMAT; and the older names its convert_model.py normalises: "auto", "auto_round:gptq",
# "auto_round:awq")
AUTOROUND_PACKINGS = {"auto_round:auto_gptq": "gptq", "auto_round": "gptq_v2", "auto_round:gptqmodel": "gptq_v2",
                      "auto_round:auto_awq": "awq", "auto": "gptq", "auto_round:gptq": "gptq", "auto_round:awq": "awq"}
# auto-round's heuristic: an extra_config key holding one of these is a regex, any other a layer's name
REGEX_TOKENS = (".*", "^", "$", "|", "(", ")", "[", "]", "?", "+")
SYMMETRIC_ZERO = 8  # the zero point of a symmetric 4-bit GPTQ weight (v2; stored as 7 in v1)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's packing: field f of word c holds output 8c + AWQ_ORDER[f]
AWQ_FIELD_OF = [AWQ_ORDER.index(k) for k in range(8)]  # output 8c + k is field AWQ_FIELD_OF[k]


def gptq_spec(qc: Mapping, where: str) -> int4.Int4Spec:
    """The Int4Spec of a GPTQ quantization_config (layout "gptq" or "gptq_v2"; overrides: its `dynamic` rules); a
    ModelLoadError for anything but 4-bit weights in one of those two checkpoint formats."""
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in FORMATS:
        raise ModelLoadError(f"{where}: GPTQ checkpoint format {fmt!r} is not supported ({', '.join(FORMATS)})")
    group, symmetric = _gptq_scheme(qc, {}, where)

    def rule(key: str, entry: Mapping, here: str) -> tuple:
        """GPTQModel's dynamic (as vLLM reads it): '-:regex' leaves the layers it matches unquantized, '+:regex'
        (or a bare regex) sets their bits / group_size / sym; the first that re.match-es a layer's name rules it."""
        if key.startswith("-:"):
            return ("match", key.removeprefix("-:"), None, True)
        return ("match", key.removeprefix("+:"), *_gptq_scheme(qc, entry, here))

    return int4.Int4Spec(group, symmetric, (), fmt, _rules(qc.get("dynamic"), "dynamic", where, rule))


def _gptq_scheme(qc: Mapping, entry: Mapping, where: str, maker: str = "GPTQ") -> tuple[int, bool]:
    """(group, symmetric) of a GPTQ (or AutoRound) config with one per-layer entry over it; refused unless 4-bit
    weights."""
    value = {**qc, **entry}
    if value.get("bits") != int4.BITS:
        raise ModelLoadError(f"{where}: {maker} weights of {value.get('bits')!r} bits are not supported (only 4)")
    symmetric = value.get("sym", True)
    if not isinstance(symmetric, bool):
        raise ModelLoadError(f"{where}: sym must be true or false, not {symmetric!r}")
    return _group_size(value, where), symmetric


def _rules(table, name: str, where: str, rule: Callable[[str, Mapping, str], tuple]) -> tuple[tuple, ...]:
    """A config's per-layer table (AutoRound's extra_config, GPTQ's dynamic: {key: {bits, group_size, sym, ...}})
    as Int4Spec.overrides, in order, each entry made by rule(key, entry, where it is for messages)."""
    table = {} if table is None else table
    if not isinstance(table, Mapping):
        raise ModelLoadError(f"{where}: {name} must be a JSON object, not {table!r}")
    out = []
    for key, entry in table.items():
        if not isinstance(entry, Mapping):
            raise ModelLoadError(f"{where} {name} {key!r} must be a JSON object, not {entry!r}")
        out.append(rule(str(key), entry, f"{where} {name} {key!r}"))
    return tuple(out)


def autoround_spec(qc: Mapping, where: str) -> int4.Int4Spec:
    """The Int4Spec of an AutoRound quantization_config (layout: its packing format, read as AUTOROUND_PACKINGS
    says; overrides: its extra_config); a ModelLoadError for another packing format, or for anything but 4-bit
    integer weights with 16-bit activations, in the config or in any extra_config entry."""
    packing = qc.get("packing_format", "auto_round:auto_gptq")
    if packing not in AUTOROUND_PACKINGS:
        raise ModelLoadError(f"{where}: AutoRound packing_format {packing!r} is not supported "
                             f"({', '.join(AUTOROUND_PACKINGS)})")
    group, symmetric = _autoround_scheme(qc, {}, where)

    def rule(key: str, entry: Mapping, here: str) -> tuple:
        """auto-round's reading: a key with one of REGEX_TOKENS is a regex (re.search), any other a layer's name;
        16 bits or more leaves the layer unquantized."""
        how = "search" if any(t in key for t in REGEX_TOKENS) else "name"
        bits = entry.get("bits", qc.get("bits"))
        if int4._whole(bits) and bits >= 16:
            return (how, key, None, True)
        return (how, key, *_autoround_scheme(qc, entry, here))

    return int4.Int4Spec(group, symmetric, (), packing, _rules(qc.get("extra_config"), "extra_config", where, rule))


def _autoround_scheme(qc: Mapping, entry: Mapping, where: str) -> tuple[int, bool]:
    """(group, symmetric) of AutoRound's config with one extra_config entry over it; refused unless 4-bit integer
    weights with 16-bit (or no) activation quantization."""
    value = {**qc, **entry}
    if value.get("data_type", "int") != "int":
        raise ModelLoadError(f"{where}: AutoRound data_type {value.get('data_type')!r} is not supported (only 'int')")
    act_bits = value.get("act_bits")
    if act_bits is not None and not (int4._whole(act_bits) and act_bits >= 16):
        raise ModelLoadError(f"{where}: activations quantized to {act_bits!r} bits (act_bits) are not supported; "
                             "only weight-only checkpoints (W4A16) load")
    return _gptq_scheme(qc, entry, where, "AutoRound")


def _group_size(qc: Mapping, where: str) -> int:
    """A GPTQ / AWQ config's group_size as int4's group (0: one group a row, their -1)."""
    group = qc.get("group_size", 128)
    if not (isinstance(group, int) and not isinstance(group, bool) and (group >= 1 or group == -1)):
        raise ModelLoadError(f"{where}: group_size must be a whole number >= 1 or -1, not {group!r}")
    return max(group, 0)


def packing(spec: int4.Int4Spec) -> str:
    """The layout a GPTQ, AWQ or AutoRound spec's weights are stored in: "gptq" (v1), "gptq_v2" or "awq"."""
    return AUTOROUND_PACKINGS.get(spec.layout, spec.layout)


def _shape_of(prefix: str, gptq: Mapping[str, torch.Tensor], what: str) -> tuple[int, int]:
    """(out, in) of a GPTQ weight, its parts checked against each other (their dtypes and shapes); `in` is g_idx's
    length, or without one (AutoRound's) qweight's rows x 8."""
    def fail(part: str, why: str):
        raise ModelLoadError(f"{what} tensor {prefix}{part} {why}")

    for part in PARTS:
        if part not in gptq and part != "g_idx":
            raise ModelLoadError(f"{what} weight {prefix}qweight is GPTQ-packed but {prefix}{part} is missing")
    for part in ("qweight", "qzeros", "g_idx"):
        if part in gptq and gptq[part].dtype not in (torch.int32, torch.int64):
            fail(part, f"is {str(gptq[part].dtype).removeprefix('torch.')}, not an integer type")
    qweight, g_idx = gptq["qweight"], gptq.get("g_idx")
    if g_idx is not None and g_idx.dim() != 1:
        fail("g_idx", f"has shape {list(g_idx.shape)}, not [in]")
    if qweight.dim() != 2:
        fail("qweight", f"has shape {list(qweight.shape)}, not [in / 8, out]")
    inn = g_idx.numel() if g_idx is not None else qweight.shape[0] * int4.PER_WORD
    if qweight.shape[0] != math.ceil(inn / int4.PER_WORD):
        fail("qweight", f"has shape {list(qweight.shape)}; {inn} inputs (g_idx) need {math.ceil(inn / 8)} rows")
    out = qweight.shape[1]
    if gptq["scales"].dim() != 2 or gptq["scales"].shape[1] != out:
        fail("scales", f"has shape {list(gptq['scales'].shape)}, not [groups, {out}]")
    groups = gptq["scales"].shape[0]
    if tuple(gptq["qzeros"].shape) != (groups, math.ceil(out / int4.PER_WORD)):
        fail("qzeros", f"has shape {list(gptq['qzeros'].shape)}; {groups} groups of {out} outputs need "
                       f"[{groups}, {math.ceil(out / 8)}]")
    return out, inn


def _zeros(prefix: str, qzeros: torch.Tensor, out: int, spec: int4.Int4Spec, what: str) -> torch.Tensor:
    """int4's signed zero points [out, groups] (zero - 8) of a GPTQ weight; v1 stores each minus one."""
    z = int4.unpack(qzeros.to(torch.int32).T.contiguous(), out, 0)
    if packing(spec) == "gptq":
        if (z == int4.OFFSET - 1).any():
            raise ModelLoadError(f"{what} tensor {prefix}qzeros holds a GPTQ v1 zero point of 15, which is 16: "
                                 "outside 4 bits")
        z = z + 1
    if spec.symmetric and (z != SYMMETRIC_ZERO - int4.OFFSET).any():
        raise ModelLoadError(f"{what} tensor {prefix}qzeros: the config says sym but the zero points are not all "
                             f"{SYMMETRIC_ZERO}")
    return z


def convert(prefix: str, gptq: Mapping[str, torch.Tensor], spec: int4.Int4Spec, what: str) -> dict[str, torch.Tensor]:
    """One GPTQ weight's parts (PARTS, by name) as int4's (by name, without the prefix)."""
    if spec.layout in FORMATS and "g_idx" not in gptq:  # GPTQModel and AutoGPTQ always write it
        raise ModelLoadError(f"{what} weight {prefix}qweight is GPTQ-packed but {prefix}g_idx is missing")
    out, inn = _shape_of(prefix, gptq, what)
    groups = gptq["scales"].shape[0]
    if "g_idx" not in gptq and groups != math.ceil(inn / (spec.group or inn)):
        raise ModelLoadError(f"{what} tensor {prefix}scales has shape {list(gptq['scales'].shape)}; {inn} inputs in "
                             f"groups of {spec.group or inn} (the config's for this layer) need "
                             f"[{math.ceil(inn / (spec.group or inn))}, {out}]")
    g_idx = gptq["g_idx"].long() if "g_idx" in gptq else torch.arange(inn) // (spec.group or inn)
    if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise ModelLoadError(f"{what} tensor {prefix}g_idx names groups outside 0 .. {groups - 1}")
    int4.refuse_nonfinite(gptq["scales"], prefix + "scales", what)
    z = _zeros(prefix, gptq["qzeros"], out, spec, what)
    parts = {"weight_packed": gptq["qweight"].to(torch.int32).T.contiguous(),
             "weight_scale": gptq["scales"].T.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64)}
    if not spec.symmetric:
        parts["weight_zero_point"] = int4.pack(z, 0)
    if not _plain(g_idx, spec.group):
        parts["weight_g_idx"] = g_idx.to(torch.int32)
    return parts


def awq_spec(qc: Mapping, where: str) -> int4.Int4Spec:
    """The Int4Spec of an AWQ quantization_config (layout "awq"); a ModelLoadError for anything but 4-bit weights
    with zero points in the GEMM layout."""
    if qc.get("bits", 4) != int4.BITS:
        raise ModelLoadError(f"{where}: AWQ weights of {qc.get('bits')!r} bits are not supported (only 4)")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelLoadError(f"{where}: AWQ version {version!r} is not supported (only 'gemm')")
    if qc.get("zero_point", True) is not True:
        raise ModelLoadError(f"{where}: AWQ without zero points is not supported")
    skip = tuple(str(m) for m in qc.get("modules_to_not_convert") or ())
    return int4.Int4Spec(_group_size(qc, where), False, skip, "awq")


def _awq_fields(words: torch.Tensor, count: int) -> torch.Tensor:
    """AWQ words [rows, count / 8] -> their unsigned fields [rows, count] (uint8), in output order: each word's four
    bytes (little-endian) hold fields 2b and 2b + 1, and field f holds output AWQ_ORDER[f] of the word's eight."""
    rows = words.shape[0]
    b = words.to(torch.int32).contiguous().view(-1).view(torch.uint8).reshape(rows, -1, 4)  # [rows, words, bytes]
    fields = torch.stack((b & 0xF, b >> int4.BITS), -1).reshape(rows, -1, int4.PER_WORD)  # field f at f
    return torch.stack([fields[:, :, f] for f in AWQ_FIELD_OF], -1).reshape(rows, -1)[:, :count]


def convert_awq(prefix: str, awq: Mapping[str, torch.Tensor], spec: int4.Int4Spec,
                what: str) -> dict[str, torch.Tensor]:
    """One AWQ weight's parts (AWQ_PARTS, by name) as int4's (by name, without the prefix): the fields unpacked,
    put in output order and packed again along the inputs."""
    def fail(part: str, why: str):
        raise ModelLoadError(f"{what} tensor {prefix}{part} {why}")

    for part in AWQ_PARTS:
        if part not in awq:
            raise ModelLoadError(f"{what} weight {prefix}qweight is AWQ-packed but {prefix}{part} is missing")
    for part in ("qweight", "qzeros"):
        if awq[part].is_floating_point() or awq[part].dim() != 2:
            fail(part, f"must be 2-D integers, not {str(awq[part].dtype).removeprefix('torch.')} "
                       f"{list(awq[part].shape)}")
    qweight, scales = awq["qweight"], awq["scales"]
    inn = qweight.shape[0]
    groups = math.ceil(inn / (spec.group or inn))
    if scales.dim() != 2 or scales.shape[0] != groups:
        fail("scales", f"has shape {list(scales.shape)}; {inn} inputs need [{groups}, out]")
    out = scales.shape[1]
    for part, rows in (("qweight", inn), ("qzeros", groups)):
        if tuple(awq[part].shape) != (rows, math.ceil(out / int4.PER_WORD)):
            fail(part, f"has shape {list(awq[part].shape)}; {out} outputs need [{rows}, {math.ceil(out / 8)}]")
    int4.refuse_nonfinite(scales, prefix + "scales", what)
    u, zero = _awq_fields(qweight, out), _awq_fields(awq["qzeros"], out).int()
    parts = {"weight_packed": int4.pack_fields(u.T), "weight_scale": scales.T.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64)}
    if spec.symmetric:  # AutoRound's symmetric AWQ export: every zero point 8, carried by no part
        if (zero != SYMMETRIC_ZERO).any():
            raise ModelLoadError(f"{what} tensor {prefix}qzeros: the config says sym but the zero points are not "
                                 f"all {SYMMETRIC_ZERO}")
    else:
        parts["weight_zero_point"] = int4.pack((zero - int4.OFFSET).T, 0)
    return parts


def _plain(g_idx: torch.Tensor, group: int) -> bool:
    """Whether a g_idx is the plain column // group (no activation order)."""
    g_idx = g_idx.long()
    return torch.equal(g_idx, torch.arange(g_idx.numel(), device=g_idx.device) // (group or max(1, g_idx.numel())))


def _part_of(name: str, parts: tuple[str, ...]) -> str | None:
    return next((p for p in parts if name == p or name.endswith("." + p)), None)


def translate(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: int4.Int4Spec,
              what: str) -> tuple[list[str], Callable[[str], torch.Tensor]]:
    """A GPTQ, AWQ or AutoRound checkpoint's tensor names and reader (`packing` says which) as int4's
    pack-quantized ones (int4.dequantize_state's `names` and `get`): each weight's parts translated by `convert` /
    `convert_awq` under its own spec (`spec.at`) when its first part is read (one weight held at a time), every other
    tensor as it is. Refused, naming the tensor: a part without its qweight, a packed weight the config's
    extra_config leaves unquantized."""
    awq = packing(spec) == "awq"
    parts_of, translated = (AWQ_PARTS, convert_awq) if awq else (PARTS, convert)
    names = list(names)
    present = set(names)
    packed = {n.removesuffix("qweight") for n in names if _part_of(n, parts_of) == "qweight"}
    specs = {prefix: spec.at(prefix) for prefix in packed}  # each weight's own (AutoRound's extra_config)
    out: list[str] = []
    for name in names:
        part = _part_of(name, parts_of)
        prefix = name.removesuffix(part) if part else ""
        if part is None:
            out.append(name)
        elif prefix not in packed:
            raise ModelLoadError(f"{what} tensor {name} has no packed weight {prefix}qweight")
        elif specs[prefix] is None:
            raise ModelLoadError(f"{what} weight {prefix}qweight is packed but the config's per-layer rules "
                                 f"(extra_config, dynamic) leave {prefix.removesuffix('.')} unquantized")
        elif part == "qweight":
            mine = specs[prefix]
            plain = awq or prefix + "g_idx" not in present or _plain(get(prefix + "g_idx"), mine.group)
            out += [prefix + p for p in ("weight_packed", "weight_scale", "weight_shape")
                    + (() if mine.symmetric else ("weight_zero_point",)) + (() if plain else ("weight_g_idx",))]
    done: dict[str, dict[str, torch.Tensor]] = {}

    def read(name: str) -> torch.Tensor:
        part = next((p for p in int4.PARTS if name.endswith(p) and name.removesuffix(p) in packed), None)
        if part is None:
            return get(name)
        prefix = name.removesuffix(part)
        if prefix not in done:
            done.clear()  # one weight's translation held at a time
            done[prefix] = translated(prefix, {p: get(prefix + p) for p in parts_of if prefix + p in present},
                                      specs[prefix], what)
        return done[prefix][part]

    return out, read

"""4-bit GPTQ checkpoints (GPTQModel / AutoGPTQ layout), read by us as the pack-quantized layout of engine/int4.py.

Most community 4-bit Qwen3.6-27B checkpoints are GPTQ's (GPTQModel: symmetric, groups of 128 or 32, often in
activation order). config.json's `quantization_config` is {quant_method "gptq", bits 4, group_size (-1: one group a
row), sym, desc_act, checkpoint_format "gptq" | "gptq_v2" (or `format`; absent means "gptq")}; each quantized
Linear stores, in place of `weight`:

    qweight  int32 [in / 8, out]: eight 4-bit fields a word along the input dimension, input 8r + j of column o in
             bits 4j .. 4j+3 of qweight[r, o], each the unsigned value u in [0, 15]
    qzeros   int32 [groups, out / 8]: the zero points, packed as u is but along the outputs; "gptq" (v1) stores
             each zero point minus 1, "gptq_v2" as it is
    scales   float16 [groups, out]
    g_idx    int32 [in]: the group of each input (column // group_size unless in activation order)

and the real weight is W[o, i] = scales[g, o] x (u[i, o] - zero[g, o]) with g = g_idx[i] (GPTQModel's
dequantize_weight). That is int4.py's layout transposed, with its signed values offset by 8: q = u - 8 and
z = zero - 8 give (q - z) = (u - zero), and int4's field holds q + 8 = u, so `weight_packed` is qweight^T word for
word, `weight_zero_point` qzeros^T (v1: each field plus one), `weight_scale` scales^T. So a GPTQ checkpoint is
translated here, one weight at a time as it is read, into int4's parts (`translate`), and from there loads exactly as
a pack-quantized one: dequantized at load, or kept packed on one CUDA GPU (int4.Int4Linear, the 4-bit GEMM).

Symmetric checkpoints (sym: every zero point 8) carry no zero point after translation; a g_idx that is the plain
column // group_size is dropped (the groups are then whole, so the weight fuses and the one-row kernel fits).
Refused, naming the tensor: a part missing or mis-shaped, a symmetric config whose zero points are not all 8, a v1
zero point of 15 (16 does not fit 4 bits), another bit width or checkpoint format.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping

import torch

from ..errors import ModelLoadError
from . import int4

PARTS = ("qweight", "qzeros", "scales", "g_idx")
FORMATS = ("gptq", "gptq_v2")
SYMMETRIC_ZERO = 8  # the zero point of a symmetric 4-bit GPTQ weight (v2; stored as 7 in v1)


def spec_of(qc: Mapping, where: str) -> int4.Int4Spec:
    """The Int4Spec of a GPTQ quantization_config (layout "gptq" or "gptq_v2"); a ModelLoadError for anything but
    4-bit weights in one of those two checkpoint formats."""
    if qc.get("bits") != int4.BITS:
        raise ModelLoadError(f"{where}: GPTQ weights of {qc.get('bits')!r} bits are not supported (only 4)")
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in FORMATS:
        raise ModelLoadError(f"{where}: GPTQ checkpoint format {fmt!r} is not supported ({', '.join(FORMATS)})")
    group = qc.get("group_size", 128)
    if not (isinstance(group, int) and not isinstance(group, bool) and (group >= 1 or group == -1)):
        raise ModelLoadError(f"{where}: group_size must be a whole number >= 1 or -1, not {group!r}")
    symmetric = qc.get("sym", True)
    if not isinstance(symmetric, bool):
        raise ModelLoadError(f"{where}: sym must be true or false, not {symmetric!r}")
    return int4.Int4Spec(max(group, 0), symmetric, (), fmt)


def _shape_of(prefix: str, gptq: Mapping[str, torch.Tensor], what: str) -> tuple[int, int]:
    """(out, in) of a GPTQ weight, its parts checked against each other (their dtypes and shapes)."""
    def fail(part: str, why: str):
        raise ModelLoadError(f"{what} tensor {prefix}{part} {why}")

    for part in PARTS:
        if part not in gptq:
            raise ModelLoadError(f"{what} weight {prefix}qweight is GPTQ-packed but {prefix}{part} is missing")
    for part in ("qweight", "qzeros", "g_idx"):
        if gptq[part].dtype not in (torch.int32, torch.int64) or gptq[part].is_floating_point():
            fail(part, f"is {str(gptq[part].dtype).removeprefix('torch.')}, not an integer type")
    qweight, g_idx = gptq["qweight"], gptq["g_idx"]
    if g_idx.dim() != 1:
        fail("g_idx", f"has shape {list(g_idx.shape)}, not [in]")
    inn = g_idx.numel()
    if qweight.dim() != 2 or qweight.shape[0] != math.ceil(inn / int4.PER_WORD):
        fail("qweight", f"has shape {list(qweight.shape)}; {inn} inputs (g_idx) need {math.ceil(inn / 8)} rows")
    out = qweight.shape[1]
    groups = gptq["scales"].shape[0] if gptq["scales"].dim() == 2 else -1
    if gptq["scales"].dim() != 2 or gptq["scales"].shape[1] != out:
        fail("scales", f"has shape {list(gptq['scales'].shape)}, not [groups, {out}]")
    if tuple(gptq["qzeros"].shape) != (groups, math.ceil(out / int4.PER_WORD)):
        fail("qzeros", f"has shape {list(gptq['qzeros'].shape)}; {groups} groups of {out} outputs need "
                       f"[{groups}, {math.ceil(out / 8)}]")
    return out, inn


def _zeros(prefix: str, qzeros: torch.Tensor, out: int, spec: int4.Int4Spec, what: str) -> torch.Tensor:
    """int4's signed zero points [out, groups] (zero - 8) of a GPTQ weight; v1 stores each minus one."""
    z = int4.unpack(qzeros.to(torch.int32).T.contiguous(), out, 0)
    if spec.layout == "gptq":
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
    out, inn = _shape_of(prefix, gptq, what)
    groups = gptq["scales"].shape[0]
    g_idx = gptq["g_idx"].long()
    if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
        raise ModelLoadError(f"{what} tensor {prefix}g_idx names groups outside 0 .. {groups - 1}")
    z = _zeros(prefix, gptq["qzeros"], out, spec, what)
    parts = {"weight_packed": gptq["qweight"].to(torch.int32).T.contiguous(),
             "weight_scale": gptq["scales"].T.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64)}
    if not spec.symmetric:
        parts["weight_zero_point"] = int4.pack(z, 0)
    if not _plain(g_idx, spec.group):
        parts["weight_g_idx"] = g_idx.to(torch.int32)
    return parts


def _plain(g_idx: torch.Tensor, group: int) -> bool:
    """Whether a g_idx is the plain column // group (no activation order)."""
    g_idx = g_idx.long()
    return torch.equal(g_idx, torch.arange(g_idx.numel(), device=g_idx.device) // (group or max(1, g_idx.numel())))


def _part_of(name: str) -> str | None:
    return next((p for p in PARTS if name == p or name.endswith("." + p)), None)


def translate(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: int4.Int4Spec,
              what: str) -> tuple[list[str], Callable[[str], torch.Tensor]]:
    """A GPTQ checkpoint's tensor names and reader as int4's pack-quantized ones (int4.dequantize_state's `names`
    and `get`): each weight's parts translated by `convert` when its first part is read (one weight held at a
    time), every other tensor as it is. Refused, naming the tensor: a GPTQ part without its qweight."""
    names = list(names)
    present = set(names)
    packed = {n.removesuffix("qweight") for n in names if _part_of(n) == "qweight"}
    out: list[str] = []
    for name in names:
        part = _part_of(name)
        prefix = name.removesuffix(part) if part else ""
        if part is None:
            out.append(name)
        elif prefix not in packed:
            raise ModelLoadError(f"{what} tensor {name} has no packed weight {prefix}qweight")
        elif part == "qweight":
            plain = prefix + "g_idx" not in present or _plain(get(prefix + "g_idx"), spec.group)
            out += [prefix + p for p in ("weight_packed", "weight_scale", "weight_shape")
                    + (() if spec.symmetric else ("weight_zero_point",)) + (() if plain else ("weight_g_idx",))]
    done: dict[str, dict[str, torch.Tensor]] = {}

    def read(name: str) -> torch.Tensor:
        part = next((p for p in int4.PARTS if name.endswith(p) and name.removesuffix(p) in packed), None)
        if part is None:
            return get(name)
        prefix = name.removesuffix(part)
        if prefix not in done:
            done.clear()  # one weight's translation held at a time
            done[prefix] = convert(prefix, {p: get(prefix + p) for p in PARTS if prefix + p in present}, spec, what)
        return done[prefix][part]

    return out, read

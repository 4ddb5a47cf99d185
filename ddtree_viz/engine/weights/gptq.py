"""4-bit checkpoints in GPTQ's layout (GPTQModel / AutoGPTQ), read by us as int4_common's pack-quantized parts.

Most community 4-bit Qwen3.6-27B checkpoints are GPTQ's (GPTQModel: symmetric, groups of 128 or 32, often in
activation order). In place of each quantized Linear's `weight` it stores 4-bit unsigned values u in [0, 15], zero
points and scales, and the real weight is W[o, i] = scales[g, o] x (u[i, o] - zero[g, o]) with g the input's group.

`quant_method` "gptq", bits 4, group_size (-1: one group a row), sym, desc_act, checkpoint_format "gptq" |
"gptq_v2" (or `format`; absent means "gptq"), `dynamic` per-layer rules:

    qweight  int32 [in / 8, out]: eight fields a word along the inputs, input 8r + j of column o in bits 4j ..
             4j+3 of qweight[r, o]
    qzeros   int32 [groups, out / 8]: packed as u is but along the outputs; "gptq" (v1) stores each zero point
             minus 1, "gptq_v2" as it is
    scales   float16 [groups, out]
    g_idx    int32 [in]: the group of each input (column // group_size unless in activation order)

(GPTQModel's dequantize_weight.) That is int4_common's layout transposed, with its signed values offset by 8: q = u
- 8 and z = zero - 8 give (q - z) = (u - zero), and int4's field holds q + 8 = u, so `weight_packed` is qweight^T
word for word, `weight_zero_point` qzeros^T (v1: each field plus one), `weight_scale` scales^T.

Each checkpoint is translated, one weight at a time as it is read, into int4_common's parts (`convert`, through
int4_common.translate), and from there loads exactly as a pack-quantized one: dequantized at load, or kept packed on
one CUDA GPU (int4_common.Int4Linear, the 4-bit GEMM). Symmetric checkpoints (sym: every zero point 8) carry no zero
point after translation; a g_idx that is the plain column // group_size is dropped (the groups are then whole, so
the weight fuses and the one-row kernel fits). Refused, naming the tensor: a part missing or mis-shaped, scales
holding NaN or inf (base.refuse_nonfinite; the zero points are packed integers, never NaN), a symmetric config whose
zero points are not all 8, a v1 zero point of 15 (16 does not fit 4 bits), another bit width or checkpoint format.
AutoRound's GPTQ packings are read by this same `convert` (autoround.py).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Container, Iterable, Mapping

import torch

from ...errors import ModelLoadError
from ...words import plural
from . import int4_common
from .base import refuse_nonfinite
from .int4_common import BITS, OFFSET, PER_WORD, SYMMETRIC_ZERO, Int4Spec, group_size, plain_groups, rules

PARTS = ("qweight", "qzeros", "scales", "g_idx")
FORMATS = ("gptq", "gptq_v2")


def gptq_spec(qc: Mapping, where: str) -> Int4Spec:
    """The Int4Spec of a GPTQ quantization_config (layout "gptq" or "gptq_v2"; overrides: its `dynamic` rules); a
    ModelLoadError for anything but 4-bit weights in one of those two checkpoint formats."""
    fmt = qc.get("checkpoint_format") or qc.get("format") or "gptq"
    if fmt not in FORMATS:
        raise ModelLoadError(f"{where}: GPTQ checkpoint format {fmt!r} is not supported ({', '.join(FORMATS)})")
    group, symmetric = scheme(qc, {}, where)

    def rule(key: str, entry: Mapping, here: str) -> tuple:
        """GPTQModel's dynamic (as vLLM reads it): '-:regex' leaves the layers it matches unquantized, '+:regex'
        (or a bare regex) sets their bits / group_size / sym; the first that re.match-es a layer's name rules it."""
        if key.startswith("-:"):
            return ("match", key.removeprefix("-:"), None, True)
        return ("match", key.removeprefix("+:"), *scheme(qc, entry, here))

    return Int4Spec(group, symmetric, (), fmt, rules(qc.get("dynamic"), "dynamic", where, rule), "gptq")


def scheme(qc: Mapping, entry: Mapping, where: str, maker: str = "GPTQ") -> tuple[int, bool]:
    """(group, symmetric) of a GPTQ (or AutoRound) config with one per-layer entry over it; refused unless 4-bit
    weights."""
    value = {**qc, **entry}
    if value.get("bits") != BITS:
        raise ModelLoadError(f"{where}: {maker} weights of {value.get('bits')!r} bits are not supported (only 4)")
    symmetric = value.get("sym", True)
    if not isinstance(symmetric, bool):
        raise ModelLoadError(f"{where}: sym must be true or false, not {symmetric!r}")
    return group_size(value, where), symmetric


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
    inn = g_idx.numel() if g_idx is not None else qweight.shape[0] * PER_WORD
    if qweight.shape[0] != math.ceil(inn / PER_WORD):
        fail("qweight", f"has shape {list(qweight.shape)}; {plural(inn, 'input')} (g_idx) need "
                        f"{plural(math.ceil(inn / 8), 'row')}")
    out = qweight.shape[1]
    if gptq["scales"].dim() != 2 or gptq["scales"].shape[1] != out:
        fail("scales", f"has shape {list(gptq['scales'].shape)}, not [groups, {out}]")
    groups = gptq["scales"].shape[0]
    if tuple(gptq["qzeros"].shape) != (groups, math.ceil(out / PER_WORD)):
        fail("qzeros", f"has shape {list(gptq['qzeros'].shape)}; {groups} groups of {out} outputs need "
                       f"[{groups}, {math.ceil(out / 8)}]")
    return out, inn


def _zeros(prefix: str, qzeros: torch.Tensor, out: int, spec: Int4Spec, what: str, v1: bool) -> torch.Tensor:
    """int4's signed zero points [out, groups] (zero - 8) of a GPTQ weight; v1 stores each minus one."""
    z = int4_common.unpack(qzeros.to(torch.int32).T.contiguous(), out, 0)
    if v1:
        if (z == OFFSET - 1).any():
            raise ModelLoadError(f"{what} tensor {prefix}qzeros holds a GPTQ v1 zero point of 15, which is 16: "
                                 "outside 4 bits")
        z = z + 1
    if spec.symmetric and (z != SYMMETRIC_ZERO - OFFSET).any():
        raise ModelLoadError(f"{what} tensor {prefix}qzeros: the config says sym but the zero points are not all "
                             f"{SYMMETRIC_ZERO}")
    return z


def convert(prefix: str, gptq: Mapping[str, torch.Tensor], spec: Int4Spec, what: str, *, v1: bool,
            g_idx_required: bool = True) -> dict[str, torch.Tensor]:
    """One GPTQ weight's parts (PARTS, by name) as int4_common's (by name, without the prefix), checked; `v1`: each
    zero point stored minus one; `g_idx_required`: GPTQModel and AutoGPTQ always write g_idx (AutoRound may not)."""
    if g_idx_required and "g_idx" not in gptq:
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
    refuse_nonfinite(gptq["scales"], prefix + "scales", what)
    z = _zeros(prefix, gptq["qzeros"], out, spec, what, v1)
    parts = {"weight_packed": gptq["qweight"].to(torch.int32).T.contiguous(),
             "weight_scale": gptq["scales"].T.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64)}
    if not spec.symmetric:
        parts["weight_zero_point"] = int4_common.pack(z, 0)
    if not plain_groups(g_idx, spec.group):
        parts["weight_g_idx"] = g_idx.to(torch.int32)
    return parts


def converter(layout: str, g_idx_required: bool = True) -> Callable[..., dict[str, torch.Tensor]]:
    """`convert` for the weights of a spec stored in `layout` ("gptq": v1, "gptq_v2")."""
    return functools.partial(convert, v1=layout == "gptq", g_idx_required=g_idx_required)


class GptqFormat:
    """GPTQModel's and AutoGPTQ's layout, v1 and v2, with `dynamic` rules (parts: PARTS)."""

    name = "gptq"
    methods = ("gptq",)
    described = "GPTQ's"
    layout = int4_common.LAYOUT

    def spec(self, qc: Mapping, where: str) -> Int4Spec:
        return gptq_spec(qc, where)

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
        converter(spec.layout)(name, parts, spec, what)

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        names, get = int4_common.translate(names, get, spec, what, PARTS, converter(spec.layout))
        return int4_common.dequantize_state(names, get, spec, dtype, what, keep)

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
        return int4_common.dequantize(converter(spec.layout)("", parts, spec, "weight"), spec)

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        return int4_common.qweight_parameters(name, shape, names, PARTS)

    def example(self) -> dict:
        return {"quant_method": "gptq", "bits": BITS, "group_size": 128, "sym": True, "desc_act": False,
                "checkpoint_format": "gptq"}


FORMAT = GptqFormat()

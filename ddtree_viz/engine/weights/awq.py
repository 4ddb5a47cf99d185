"""4-bit checkpoints in AWQ's layout (AutoAWQ's GEMM), read by us as int4_common's pack-quantized parts.

Some community 4-bit Qwen3.6-27B checkpoints are AWQ's. `quant_method` "awq", bits 4, group_size, zero_point true,
version "gemm"; in place of each quantized Linear's `weight`:

    qweight  int32 [in, out / 8]: eight fields a word along the outputs, in AutoAWQ's interleaved order (field f,
             bits 4f .. 4f+3, of qweight[i, c] holds output 8c + AWQ_ORDER[f] of input i)
    qzeros   int32 [groups, out / 8]: the zero points as they are, packed as qweight is
    scales   float16 [groups, out]

and the real weight is W[o, i] = scales[g, o] x (u[i, o] - zero[g, o]) (AutoAWQ's unpack_awq + reverse_awq_order).
Its fields are unpacked, put in output order and packed again along the inputs (`convert_awq`, one weight at a time
as it is read through int4_common.translate); from there it loads exactly as a pack-quantized checkpoint. Refused,
naming the tensor: a part missing or mis-shaped, scales holding NaN or inf, a symmetric config (AutoRound's AWQ
export) whose zero points are not all 8; another bit width, version, or no zero points. AutoRound's AWQ packing is
read by this same `convert_awq` (autoround.py).
"""

from __future__ import annotations

import math
from typing import Callable, Container, Iterable, Mapping

import torch

from ...errors import ModelLoadError
from . import int4_common
from .base import refuse_nonfinite
from .int4_common import BITS, OFFSET, PER_WORD, SYMMETRIC_ZERO, Int4Spec, group_size

PARTS = ("qweight", "qzeros", "scales")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's packing: field f of word c holds output 8c + AWQ_ORDER[f]
AWQ_FIELD_OF = [AWQ_ORDER.index(k) for k in range(8)]  # output 8c + k is field AWQ_FIELD_OF[k]


def awq_spec(qc: Mapping, where: str) -> Int4Spec:
    """The Int4Spec of an AWQ quantization_config (layout "awq"); a ModelLoadError for anything but 4-bit weights
    with zero points in the GEMM layout."""
    if qc.get("bits", 4) != BITS:
        raise ModelLoadError(f"{where}: AWQ weights of {qc.get('bits')!r} bits are not supported (only 4)")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ModelLoadError(f"{where}: AWQ version {version!r} is not supported (only 'gemm')")
    if qc.get("zero_point", True) is not True:
        raise ModelLoadError(f"{where}: AWQ without zero points is not supported")
    skip = tuple(str(m) for m in qc.get("modules_to_not_convert") or ())
    return Int4Spec(group_size(qc, where), False, skip, "awq", format="awq")


def _awq_fields(words: torch.Tensor, count: int) -> torch.Tensor:
    """AWQ words [rows, count / 8] -> their unsigned fields [rows, count] (uint8), in output order: each word's four
    bytes (little-endian) hold fields 2b and 2b + 1, and field f holds output AWQ_ORDER[f] of the word's eight."""
    rows = words.shape[0]
    b = words.to(torch.int32).contiguous().view(-1).view(torch.uint8).reshape(rows, -1, 4)  # [rows, words, bytes]
    fields = torch.stack((b & 0xF, b >> BITS), -1).reshape(rows, -1, PER_WORD)  # field f at f
    return torch.stack([fields[:, :, f] for f in AWQ_FIELD_OF], -1).reshape(rows, -1)[:, :count]


def convert_awq(prefix: str, awq: Mapping[str, torch.Tensor], spec: Int4Spec,
                what: str) -> dict[str, torch.Tensor]:
    """One AWQ weight's parts (PARTS, by name) as int4_common's (by name, without the prefix): the fields unpacked,
    put in output order and packed again along the inputs."""
    def fail(part: str, why: str):
        raise ModelLoadError(f"{what} tensor {prefix}{part} {why}")

    for part in PARTS:
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
        if tuple(awq[part].shape) != (rows, math.ceil(out / PER_WORD)):
            fail(part, f"has shape {list(awq[part].shape)}; {out} outputs need [{rows}, {math.ceil(out / 8)}]")
    refuse_nonfinite(scales, prefix + "scales", what)
    u, zero = _awq_fields(qweight, out), _awq_fields(awq["qzeros"], out).int()
    parts = {"weight_packed": int4_common.pack_fields(u.T), "weight_scale": scales.T.contiguous(),
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64)}
    if spec.symmetric:  # AutoRound's symmetric AWQ export: every zero point 8, carried by no part
        if (zero != SYMMETRIC_ZERO).any():
            raise ModelLoadError(f"{what} tensor {prefix}qzeros: the config says sym but the zero points are not "
                                 f"all {SYMMETRIC_ZERO}")
    else:
        parts["weight_zero_point"] = int4_common.pack((zero - OFFSET).T, 0)
    return parts


class AwqFormat:
    """AutoAWQ's GEMM layout (parts: PARTS)."""

    name = "awq"
    methods = ("awq",)
    described = "AWQ's"
    layout = int4_common.LAYOUT

    def spec(self, qc: Mapping, where: str) -> Int4Spec:
        return awq_spec(qc, where)

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
        convert_awq(name, parts, spec, what)

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        names, get = int4_common.translate(names, get, spec, what, PARTS, convert_awq)
        return int4_common.dequantize_state(names, get, spec, dtype, what, keep)

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
        return int4_common.dequantize(convert_awq("", parts, spec, "weight"), spec)

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        return int4_common.qweight_parameters(name, shape, names, PARTS)

    def example(self) -> dict:
        return {"quant_method": "awq", "bits": BITS, "group_size": 128, "zero_point": True, "version": "gemm"}


FORMAT = AwqFormat()

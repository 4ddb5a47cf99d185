"""The weight formats by name: the one place a checkpoint's format is chosen (vLLM's quantization registry).

A config.json's `quantization_config.quant_method` picks its format here (`spec_of`: the format's spec of the
config, checked; None for a config without one, plain weights); a spec's `format` names the format that reads it
(`format_of`); a kept Linear's type names its fast layout (`layout_of`: how the runner fuses it). Adding a format is
one module of this package with its FORMAT (base.WeightFormat) and one line in FORMATS.
"""

from __future__ import annotations

import math
from typing import Container, Mapping

from torch import nn

from ...errors import ModelLoadError
from . import autoround, awq, compressed_tensors, fp8, gptq, plain
from .base import FastLayout, Spec, WeightFormat

FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    plain.FORMAT,  # no quantization_config: the weights as stored
    fp8.FORMAT,  # the official FP8 layout: e4m3 weights, float32 scales per block
    compressed_tensors.FORMAT,  # 4-bit pack-quantized (llm-compressor's W4A16)
    gptq.FORMAT,  # 4-bit GPTQModel / AutoGPTQ, v1 and v2
    awq.FORMAT,  # 4-bit AutoAWQ GEMM
    autoround.FORMAT,  # 4-bit AutoRound, in GPTQ's or AWQ's words
)}
BY_METHOD: dict[str, WeightFormat] = {method: f for f in FORMATS.values() for method in f.methods}
LAYOUTS: dict[type[nn.Module], FastLayout] = {f.layout.module: f.layout for f in FORMATS.values()}
# the Linears kept as a quantized checkpoint stores them (their own GEMMs; what count_parameters counts by shape)
KEPT: tuple[type[nn.Module], ...] = tuple(module for module, layout in LAYOUTS.items() if layout.quantized)


def _listed(items: list[str]) -> str:
    """'a, and b, c or d': the first format, then the others (the refusal's words since the second format)."""
    head, *rest = items
    return head if not rest else f"{head}, and {', '.join(rest[:-1])}{' or ' if len(rest) > 1 else ''}{rest[-1]}"


def spec_of(config: Mapping, what: str) -> Spec | None:
    """The quantized layout of a config.json (a dict): its format's spec of the quantization_config; None when it
    has none; a ModelLoadError saying what is wrong for any quantization these readers do not know (another method,
    or the format's own refusal: a format, activation scheme or block size it does not read): transformers would
    otherwise take it down a path that is not the dequantized model's."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = f"{what} config quantization_config"
    if not isinstance(qc, Mapping):
        raise ModelLoadError(f"{where} must be a JSON object, not {qc!r}")
    method = qc.get("quant_method")
    found = BY_METHOD.get(method) if isinstance(method, str) else None
    if found is None:
        supported = _listed([f.described for f in FORMATS.values() if f.methods])
        raise ModelLoadError(f"{where}: quant_method {method!r} is not supported ({supported} load)")
    return found.spec(qc, where)


def format_of(spec: Spec | None) -> WeightFormat:
    """The format that reads a spec (None: plain)."""
    return FORMATS[plain.FORMAT.name if spec is None else spec.format]


def layout_of(module: nn.Module) -> FastLayout | None:
    """The runner's layout of a Linear of one of the formats' kinds (by its exact type), None for any other module."""
    return LAYOUTS.get(type(module))


def stored_parameters(name: str, shape: list[int], names: Container[str]) -> int:
    """The parameters one stored tensor holds, read from the headers (`names`: every tensor of the checkpoint): as
    the format whose part it is counts it (scales, zero points, group indices and shapes none; a packed 4-bit word
    eight), any other tensor its size."""
    counts = (f.parameters(name, shape, names) for f in FORMATS.values())
    return next((n for n in counts if n is not None), math.prod(shape))

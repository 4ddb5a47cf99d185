"""4-bit weight-only checkpoints (W4A16) in compressed-tensors' pack-quantized layout, read by us.

The community 4-bit Qwen3.6-27B checkpoints (llm-compressor's AWQ / GPTQ / round-to-nearest W4A16 runs) are saved by
compressed-tensors in its "pack-quantized" format. config.json's `quantization_config` is {quant_method
"compressed-tensors", format "pack-quantized", config_groups {name: {targets, weights {num_bits 4, type "int",
symmetric, strategy "group" | "channel", group_size, actorder}, input_activations null}}, ignore [...]}; each
quantized Linear stores its parts as int4_common.py describes them (weight_packed, weight_scale, weight_zero_point,
weight_g_idx, weight_shape): that layout is the one every 4-bit format is read as, so this format reads its tensors
as they are, checks them (int4_common.check, and each scale finite) and loads them through
int4_common.dequantize_state: dequantized once at load, or kept (int4_common.Int4Linear). Refused: a quantized KV
cache, sparse weights, activation quantization, another bit width, type, strategy or format.
"""

from __future__ import annotations

import math
from typing import Callable, Container, Iterable, Mapping

import torch

from ...errors import ModelLoadError
from . import int4_common
from .base import convert_weights, refuse_nonfinite, whole_number
from .int4_common import BITS, PARTS, PER_WORD, Int4Spec

STRATEGIES = ("group", "channel")


def spec_of(qc: Mapping, where: str) -> Int4Spec:
    """The spec of a compressed-tensors quantization_config (`where` names it in messages); a ModelLoadError for
    anything but 4-bit integer weights, group- or channel-wise, without activation quantization, packed."""
    fmt = qc.get("format")
    if qc.get("kv_cache_scheme"):
        raise ModelLoadError(f"{where}: a quantized KV cache (kv_cache_scheme) is not supported")
    sparsity = qc.get("sparsity_config")
    if isinstance(sparsity, Mapping) and sparsity.get("format", "dense") != "dense":
        raise ModelLoadError(f"{where}: sparse weights ({sparsity.get('format')!r}) are not supported")
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ModelLoadError(f"{where}: config_groups must name at least one group of quantized modules")
    specs = set()
    for name, group in groups.items():
        if not isinstance(group, Mapping) or not isinstance(group.get("weights"), Mapping):
            raise ModelLoadError(f"{where}: config group {name!r} has no weights entry")
        if group.get("input_activations") or group.get("output_activations"):
            raise ModelLoadError(f"{where}: config group {name!r} quantizes activations; only weight-only "
                                 "checkpoints (W4A16) load")
        group_format = group.get("format") or fmt
        if group_format != "pack-quantized":
            raise ModelLoadError(f"{where}: format {group_format!r} is not supported (only 'pack-quantized')")
        specs.add(_weights_spec(group["weights"], f"{where} config group {name!r}"))
    if len(specs) != 1:
        raise ModelLoadError(f"{where}: config groups with different weight schemes are not supported")
    (spec,) = specs
    return Int4Spec(spec[0], spec[1], tuple(str(s) for s in qc.get("ignore") or ()))


def _weights_spec(w: Mapping, where: str) -> tuple[int, bool]:
    if w.get("num_bits") != BITS or w.get("type", "int") != "int":
        raise ModelLoadError(f"{where}: weights of {w.get('num_bits')!r} bits of type {w.get('type')!r} are not "
                             "supported (only 4-bit integers)")
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        raise ModelLoadError(f"{where}: weight strategy {strategy!r} is not supported ({', '.join(STRATEGIES)})")
    if w.get("dynamic"):
        raise ModelLoadError(f"{where}: dynamic weight scales are not supported")
    group = w.get("group_size") if strategy == "group" else 0
    if strategy == "group" and not (whole_number(group) and group >= 1):
        raise ModelLoadError(f"{where}: group_size must be a whole number >= 1, not {group!r}")
    symmetric = w.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise ModelLoadError(f"{where}: symmetric must be true or false, not {symmetric!r}")
    return group, symmetric


def config_entry(spec: Int4Spec) -> dict:
    """The quantization_config llm-compressor writes for a W4A16 run (one group over every Linear)."""
    weights = {"num_bits": BITS, "type": "int", "symmetric": spec.symmetric, "dynamic": False,
               "strategy": "group" if spec.group else "channel", "group_size": spec.group or None, "actorder": None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": list(spec.ignore)}


def quantize_state(state: Mapping[str, torch.Tensor], spec: Int4Spec,
                   convert: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """A plain state dict in the layout: each 2-D weight `convert(name)` picks becomes its parts
    (int4_common.quantize: round to nearest; the tests' checkpoints)."""
    return convert_weights(state, convert, lambda name, w: {name.removesuffix("weight") + part: t
                                                             for part, t in int4_common.quantize(w, spec).items()})


class CompressedTensorsFormat:
    """compressed-tensors' pack-quantized 4-bit layout (parts: int4_common.PARTS)."""

    name = "compressed-tensors"
    methods = ("compressed-tensors",)
    described = "4-bit weights in compressed-tensors' pack-quantized format"
    layout = int4_common.LAYOUT

    def spec(self, qc: Mapping, where: str) -> Int4Spec:
        return spec_of(qc, where)

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
        """The layout's checks, then the scales finite (by their stored name)."""
        int4_common.check(name, parts, spec, what)
        refuse_nonfinite(parts["weight_scale"], name + "weight_scale", what)

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        return int4_common.dequantize_state(names, get, spec, dtype, what, keep, self.check)

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
        return int4_common.dequantize(parts, spec)

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        if name.endswith(PARTS[1:]):
            return 0
        return math.prod(shape) * PER_WORD if name.endswith(PARTS[0]) else None

    def example(self) -> dict:
        return config_entry(Int4Spec(128, True))


FORMAT = CompressedTensorsFormat()

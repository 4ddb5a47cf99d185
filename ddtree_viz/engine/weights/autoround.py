"""4-bit checkpoints of Intel's AutoRound, read by us through GPTQ's or AWQ's reader as its packing says.

`quant_method` "auto-round" (older "intel/auto-round"); bits 4, group_size, sym, data_type "int", packing_format.
It stores one of the two layouts gptq.py and awq.py read, as its inference code reads them
(auto_round/inference/backend.py): "auto_round:auto_gptq" (the default, and what a symmetric export writes) is GPTQ
v1 (each zero point minus one), "auto_round" and "auto_round:gptqmodel" are GPTQ with the zero points as they are
(gptqmodel's with a g_idx, the others without: the groups are then column // group_size), "auto_round:auto_awq"
AWQ's GEMM layout. Its `extra_config` sets layers apart ({layer name or regex: {bits, group_size, sym, ...}}; a
layer of 16 bits is stored plain): each weight is read with its own group and zero-point scheme
(int4_common.Int4Spec.at, AutoRound's rule: the exact name first, else the first regex found in the name). Refused:
another packing format (FP8, MXFP / NVFP4, llm-compressor's, which is compressed-tensors), data type, bit width (in
the config or any extra_config entry) or quantized activations (act_bits below 16).
"""

from __future__ import annotations

from typing import Callable, Container, Iterable, Mapping

import torch

from ...errors import ModelLoadError
from . import awq, gptq, int4_common
from .base import whole_number
from .int4_common import Int4Spec, rules

METHODS = ("auto-round", "intel/auto-round")
# AutoRound's packing formats as the layouts they store (its inference/backend.py: GPTQ_FORMAT "zp+-1",
# GPTQ_FORMAT_NO_ZP, AWQ_FORMAT; and the older names its convert_model.py normalises: "auto", "auto_round:gptq",
# "auto_round:awq")
PACKINGS = {"auto_round:auto_gptq": "gptq", "auto_round": "gptq_v2", "auto_round:gptqmodel": "gptq_v2",
            "auto_round:auto_awq": "awq", "auto": "gptq", "auto_round:gptq": "gptq", "auto_round:awq": "awq"}
# auto-round's heuristic: an extra_config key holding one of these is a regex, any other a layer's name
REGEX_TOKENS = (".*", "^", "$", "|", "(", ")", "[", "]", "?", "+")


def autoround_spec(qc: Mapping, where: str) -> Int4Spec:
    """The Int4Spec of an AutoRound quantization_config (layout: its packing format, read as PACKINGS
    says; overrides: its extra_config); a ModelLoadError for another packing format, or for anything but 4-bit
    integer weights with 16-bit activations, in the config or in any extra_config entry."""
    packing = qc.get("packing_format", "auto_round:auto_gptq")
    if packing not in PACKINGS:
        raise ModelLoadError(f"{where}: AutoRound packing_format {packing!r} is not supported "
                             f"({', '.join(PACKINGS)})")
    group, symmetric = scheme(qc, {}, where)

    def rule(key: str, entry: Mapping, here: str) -> tuple:
        """auto-round's reading: a key with one of REGEX_TOKENS is a regex (re.search), any other a layer's name;
        16 bits or more leaves the layer unquantized."""
        how = "search" if any(t in key for t in REGEX_TOKENS) else "name"
        bits = entry.get("bits", qc.get("bits"))
        if whole_number(bits) and bits >= 16:
            return (how, key, None, True)
        return (how, key, *scheme(qc, entry, here))

    return Int4Spec(group, symmetric, (), packing, rules(qc.get("extra_config"), "extra_config", where, rule),
                    "autoround")


def scheme(qc: Mapping, entry: Mapping, where: str) -> tuple[int, bool]:
    """(group, symmetric) of AutoRound's config with one extra_config entry over it; refused unless 4-bit integer
    weights with 16-bit (or no) activation quantization."""
    value = {**qc, **entry}
    if value.get("data_type", "int") != "int":
        raise ModelLoadError(f"{where}: AutoRound data_type {value.get('data_type')!r} is not supported (only 'int')")
    act_bits = value.get("act_bits")
    if act_bits is not None and not (whole_number(act_bits) and act_bits >= 16):
        raise ModelLoadError(f"{where}: activations quantized to {act_bits!r} bits (act_bits) are not supported; "
                             "only weight-only checkpoints (W4A16) load")
    return gptq.scheme(qc, entry, where, "AutoRound")


def packing(spec: Int4Spec) -> str:
    """The layout a GPTQ, AWQ or AutoRound spec's weights are stored in: "gptq" (v1), "gptq_v2" or "awq"."""
    return PACKINGS.get(spec.layout, spec.layout)


# each stored layout's reader: (its parts' names, its convert(prefix, parts, spec, what)); AutoRound's GPTQ packings
# may leave g_idx out (the groups are then column // group_size)
READERS = {"gptq": (gptq.PARTS, gptq.converter("gptq", g_idx_required=False)),
           "gptq_v2": (gptq.PARTS, gptq.converter("gptq_v2", g_idx_required=False)),
           "awq": (awq.PARTS, awq.convert_awq)}


class AutoRoundFormat:
    """Intel's AutoRound: GPTQ's or AWQ's words under its packing_format, per-layer rules in extra_config."""

    name = "autoround"
    methods = METHODS
    described = "AutoRound's"
    layout = int4_common.LAYOUT

    def spec(self, qc: Mapping, where: str) -> Int4Spec:
        return autoround_spec(qc, where)

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
        READERS[packing(spec)][1](name, parts, spec, what)

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        names, get = int4_common.translate(names, get, spec, what, *READERS[packing(spec)])
        return int4_common.dequantize_state(names, get, spec, dtype, what, keep)

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
        return int4_common.dequantize(READERS[packing(spec)][1]("", parts, spec, "weight"), spec)

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        return int4_common.qweight_parameters(name, shape, names, gptq.PARTS)

    def example(self) -> dict:
        return {"quant_method": METHODS[0], "bits": 4, "group_size": 128, "sym": True, "data_type": "int",
                "packing_format": "auto_round:auto_gptq"}


FORMAT = AutoRoundFormat()

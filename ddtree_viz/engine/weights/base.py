"""What every weight format is and shares: the protocol a format implements (`WeightFormat`), the runner's form of a
kind of Linear (`FastLayout`), and the plumbing none of them owns (the stand-ins a kept weight loads as, the check
every scale passes, the tests' and benches' conversions).

A format is one module of this package (fp8.py, compressed_tensors.py, gptq.py, awq.py, autoround.py, plain.py)
holding one object, FORMAT, that registry.py lists by name; nothing outside this package chooses a format by a
string (tests/test_weights.py holds the engine to that). Its spec is a frozen dataclass of what the checkpoint's
quantization_config promises, whose `format` is the registry's name of the format that reads it.
"""

from __future__ import annotations

from typing import Callable, Container, Iterable, Mapping, Protocol, runtime_checkable

import torch
from torch import nn

from ...errors import ModelLoadError
from ...words import plural


@runtime_checkable
class Spec(Protocol):
    """What a checkpoint's quantization_config promises (Fp8Spec, Int4Spec): checked data, no tensors."""

    format: str  # the registry's name of the format that reads it

    def label(self, dtype: torch.dtype, kept: bool = False) -> str:
        """The precision as people read it (ModelPair.target_precision), dequantized to `dtype` or kept."""


@runtime_checkable
class FastLayout(Protocol):
    """The runner's form of one kind of Linear (plain, FP8 kept, 4-bit kept): engine/fused.py fuses the projections
    of one input through it, never naming a kind."""

    module: type[nn.Module]  # the Linear a weight of this kind is (type(m) is module)
    fused: type  # its fused kind: called x -> the parts' outputs; STACKS (field -> the parts' attribute it views);
    # ride(x, plain) -> y or None (a plain run's product in this run's launch)
    quantized: bool  # whether the module keeps a checkpoint's quantized tensors (registry.KEPT)

    def key(self, m: nn.Module) -> tuple | None:
        """What a bias-free part of this kind fuses with (parts of one key stack), None where it never fuses."""

    def whole(self, m: nn.Module) -> bool:
        """Whether the part's rows end where its stacked tensors' rows do (a run of parts goes on past it)."""

    def fuse(self, mods: list[nn.Module], stacked: Mapping[str, torch.Tensor | None], sizes: tuple[int, ...]):
        """The fused kind of a run of parts, from their STACKS stacked by rows (None where the parts hold none)."""


@runtime_checkable
class WeightFormat(Protocol):
    """One checkpoint weight format (vLLM's QuantizationConfig and its linear method, in one object).

    parts: one weight's stored tensors by the ending of their names after `name` (fp8: "" the weight itself and
    "_scale_inv"; compressed-tensors: "weight_packed", "weight_scale", ...; GPTQ and AWQ: "qweight", "qzeros",
    "scales", "g_idx"). what: "target" or "drafter", for messages; where: the config entry, for messages. Every
    refusal is a ModelLoadError naming the config field or the tensor."""

    name: str  # the registry's key (spec.format)
    methods: tuple[str, ...]  # the quantization_config.quant_method values it reads (plain: none, no config)
    described: str  # what it reads, as the refusal of an unknown quant_method lists it ("" for plain)
    layout: FastLayout  # how a weight kept as stored runs and fuses (the runner's fast form)

    def spec(self, qc: Mapping, where: str) -> Spec | None:
        """The spec of a quantization_config whose quant_method is one of `methods` (a Mapping), checked."""

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Spec, what: str) -> None:
        """One weight's stored tensors against the spec (dtypes, shapes, the scales finite)."""

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Spec | None, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        """Load: the checkpoint's tensors (`names`, each read by `get`, one at a time) as a state dict whose weights
        are dequantized in float32 and cast to `dtype`, or with `keep` (a dict) each quantized weight a stand_in
        and keep[name] = (the stand-in, (device, bias) -> its kept module), for load.keep_linears."""

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Spec) -> torch.Tensor:
        """The plain reference: one weight from its stored parts, [out, in] in float32 (exact)."""

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        """The parameters one stored tensor of this format holds (scales 0, a packed word eight), None where the
        tensor is none of its parts; `names`: every tensor of the checkpoint (read from the headers only)."""

    def example(self) -> dict:
        """A small quantization_config this format reads (the registry's round trip; {} for plain)."""


def refuse_nonfinite(tensor: torch.Tensor, name: str, what: str) -> None:
    """A loaded scale (or codebook) that holds NaN or inf refused, naming the tensor: every weight it multiplies
    would be NaN or inf, the logits NaN and the argmax token 0, an output that still matches a greedy reference made
    the same way. Every quantized format and DFlash2's codebooks call it once a tensor at load; one isfinite over
    the scales (about 1/128 of the weights), not over the weights."""
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero()
    nan = int(torch.isnan(tensor).sum())
    kinds = " and ".join(k for k, n in (("NaN", nan), ("inf", bad.shape[0] - nan)) if n)
    raise ModelLoadError(f"{what} tensor {name} holds {plural(bad.shape[0], 'non-finite value')} "
                         f"({kinds}; the first at {bad[0].tolist()}): the weights it scales would be NaN or inf and "
                         "every output token garbage. The checkpoint is damaged or badly exported: download it again "
                         "or quantize it again (a checkpoint whose scales are all finite loads)")


def stand_in(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What a kept weight is loaded as while transformers loads the rest (a format's state with `keep`): zeros of
    its shape and `dtype` in one element of memory (a stride-0 view), whose storage tells load.keep_linears which
    Linear was loaded with it; the kept module replaces it, so a checkpoint's memory at load is its own size, not a
    dequantized model's (docs/lab/NOTEBOOK.md section 36: a 0.33B model's FP8 load +949 -> +54 MiB of host memory).
    """
    return torch.zeros(1, dtype=dtype, device=device).expand(shape)


def is_stand_in(t: torch.Tensor) -> bool:
    """A `stand_in` (or any tensor of more than one element in one element of memory)."""
    return t.dim() > 0 and t.numel() > 1 and all(stride == 0 for stride in t.stride())


def whole_number(value) -> bool:
    """An int that is not a bool (JSON's true is no group size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def convert_weights(state: Mapping[str, torch.Tensor], convert: Callable[[str], bool],
                    stored: Callable[[str, torch.Tensor], dict]) -> dict[str, torch.Tensor]:
    """A plain state dict in a quantized layout (4-bit's, or fp8's): each 2-D weight `convert(name)` picks replaced
    by the tensors `stored(name, weight)` makes (name -> tensor), every other tensor kept (the tests' and benches'
    checkpoints)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and tensor.dim() == 2 and convert(name):
            out.update(stored(name, tensor))
        else:
            out[name] = tensor.detach().contiguous()
    return out


@torch.no_grad()
def replace_linears(model: nn.Module, skip: Iterable[str], make: Callable[[torch.Tensor, torch.Tensor | None],
                                                                          nn.Module]) -> int:
    """Every plain Linear of `model` whose name has none of `skip` in it replaced by make(weight, bias) (fp8's and
    int4_common's quantize_linears), one at a time. Returns how many."""
    skip = tuple(skip)
    done = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and not any(s in name for s in skip):
            bias = None if module.bias is None else module.bias.detach()
            owner, attr = owner_of(model, name)
            setattr(owner, attr, make(module.weight.detach(), bias))
            done += 1
    return done


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding submodule `name` and its attribute name there."""
    parent, _, attr = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr

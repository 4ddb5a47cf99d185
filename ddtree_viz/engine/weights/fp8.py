"""The official FP8 checkpoint layout (Qwen3.6-27B-FP8, Qwen3.8-27B-FP8; DeepSeek-V3 style), read by us.

config.json's `quantization_config` is {quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
weight_block_size [128, 128], modules_to_not_convert [...]}; each converted Linear stores `weight` (float8_e4m3fn,
[out, in]) and `weight_scale_inv` (float32, [ceil(out/bo), ceil(in/bi)]): the real weight is weight x scale per
bo x bi block ("_inv" is still a multiplier). Every other tensor (embeddings, lm_head, norms, the modules not
converted) is stored as is.

Why our own reader and not transformers' FineGrainedFP8 integration: load.py's docstring. The weights are
dequantized once at load (`FORMAT.state`), the product computed in float32 and only then cast to the dtype asked for.

Kept as FP8 (`load.load_causal_lm(..., keep_quantized=True)`, what a target on one CUDA GPU gets): each converted Linear
becomes an `Fp8Linear` holding the checkpoint's e4m3 bytes and float32 scales (about 1 byte a parameter), whose
forward computes the same function as the dequantized model: on CUDA the FP8 GEMM of engine/kernels/fp8_gemm/ (the bytes
and scales read as stored, dequantized in registers, rounded once to the activations' dtype, or at one row kept
exact through x's columns times the block's scale; no dequantized copy of a weight is ever made, so a prefill's
peak memory is the FP8 model's); elsewhere the weight dequantized for the call (float32 product, cast once) and
F.linear. The static runner fuses them as it fuses plain Linears (LAYOUT: FusedFp8Linear, engine/fused.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Container, Iterable, Mapping

import torch
from torch import nn

from ...errors import ModelLoadError
from ..kernels.fp8_gemm.dispatch import gemm_module as _gemm_module, linear, riding_linear  # noqa: F401 (this kind's)
from ..kernels.fp8_gemm.naive import dequantize
from .base import convert_weights, refuse_nonfinite, replace_linears, stand_in, whole_number
from .plain import FusedLinear

SCALE_SUFFIX = "_scale_inv"  # weight -> weight_scale_inv
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
# the modules the official Qwen3.6-27B-FP8 layout leaves in bf16 (the tests' and the bench's FP8 weights follow it)
NOT_CONVERTED = ("lm_head", "model.embed_tokens", "linear_attn.in_proj_a", "linear_attn.in_proj_b")


@dataclass(frozen=True)
class Fp8Spec:
    """What a checkpoint's quantization_config promises: the block every scale covers."""

    block: tuple[int, int]  # (rows, columns) of the weight each scale multiplies
    skip: tuple[str, ...] = ()  # modules_to_not_convert, as given (informational: the scales decide)
    format: ClassVar[str] = "fp8"  # the registry's name of its reader

    def label(self, dtype: torch.dtype, kept: bool = False) -> str:
        """The precision as people read it, e.g. 'fp8-e4m3 block 128 (dequantized to float32)', or with the FP8
        weights kept 'fp8-e4m3 block 128 (fp8 weights, bfloat16 activations)'."""
        bo, bi = self.block
        block = str(bo) if bo == bi else f"{bo}x{bi}"
        name = str(dtype).removeprefix("torch.")
        return f"fp8-e4m3 block {block} ({f'fp8 weights, {name} activations' if kept else f'dequantized to {name}'})"


def spec_of(qc: Mapping, where: str) -> Fp8Spec:
    """The spec of an FP8 quantization_config (quant_method "fp8"); a ModelLoadError saying what is wrong for another
    fmt, activation scheme or an unusable block size: transformers would otherwise take it down a path that is not
    the dequantized model's."""
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(f"{where}: fmt {fmt!r} is not supported (only 'e4m3', float8_e4m3fn weights)")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ModelLoadError(f"{where}: activation_scheme {scheme!r} is not supported (only 'dynamic')")
    block = qc.get("weight_block_size")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(whole_number(b) and b >= 1 for b in block)):
        raise ModelLoadError(f"{where}: weight_block_size must be two whole numbers >= 1 (e.g. [128, 128]), not {block!r}")
    skip = qc.get("modules_to_not_convert") or ()
    return Fp8Spec((block[0], block[1]), tuple(str(s) for s in skip))


def grid(shape: Iterable[int], block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid of a [out, in] weight: one scale per block, the last row / column of blocks partial."""
    out, inn = shape
    return math.ceil(out / block[0]), math.ceil(inn / block[1])


def quantize(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale grid) as the official checkpoints are made: each block scaled so that its
    largest magnitude is FP8_MAX. For the tests' checkpoints and the bench's random FP8 weights."""
    out, inn = weight.shape
    rows, cols = grid(weight.shape, block)
    padded = torch.zeros(rows * block[0], cols * block[1], dtype=torch.float32, device=weight.device)
    padded[:out, :inn] = weight.float()
    tiles = padded.reshape(rows, block[0], cols, block[1])
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(padded.shape)[:out, :inn].contiguous(), scale.contiguous()


def _implied_block(shape, scale_shape) -> tuple[int, int] | None:
    """The square-ish block a mis-shaped grid would fit (for the message): smallest (bo, bi) giving that grid."""
    (out, inn), (r, c) = shape, scale_shape
    if r < 1 or c < 1:
        return None
    bo, bi = math.ceil(out / r), math.ceil(inn / c)
    return (bo, bi) if grid(shape, (bo, bi)) == (r, c) else None


def _check_pair(name: str, weight: torch.Tensor, scale: torch.Tensor, spec: Fp8Spec, what: str) -> None:
    """One converted weight and its scales, against the layout; the message names the weight."""
    if weight.dtype != FP8_DTYPE:
        raise ModelLoadError(f"{what} weight {name} has scales but is {str(weight.dtype).removeprefix('torch.')}, "
                             "not float8_e4m3fn")
    if weight.dim() != 2:
        raise ModelLoadError(f"{what} weight {name} is FP8 but has shape {list(weight.shape)}, not [out, in]")
    if scale.dtype != torch.float32:
        raise ModelLoadError(f"{what} scales {name}{SCALE_SUFFIX} are {str(scale.dtype).removeprefix('torch.')}, not float32")
    want = grid(weight.shape, spec.block)
    if scale.dim() != 2 or tuple(scale.shape) != want:
        implied = _implied_block(weight.shape, scale.shape) if scale.dim() == 2 else None
        why = (f"; they fit {implied[0]}x{implied[1]} blocks, not the config's weight_block_size {list(spec.block)}"
               if implied else "")
        raise ModelLoadError(f"{what} scales {name}{SCALE_SUFFIX} have shape {list(scale.shape)}; weight {name} "
                             f"{list(weight.shape)} in {spec.block[0]}x{spec.block[1]} blocks needs {list(want)}{why}")
    refuse_nonfinite(scale, name + SCALE_SUFFIX, what)


def dequantize_state(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Fp8Spec,
                     dtype: torch.dtype, what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as a plain state dict in `dtype`: each FP8 weight times its scales (float32, then
    cast), every other tensor cast as is. `get(name)` reads
    one tensor (lazily, so a 27B checkpoint is read one tensor at a time). Refused, naming the tensor: an FP8
    weight without scales, scales without their weight, scales of the wrong shape or dtype, or holding NaN or inf. With `keep` (a dict),
    each FP8 weight goes in as its base.stand_in (load.keep_linears replaces it) and keep[name] = (the stand-in, a
    function (device, bias) -> the Fp8Linear of the weight and scales)."""
    names = list(names)
    present = set(names)
    state: dict[str, torch.Tensor] = {}
    for name in names:
        if name.endswith(SCALE_SUFFIX):
            if name.removesuffix(SCALE_SUFFIX) not in present:
                raise ModelLoadError(f"{what} scales {name} have no weight {name.removesuffix(SCALE_SUFFIX)}")
            continue
        tensor = get(name)
        if name + SCALE_SUFFIX in present:
            scale = get(name + SCALE_SUFFIX)
            _check_pair(name, tensor, scale, spec, what)
            if keep is not None:
                keep[name] = (stand_in(tuple(tensor.shape), dtype, tensor.device),
                              _maker(tensor, scale, spec.block))
                tensor = keep[name][0]
            else:
                tensor = dequantize(tensor, scale, spec.block)
        elif tensor.dtype == FP8_DTYPE:
            raise ModelLoadError(f"{what} weight {name} is float8_e4m3fn but has no scales ({name}{SCALE_SUFFIX} is missing)")
        elif name.endswith(("activation_scale", "input_scale")):
            raise ModelLoadError(f"{what} tensor {name}: static activation scales are not supported (only 'dynamic')")
        state[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return state


def quantize_state(state: Mapping[str, torch.Tensor], block: tuple[int, int],
                   convert: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """A plain state dict in the official layout: each 2-D weight `convert(name)` picks becomes e4m3 + scales."""
    return convert_weights(state, convert,
                                lambda name, w: dict(zip((name, name + SCALE_SUFFIX), quantize(w, block))))


def config_entry(block: tuple[int, int] = (128, 128), skip: Iterable[str] = ()) -> dict:
    """The quantization_config the official checkpoints carry."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block), "modules_to_not_convert": list(skip)}


# ------------------------------------------------------------------------------------------------------------
# FP8 weights kept: Fp8Linear, its function, its fused kind
# ------------------------------------------------------------------------------------------------------------


class Fp8Linear(nn.Module):
    """A Linear kept as the checkpoint stores it: `weight` float8_e4m3fn [out, in] and `weight_scale_inv` float32
    [ceil(out / bo), ceil(in / bi)] (parameters, no gradient), computing `linear` (the dequantized model's
    function). transformers' forward calls it like the Linear it replaces."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.block = (int(block[0]), int(block[1]))
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.weight_scale_inv, self.block)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """The real weight, e4m3 x scale in float32."""
        return dequantize(self.weight, self.weight_scale_inv, self.block)

    def stored_bytes(self) -> tuple[int, int]:
        """(the weight's bytes, its scales' bytes) as kept: what a step reads of it."""
        return (self.weight.numel() * self.weight.element_size(),
                self.weight_scale_inv.numel() * self.weight_scale_inv.element_size())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, block={self.block}, fp8-e4m3"


def _maker(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> Callable:
    """What load.keep_linears calls for a kept FP8 weight: (device, bias) -> its Fp8Linear there."""
    return lambda device, bias: Fp8Linear(weight.to(device), scale.to(device), block, bias)


@dataclass(frozen=True)
class FusedFp8Linear:
    """plain.FusedLinear's FP8 kind: several Fp8Linears of one input as one FP8 weight (their rows stacked, each part
    but the last a whole number of scale blocks tall) and its scale grid; y = x W^T split into their outputs."""

    weight: torch.Tensor  # [sum of out_features, in_features] float8_e4m3fn
    scale: torch.Tensor  # [ceil(rows / block[0]), ceil(in / block[1])] float32
    block: tuple[int, int]
    sizes: tuple[int, ...]
    STACKS: ClassVar[dict[str, str]] = {"weight": "weight", "scale": "weight_scale_inv"}  # field: the parts' attribute

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return linear(x, self.weight, self.scale, self.block).split(self.sizes, dim=-1)

    def ride(self, x: torch.Tensor, plain: FusedLinear) -> torch.Tensor | None:
        """This run's product and the plain run's after it side by side in one launch (riding_linear), or None."""
        return riding_linear(x, self.weight, self.scale, self.block, plain.weight)


def quantize_linears(model: nn.Module, block: tuple[int, int] = (128, 128), skip: Iterable[str] = NOT_CONVERTED) -> int:
    """Every Linear of `model` whose name has none of `skip` in it replaced by an Fp8Linear of its weight quantized
    as the official checkpoints are (`quantize`, on the weight's device), one at a time (the transient is one
    weight in float32). The bench's and the GPU tests' FP8 models. Returns how many."""
    return replace_linears(model, skip, lambda weight, bias: Fp8Linear(*quantize(weight, block), block, bias))


class Fp8Layout:
    """Fp8Linear as the runner runs it: parts of one scale block stack their bytes and scales (FusedFp8Linear), a
    run going on past a part only where it is a whole number of scale blocks tall."""

    module = Fp8Linear
    fused = FusedFp8Linear
    quantized = True

    def key(self, m: Fp8Linear) -> tuple:
        return ("fp8", m.block)

    def whole(self, m: Fp8Linear) -> bool:
        return m.out_features % m.block[0] == 0

    def fuse(self, mods: list[Fp8Linear], stacked: Mapping[str, torch.Tensor], sizes: tuple[int, ...]
             ) -> FusedFp8Linear:
        return FusedFp8Linear(stacked["weight"], stacked["scale"], mods[0].block, sizes)


class Fp8Format:
    """The official FP8 layout: e4m3 weights and float32 scales per block (parts: "" the weight, "_scale_inv")."""

    name = "fp8"
    methods = ("fp8",)
    described = "the FP8 layout, quant_method 'fp8'"
    layout = Fp8Layout()

    def spec(self, qc: Mapping, where: str) -> Fp8Spec:
        return spec_of(qc, where)

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec: Fp8Spec, what: str) -> None:
        _check_pair(name, parts[""], parts[SCALE_SUFFIX], spec, what)

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Fp8Spec, dtype: torch.dtype,
              what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
        return dequantize_state(names, get, spec, dtype, what, keep)

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec: Fp8Spec) -> torch.Tensor:
        return dequantize(parts[""], parts[SCALE_SUFFIX], spec.block)

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> int | None:
        return 0 if name.endswith(SCALE_SUFFIX) else None

    def example(self) -> dict:
        return config_entry()


FORMAT = Fp8Format()

"""The official FP8 checkpoint layout (Qwen3.6-27B-FP8, Qwen3.8-27B-FP8; DeepSeek-V3 style), read by us.

config.json's `quantization_config` is {quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
weight_block_size [128, 128], modules_to_not_convert [...]}; each converted Linear stores `weight` (float8_e4m3fn,
[out, in]) and `weight_scale_inv` (float32, [ceil(out/bo), ceil(in/bi)]): the real weight is weight x scale per
bo x bi block ("_inv" is still a multiplier). Every other tensor (embeddings, lm_head, norms, the modules not
converted) is stored as is.

Why our own reader and not transformers' FineGrainedFP8 integration: on a machine without an FP8 GPU transformers
falls back to dequantizing, but it derives the block from the scale grid (rows // grid rows), so a dimension that is
not a multiple of the block (a partial last block) is dequantized with the wrong block silently; it does not say
which tensor is missing or mis-shaped; and its FP8Linear path computes with FP8-quantized activations, which is not
the function we hold the runner to. Here the weights are dequantized once at load, the product computed in float32
and only then cast to the dtype asked for; the model is then built from its config without the quantization entry,
so both engines meet plain Linear weights (docs/ARCHITECTURE.md "Add a weight format").

Kept as FP8 (`load_causal_lm(..., keep_quantized=True)`, what a target on one CUDA GPU gets): each converted Linear
becomes an `Fp8Linear` holding the checkpoint's e4m3 bytes and float32 scales (about 1 byte a parameter), whose
forward computes the same function as the dequantized model: on CUDA the FP8 GEMM of engine/fp8_gemm.py (the bytes
and scales read as stored, dequantized in registers, rounded once to the activations' dtype, or at one row kept
exact through x's columns times the block's scale; no dequantized copy of a weight is ever made, so a prefill's
peak memory is the FP8 model's); elsewhere the weight dequantized for the call (float32 product, cast once) and
F.linear. The static runner fuses them as it fuses plain Linears (engine/fused.py).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DDTreeVizError, ModelLoadError
from ..files import read_limited
from . import int4, int4_formats

SCALE_SUFFIX = "_scale_inv"  # weight -> weight_scale_inv
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
FORMAT_ATTR = "_ddtree_weight_format"  # set on a target loaded here: its Fp8Spec.label (ModelPair.target_precision)
# the modules the official Qwen3.6-27B-FP8 layout leaves in bf16 (the tests' and the bench's FP8 weights follow it)
NOT_CONVERTED = ("lm_head", "model.embed_tokens", "linear_attn.in_proj_a", "linear_attn.in_proj_b")


@dataclass(frozen=True)
class Fp8Spec:
    """What a checkpoint's quantization_config promises: the block every scale covers."""

    block: tuple[int, int]  # (rows, columns) of the weight each scale multiplies
    skip: tuple[str, ...] = ()  # modules_to_not_convert, as given (informational: the scales decide)

    def label(self, dtype: torch.dtype, kept: bool = False) -> str:
        """The precision as people read it, e.g. 'fp8-e4m3 block 128 (dequantized to float32)', or with the FP8
        weights kept 'fp8-e4m3 block 128 (fp8 weights, bfloat16 activations)'."""
        bo, bi = self.block
        block = str(bo) if bo == bi else f"{bo}x{bi}"
        name = str(dtype).removeprefix("torch.")
        return f"fp8-e4m3 block {block} ({f'fp8 weights, {name} activations' if kept else f'dequantized to {name}'})"


def spec_of(config: Mapping, what: str) -> Fp8Spec | int4.Int4Spec | None:
    """The quantized layout of a config.json (a dict): the FP8 spec, or for compressed-tensors' 4-bit pack-quantized
    layout int4's; None when it has no quantization_config; a ModelLoadError saying what is wrong for any
    quantization these readers do not know (another method, format, activation scheme or an unusable block size):
    transformers would otherwise take it down a path that is not the dequantized model's."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = f"{what} config quantization_config"
    if not isinstance(qc, Mapping):
        raise ModelLoadError(f"{where} must be a JSON object, not {qc!r}")
    method = qc.get("quant_method")
    if method == "compressed-tensors":
        return int4.spec_of(qc, where)
    if method == "gptq":
        return int4_formats.gptq_spec(qc, where)
    if method == "awq":
        return int4_formats.awq_spec(qc, where)
    if method in int4_formats.AUTOROUND_METHODS:
        return int4_formats.autoround_spec(qc, where)
    if method != "fp8":
        raise ModelLoadError(f"{where}: quant_method {method!r} is not supported (the FP8 layout, quant_method 'fp8', "
                             "and 4-bit weights in compressed-tensors' pack-quantized format, GPTQ's, AWQ's or "
                             "AutoRound's load)")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelLoadError(f"{where}: fmt {fmt!r} is not supported (only 'e4m3', float8_e4m3fn weights)")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ModelLoadError(f"{where}: activation_scheme {scheme!r} is not supported (only 'dynamic')")
    block = qc.get("weight_block_size")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
        raise ModelLoadError(f"{where}: weight_block_size must be two whole numbers >= 1 (e.g. [128, 128]), not {block!r}")
    skip = qc.get("modules_to_not_convert") or ()
    return Fp8Spec((block[0], block[1]), tuple(str(s) for s in skip))


def grid(shape: Iterable[int], block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid of a [out, in] weight: one scale per block, the last row / column of blocks partial."""
    out, inn = shape
    return math.ceil(out / block[0]), math.ceil(inn / block[1])


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight x scale per block, in float32 (the exact product: an e4m3 value times a float32 scale)."""
    out, inn = weight.shape
    # a block taller or wider than the weight is one block that way: repeat no further than the weight reaches (a
    # weight_block_size of 10^9 allocated gigabytes before any check)
    rows, cols = min(block[0], out), min(block[1], inn)
    full = scale.float().repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inn]
    return weight.float() * full


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
    int4.refuse_nonfinite(scale, name + SCALE_SUFFIX, what)


def dequantize_state(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Fp8Spec | int4.Int4Spec,
                     dtype: torch.dtype, what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as a plain state dict in `dtype` (a 4-bit layout's: int4.dequantize_state, nothing
    kept): each FP8 weight times its scales (float32, then cast), every other tensor cast as is. `get(name)` reads
    one tensor (lazily, so a 27B checkpoint is read one tensor at a time). Refused, naming the tensor: an FP8
    weight without scales, scales without their weight, scales of the wrong shape or dtype, or holding NaN or inf. With `keep` (a dict),
    each FP8 weight goes in as its int4.stand_in (`keep_linears` replaces it) and keep[name] = (the stand-in, a
    function (device, bias) -> the Fp8Linear of the weight and scales)."""
    if isinstance(spec, int4.Int4Spec):
        if spec.layout != "pack-quantized":  # GPTQ or AWQ tensors read as the pack-quantized parts they are
            names, get = int4_formats.translate(names, get, spec, what)
        return int4.dequantize_state(names, get, spec, dtype, what, keep)
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
                keep[name] = (int4.stand_in(tuple(tensor.shape), dtype, tensor.device),
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
    return int4.convert_weights(state, convert,
                                lambda name, w: dict(zip((name, name + SCALE_SUFFIX), quantize(w, block))))


def config_entry(block: tuple[int, int] = (128, 128), skip: Iterable[str] = ()) -> dict:
    """The quantization_config the official checkpoints carry."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block), "modules_to_not_convert": list(skip)}


MAX_INDEX_BYTES = 64 << 20  # a model.safetensors.index.json (a 27B's is ~100 KB)


def checkpoint_files(path: Path, what: str) -> list[Path]:
    """A model directory's safetensors files: the index's shards, else every *.safetensors file. The index must map
    tensor names to file names in the directory; every file must be a regular file (a pipe or device would hang the
    read): ModelLoadError naming what is wrong."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(read_limited(index, MAX_INDEX_BYTES, "weight index"))["weight_map"]
        except (DDTreeVizError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ModelLoadError(f"{what} weight index {index} is unreadable: {exc}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelLoadError(f"{what} weight index {index}: weight_map must map each tensor name to a file name")
        names = sorted(set(weight_map.values()))
        if any(Path(f).name != f or f in ("", ".", "..") for f in names):
            raise ModelLoadError(f"{what} weight index {index}: a file name in weight_map is a path, not a file "
                                 f"of the folder: {next(f for f in names if Path(f).name != f or f in ('', '.', '..'))!r}")
        files = [path / f for f in names]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no {what} weights in {path} (no *.safetensors files)")
    for f in files:
        try:
            regular = stat.S_ISREG(os.stat(f).st_mode)
        except OSError as exc:
            raise ModelLoadError(f"{what} weights {f} cannot be read: {exc.strerror or exc}") from None
        if not regular:
            raise ModelLoadError(f"{what} weights {f} is not a regular file (a folder, device or pipe is not read)")
    return files


def read_checkpoint(path: Path, spec: Fp8Spec | int4.Int4Spec, dtype: torch.dtype, what: str,
                    keep: dict | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a local quantized checkpoint (FP8, or 4-bit pack-quantized), dequantized (dequantize_state;
    `keep`: its quantized weights kept), read one tensor at a time."""
    from safetensors import SafetensorError, safe_open

    where: dict[str, object] = {}
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in checkpoint_files(path, what)]
        for h in handles:
            where.update(dict.fromkeys(h.keys(), h))
        return dequantize_state(where, lambda name: where[name].get_tensor(name), spec, dtype, what, keep)
    except (OSError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot read {what} weights in {path}: {exc}") from None


def expandable_segments() -> bool:
    """Ask torch's CUDA allocator for expandable segments, unless PYTORCH_CUDA_ALLOC_CONF says otherwise (the user's
    choice stands); whether they are on. A 27B FP8 target and its drafter fill most of a 40 GB card, and with
    fixed-size segments the memory the runner's graphs need next is scattered over them: the first H200 run under a
    40 GB cap ran out with 4.94 GiB reserved but unused (docs/lab/NOTEBOOK.md section 13)."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if conf:
        return "expandable_segments:true" in conf.replace(" ", "").lower()
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    return True


def load_causal_lm(path: Path, spec: Fp8Spec | int4.Int4Spec, dtype: torch.dtype, keep_quantized: bool = False,
                   **kwargs) -> torch.nn.Module:
    """The target from a quantized checkpoint (FP8, or 4-bit pack-quantized): its config without the
    quantization entry (transformers builds plain Linear layers), the dequantized tensors as its state dict
    (transformers' own renaming applies, as for a bf16 checkpoint: model.language_model.* -> model.*), its generation
    config. Refused when a weight the model needs is not in the checkpoint (transformers would initialise it at
    random). `keep_quantized`: each converted Linear an Fp8Linear of the checkpoint's bytes and scales, or an
    int4.Int4Linear of its packed parts (`keep_linears`), the other tensors in `dtype`."""
    from transformers import AutoConfig, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    for part in (config, getattr(config, "text_config", None)):
        if part is not None and hasattr(part, "quantization_config"):
            delattr(part, "quantization_config")
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelLoadError(f"target {path}: transformers has no causal LM for config {type(config).__name__}")
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    if model_class.config_class == config.sub_configs.get("text_config"):  # as AutoModelForCausalLM does
        config = config.get_text_config()
    kept: dict | None = {} if keep_quantized else None
    state = read_checkpoint(path, spec, dtype, "target", kept)
    model, info = model_class.from_pretrained(None, config=config, state_dict=state, dtype=dtype,
                                              output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(f"target weights missing from {path}: {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
    del state  # (kept: each weight's stand-in, replaced by its kept module)
    if kept:
        keep_linears(model, kept, f"target {path}")
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    setattr(model, FORMAT_ATTR, spec.label(dtype, kept=keep_quantized))
    return model


# ------------------------------------------------------------------------------------------------------------
# FP8 weights kept: Fp8Linear, its function, its fused kind
# ------------------------------------------------------------------------------------------------------------


def _gemm_module():
    """engine/fp8_gemm.py (Triton at its top) where Triton imports, else None; imported once, on first use."""
    global _GEMM
    if _GEMM is None:
        try:
            from . import fp8_gemm as module
        except ImportError:
            module = False
        _GEMM = module
    return _GEMM or None


_GEMM = None


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """y = x (weight x scale per block)^T in x's dtype: the dequantized model's function (the weight's float32
    product rounded once to x's dtype, as a load in that dtype rounds it; on CUDA at one row not rounded, fp8_gemm's
    docstring). On CUDA the Triton GEMM reads the fp8 bytes and scales as stored (any number of rows: decode, tree
    verify, prefill); elsewhere (a CPU, no Triton) the weight is dequantized for this call and multiplied by
    F.linear (on a CPU bit for bit the model dequantized at load)."""
    gemm = _gemm_module() if x.is_cuda else None
    if gemm is not None and gemm.fits(block):
        return gemm.fp8_linear(x, weight, scale, block)
    return F.linear(x, dequantize(weight, scale, block).to(x.dtype))


def riding_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                  plain: torch.Tensor) -> torch.Tensor | None:
    """`linear`'s product and x plain^T (a plain weight of x's dtype) side by side in y, in one launch where the
    Triton GEMM's one-row kernel takes the plain rows (fp8_gemm.rides); None elsewhere (the caller runs the two)."""
    gemm = _gemm_module() if x.is_cuda and plain.dtype == x.dtype else None
    if gemm is None or not gemm.fits(block):
        return None
    K, N = x.shape[-1], weight.shape[0]
    if not gemm.rides(gemm.choose(x.numel() // K, N, K, x.device), N):
        return None
    return gemm.fp8_linear(x, weight, scale, block, plain=plain)


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

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, block={self.block}, fp8-e4m3"


def _maker(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> Callable:
    """What keep_linears calls for a kept FP8 weight: (device, bias) -> its Fp8Linear there."""
    return lambda device, bias: Fp8Linear(weight.to(device), scale.to(device), block, bias)


KEPT = (Fp8Linear, int4.Int4Linear)  # the Linears kept as a quantized checkpoint stores them (their own GEMMs)


@dataclass(frozen=True)
class FusedFp8Linear:
    """fused.FusedLinear's FP8 kind: several Fp8Linears of one input as one FP8 weight (their rows stacked, each part
    but the last a whole number of scale blocks tall) and its scale grid; y = x W^T split into their outputs."""

    weight: torch.Tensor  # [sum of out_features, in_features] float8_e4m3fn
    scale: torch.Tensor  # [ceil(rows / block[0]), ceil(in / block[1])] float32
    block: tuple[int, int]
    sizes: tuple[int, ...]
    STACKS: ClassVar[dict[str, str]] = {"weight": "weight", "scale": "weight_scale_inv"}  # field: the parts' attribute

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return linear(x, self.weight, self.scale, self.block).split(self.sizes, dim=-1)


def quantize_linears(model: nn.Module, block: tuple[int, int] = (128, 128), skip: Iterable[str] = NOT_CONVERTED) -> int:
    """Every Linear of `model` whose name has none of `skip` in it replaced by an Fp8Linear of its weight quantized
    as the official checkpoints are (`quantize`, on the weight's device), one at a time (the transient is one
    weight in float32). The bench's and the GPU tests' FP8 models. Returns how many."""
    return int4.replace_linears(model, skip, lambda weight, bias: Fp8Linear(*quantize(weight, block), block, bias))


def keep_linears(model: nn.Module, kept: Mapping[str, tuple[torch.Tensor, Callable]], what: str) -> int:
    """Each Linear of `model` loaded from a quantized checkpoint weight (kept: checkpoint name -> (the stand-in it
    was loaded with, int4.stand_in; a function (device, bias) -> its kept module), as dequantize_state makes it)
    replaced by that module: an Fp8Linear of the weight's bytes and scales, an int4.Int4Linear of its packed parts.
    The Linear is paired by the stand-in's storage (each its own), and the checkpoint name found through
    transformers' renaming (model.language_model.layers.0... -> model.layers.0...: the names that end as the
    Linear's does) must be that one. A quantized tensor loaded into something other than a Linear (an embedding) gets
    its dequantized values (float32 product, cast to its dtype), so no stand-in is left to compute zeros. Returns
    how many Linears were replaced; refused when a Linear named as a quantized weight was not loaded with its
    stand-in."""
    by_tail: dict[str, list[str]] = {}
    for name in kept:
        parts = name.split(".")
        for i in range(len(parts) - 1):
            by_tail.setdefault(".".join(parts[i:]), []).append(name)
    by_storage = {values.untyped_storage().data_ptr(): name for name, (values, _) in kept.items()}
    done = 0
    for module_name, module in list(model.named_modules()):
        if type(module) is not nn.Linear:
            continue
        w = module.weight.detach()
        named = by_tail.get(module_name + ".weight") or by_tail.get(module_name.split(".", 1)[-1] + ".weight") or []
        match = by_storage.get(w.untyped_storage().data_ptr())
        if match is None or (named and match not in named):
            if named:
                raise ModelLoadError(f"{what}: Linear {module_name} was not loaded with the quantized weight "
                                     f"{named[0]}")
            continue
        bias = None if module.bias is None else module.bias.detach()
        owner, attr = int4.owner_of(model, module_name)
        setattr(owner, attr, kept[match][1](w.device, bias))
        done += 1
    for name, p in list(model.named_parameters()):  # a quantized tensor that is no Linear's (an embedding): its values
        if int4.is_stand_in(p):
            key = by_storage.get(p.untyped_storage().data_ptr())
            if key is None:
                raise ModelLoadError(f"{what}: {name} holds a quantized weight's stand-in it cannot be paired with")
            owner, attr = int4.owner_of(model, name)
            setattr(owner, attr, nn.Parameter(kept[key][1](p.device, None).dequantized().to(p.dtype),
                                              requires_grad=False))
    return done

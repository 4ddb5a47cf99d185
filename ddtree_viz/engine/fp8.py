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
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch

from ..errors import ModelLoadError

SCALE_SUFFIX = "_scale_inv"  # weight -> weight_scale_inv
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value
FORMAT_ATTR = "_ddtree_weight_format"  # set on a target loaded here: its Fp8Spec.label (ModelPair.target_precision)


@dataclass(frozen=True)
class Fp8Spec:
    """What a checkpoint's quantization_config promises: the block every scale covers."""

    block: tuple[int, int]  # (rows, columns) of the weight each scale multiplies
    skip: tuple[str, ...] = ()  # modules_to_not_convert, as given (informational: the scales decide)

    def label(self, dtype: torch.dtype) -> str:
        """The precision as people read it, e.g. 'fp8-e4m3 block 128 (dequantized to float32)'."""
        bo, bi = self.block
        block = str(bo) if bo == bi else f"{bo}x{bi}"
        return f"fp8-e4m3 block {block} (dequantized to {str(dtype).removeprefix('torch.')})"


def spec_of(config: Mapping, what: str) -> Fp8Spec | None:
    """The FP8 spec of a config.json (a dict), None when it has no quantization_config; a ModelLoadError saying
    what is wrong for any quantization this reader does not know (another method, format, activation scheme or an
    unusable block size): transformers would otherwise take it down a path that is not the dequantized model's."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = f"{what} config quantization_config"
    if not isinstance(qc, Mapping):
        raise ModelLoadError(f"{where} must be a JSON object, not {qc!r}")
    method = qc.get("quant_method")
    if method != "fp8":
        raise ModelLoadError(f"{where}: quant_method {method!r} is not supported (only the FP8 layout, quant_method 'fp8', loads)")
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
    full = scale.float().repeat_interleave(block[0], 0)[:out].repeat_interleave(block[1], 1)[:, :inn]
    return weight.float() * full


def quantize(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale grid) as the official checkpoints are made: each block scaled so that its
    largest magnitude is FP8_MAX. For the tests' checkpoints and the bench's random FP8 weights."""
    out, inn = weight.shape
    rows, cols = grid(weight.shape, block)
    padded = torch.zeros(rows * block[0], cols * block[1], dtype=torch.float32)
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


def dequantize_state(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Fp8Spec,
                     dtype: torch.dtype, what: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as a plain state dict in `dtype`: each FP8 weight times its scales (float32, then
    cast), every other tensor cast as is. `get(name)` reads one tensor (lazily, so a 27B checkpoint is read one
    tensor at a time). Refused, naming the tensor: an FP8 weight without scales, scales without their weight,
    scales of the wrong shape or dtype."""
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
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and tensor.dim() == 2 and convert(name):
            out[name], out[name + SCALE_SUFFIX] = quantize(tensor, block)
        else:
            out[name] = tensor.detach().contiguous()
    return out


def config_entry(block: tuple[int, int] = (128, 128), skip: Iterable[str] = ()) -> dict:
    """The quantization_config the official checkpoints carry."""
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block), "modules_to_not_convert": list(skip)}


def checkpoint_files(path: Path, what: str) -> list[Path]:
    """A model directory's safetensors files: the index's shards, else every *.safetensors file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = [path / f for f in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{what} weight index {index} is unreadable: {exc!r}") from None
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no {what} weights in {path} (no *.safetensors files)")
    return files


def read_checkpoint(path: Path, spec: Fp8Spec, dtype: torch.dtype, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of a local FP8 checkpoint, dequantized (dequantize_state), read one tensor at a time."""
    from safetensors import SafetensorError, safe_open

    where: dict[str, object] = {}
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in checkpoint_files(path, what)]
        for h in handles:
            where.update(dict.fromkeys(h.keys(), h))
        return dequantize_state(where, lambda name: where[name].get_tensor(name), spec, dtype, what)
    except (OSError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot read {what} weights in {path}: {exc}") from None


def load_causal_lm(path: Path, spec: Fp8Spec, dtype: torch.dtype, **kwargs) -> torch.nn.Module:
    """The target from an FP8 checkpoint: its config without the quantization entry (transformers builds plain
    Linear layers), the dequantized tensors as its state dict (transformers' own renaming applies, as for a bf16
    checkpoint: model.language_model.* -> model.*), its generation config. Refused when a weight the model needs is
    not in the checkpoint (transformers would initialise it at random)."""
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
    state = read_checkpoint(path, spec, dtype, "target")
    model, info = model_class.from_pretrained(None, config=config, state_dict=state, dtype=dtype,
                                              output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(f"target weights missing from {path}: {', '.join(missing[:5])}"
                             f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    setattr(model, FORMAT_ATTR, spec.label(dtype))
    return model

"""Loading a quantized checkpoint, whatever its format: its files, its tensors read one at a time through the
format's `state` (registry.format_of), transformers' model built from its config without the quantization entry,
and the kept weights put in their Linears' places.

Why our own readers and not transformers' quantization integrations: on a machine without an FP8 GPU transformers
falls back to dequantizing FP8, but it derives the block from the scale grid (rows // grid rows), so a dimension
that is not a multiple of the block is dequantized with the wrong block silently; it does not say which tensor is
missing or mis-shaped; and its FP8Linear computes with FP8-quantized activations, which is not the function the
runner is held to. Here the weights are dequantized once at load, the product computed in float32 and only then
cast to the dtype asked for, or kept as stored in modules computing that same function (each format's module says
how); the model is built from its config without the quantization entry, so both engines meet Linear weights.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Callable, Mapping

import torch
from torch import nn

from ...errors import DDTreeVizError, ModelLoadError
from ...files import read_limited
from . import registry
from .base import Spec, is_stand_in, owner_of

FORMAT_ATTR = "_ddtree_weight_format"  # set on a target loaded here: its spec's label (ModelPair.target_precision)

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


def read_checkpoint(path: Path, spec: Spec, dtype: torch.dtype, what: str,
                    keep: dict | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a local quantized checkpoint, dequantized by its format's `state` (`keep`: its quantized
    weights kept), read one tensor at a time."""
    from safetensors import SafetensorError, safe_open

    where: dict[str, object] = {}
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in checkpoint_files(path, what)]
        for h in handles:
            where.update(dict.fromkeys(h.keys(), h))
        return registry.format_of(spec).state(where, lambda name: where[name].get_tensor(name), spec, dtype,
                                              what, keep)
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


def load_causal_lm(path: Path, spec: Spec, dtype: torch.dtype, keep_quantized: bool = False,
                   **kwargs) -> torch.nn.Module:
    """The target from a quantized checkpoint (any format of the registry but plain): its config without the
    quantization entry (transformers builds plain Linear layers), the dequantized tensors as its state dict
    (transformers' own renaming applies, as for a bf16 checkpoint: model.language_model.* -> model.*), its generation
    config. Refused when a weight the model needs is not in the checkpoint (transformers would initialise it at
    random). `keep_quantized`: each converted Linear its format's kept module (fp8.Fp8Linear of the checkpoint's
    bytes and scales, int4_common.Int4Linear of its packed parts: `keep_linears`), the other tensors in `dtype`."""
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


def keep_linears(model: nn.Module, kept: Mapping[str, tuple[torch.Tensor, Callable]], what: str) -> int:
    """Each Linear of `model` loaded from a quantized checkpoint weight (kept: checkpoint name -> (the stand-in it
    was loaded with, base.stand_in; a function (device, bias) -> its kept module), as a format's `state` makes it)
    replaced by that module: an Fp8Linear of the weight's bytes and scales, an Int4Linear of its packed parts.
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
        owner, attr = owner_of(model, module_name)
        setattr(owner, attr, kept[match][1](w.device, bias))
        done += 1
    for name, p in list(model.named_parameters()):  # a quantized tensor that is no Linear's (an embedding): its values
        if is_stand_in(p):
            key = by_storage.get(p.untyped_storage().data_ptr())
            if key is None:
                raise ModelLoadError(f"{what}: {name} holds a quantized weight's stand-in it cannot be paired with")
            owner, attr = owner_of(model, name)
            setattr(owner, attr, nn.Parameter(kept[key][1](p.device, None).dequantized().to(p.dtype),
                                              requires_grad=False))
    return done

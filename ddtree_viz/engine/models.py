"""Loading the target, its tokenizer and the DFlash drafter: embedded default, local directory or hub id.

Never `trust_remote_code`. The embedded default loads from assets/ with no network access at all.
"""

from __future__ import annotations

import json
import re
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..errors import InputError, ModelLoadError, PairingError
from ..words import plural
from ..options import DEVICES, DRAFT_WEIGHTS, HEAD_WEIGHTS
from .backends import kernels_follow_device
from .cache import layer_types
from .dflash2 import DFlash2Drafter, is_dflash2
from .drafter import DFlashDrafter, validate_pairing
from .weights import load as weight_load, registry as weights

# The embedded pair is the repository's top-level assets/, found from this file (not from the working directory):
# there in a checkout and in an editable install (`pip install -e .`); a wheel installed into site-packages has no
# assets/ beside the package (check_embedded says so).
ASSETS = Path(__file__).resolve().parents[2] / "assets"
EMBEDDED_TARGET = ASSETS / "tiny-qwen35-target"
EMBEDDED_DRAFT = ASSETS / "tiny-qwen35-dflash"
# `--draft NAME` beside the embedded target: its drafters by family (the DFlash one is the default)
EMBEDDED_DRAFTS = {"dflash": EMBEDDED_DRAFT, "dflash2": ASSETS / "tiny-qwen35-dflash2"}

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # options.DTYPES


def parse_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise InputError(f"unknown dtype {name!r}; choose one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def resolve_device(device: str) -> str:
    """'cpu', 'cuda' (one GPU), 'auto' (all visible GPUs through accelerate, else the CPU)."""
    if device not in DEVICES:
        raise InputError(f"unknown device {device!r}; choose cpu, cuda or auto")
    if device in ("cuda", "auto") and not torch.cuda.is_available():
        if device == "cuda":
            raise InputError("--device cuda was asked for, but no CUDA GPU is visible")
        return "cpu"
    return device


def _looks_local(name: str) -> bool:
    """Hub ids look like 'org/name'; anything path-like that does not exist is a missing directory."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def _check_local(name: str, what: str) -> Path | None:
    """A path that should be a local model directory: return it, or explain why it cannot be one."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{what} directory {path} has no config.json")
        return path
    if path.exists():
        raise ModelLoadError(f"{what} {path} is a file, not a model directory")
    if _looks_local(name):
        raise ModelLoadError(f"{what} directory not found: {path}")
    return None  # a hub id


# Checkpoint tensors a text-only load leaves on disk, by name prefix: the vision tower of a Qwen3.5/3.6
# `*ForConditionalGeneration` checkpoint (Qwen3.6-27B is one) and its multi-token-prediction head.
SKIPPED_PARTS = {"model.visual.": "vision tower", "mtp.": "MTP head"}


@dataclass(frozen=True)
class CheckpointInfo:
    """What a local checkpoint holds, read from config.json and the safetensors headers (no tensor is read)."""

    architectures: tuple[str, ...]
    parameters: int  # every weight in the checkpoint's safetensors files (quantized: weights.stored_parameters)
    parts: dict[str, int]  # SKIPPED_PARTS name -> parameters under that prefix


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from one safetensors file's header (8-byte length, then JSON)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= 100 << 20:
            raise ValueError(f"{path.name} has no safetensors header")
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def checkpoint_info(path: Path) -> CheckpointInfo | None:
    """The checkpoint's architecture and parameter counts (None when it has no readable safetensors files)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        shapes: dict[str, list[int]] = {}
        for f in sorted(path.glob("*.safetensors")):
            shapes.update(_safetensors_shapes(f))
        counts = {name: n for name, shape in shapes.items() if (n := weights.stored_parameters(name, shape, shapes))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not counts:
        return None
    parts = {label: sum(n for k, n in counts.items() if k.startswith(prefix)) for prefix, label in SKIPPED_PARTS.items()}
    archs = config.get("architectures") if isinstance(config, dict) else None
    return CheckpointInfo(tuple(a for a in archs or () if isinstance(a, str)), sum(counts.values()),
                          {k: v for k, v in parts.items() if v})


TIED_COPY = "_ddtree_tied_copy"  # set on a module that copies weights the model holds elsewhere (quantize_head)


def count_parameters(model: torch.nn.Module) -> int:
    """Parameters the loaded model holds (tied weights counted once, and so a tied lm_head's quantized copy,
    quantize_head's, not at all; a quantized weight kept as stored, out x in, not its bytes, words, scales and
    zero points)."""
    total = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if getattr(m, TIED_COPY, False):
            total -= sum(p.numel() for p in m.parameters(recurse=False))
        elif isinstance(m, weights.KEPT):
            total += m.out_features * m.in_features - sum(
                p.numel() for name, p in m.named_parameters(recurse=False) if name != "bias")
    return total


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _amount(n: int) -> str:
    return f"{n:,}" + (f" ({_billions(n)})" if n >= 1e6 else "")


@dataclass
class ModelPair:
    """The target (+ tokenizer) and its drafter, loaded once and shared by every session."""

    target: torch.nn.Module
    tokenizer: object
    drafter: DFlashDrafter | None
    target_name: str
    draft_name: str
    dtype: torch.dtype
    device: str
    checkpoint: CheckpointInfo | None = None  # the target's checkpoint on disk, when it is a local directory
    # each model's weight format when it is not plain `dtype`, e.g. "fp8-e4m3 block 128 (dequantized to float32)"
    target_format: str | None = None
    draft_format: str | None = None

    @property
    def target_precision(self) -> str:
        return self.target_format or str(self.dtype).removeprefix("torch.")

    @property
    def draft_precision(self) -> str:
        return self.draft_format or str(self.dtype).removeprefix("torch.")

    @property
    def target_parameters(self) -> int:
        """Parameters actually loaded for the target (a text-only load leaves a vision tower on disk)."""
        return count_parameters(self.target)

    def parameters_line(self) -> str:
        """How much of the target's checkpoint is in memory, e.g. 'target parameters loaded: 175,248 of the
        checkpoint's 294,000; not loaded: vision tower 118,752' (large counts also in millions / billions)."""
        loaded = self.target_parameters
        line = f"target parameters loaded: {_amount(loaded)}"
        ck = self.checkpoint
        if ck is not None and ck.parameters != loaded:
            skipped = ", ".join(f"{name} {_amount(n)}" for name, n in ck.parts.items())
            line += f" of the checkpoint's {_amount(ck.parameters)}" + (f"; not loaded: {skipped}" if skipped else "")
        return line

    @property
    def layer_types(self) -> list[str]:
        return layer_types(self.target.config)

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set()
        eos = getattr(self.target.config, "eos_token_id", None)
        # a chat model's generation_config names the end of its turn too (Qwen's <|im_end|> beside <|endoftext|>)
        generation = getattr(getattr(self.target, "generation_config", None), "eos_token_id", None)
        for value in (eos, generation, getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    @property
    def max_positions(self) -> int:
        cfg = self.target.config.get_text_config()
        return int(getattr(cfg, "max_position_embeddings", 1 << 20))

    def describe(self) -> str:
        precision = (f" | weights: target {self.target_precision}, drafter {self.draft_precision}"
                     if self.target_format or self.draft_format else "")
        return (f"target {self.target_name} ({_billions(self.target_parameters)} parameters) | drafter {self.draft_name} | "
                f"{str(self.dtype).removeprefix('torch.')} on {self.device}{precision}")


# sizes a model config must give as whole numbers >= 1 when it gives them (at the top level or in text_config)
CONFIG_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "linear_conv_kernel_dim",
                "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads")


def check_config(path: Path, what: str) -> dict:
    """A model directory's config.json, read before transformers builds anything from it: a JSON object whose sizes
    are whole numbers >= 1 (else transformers fails deep inside with a TypeError or a negative tensor size)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelLoadError(f"{what} config {path} is not a valid JSON file: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{what} config {path} must be a JSON object, not a {type(config).__name__}")
    for part, where in ((config, ""), (config.get("text_config"), "text_config.")):
        if not isinstance(part, dict):
            continue
        for key in CONFIG_SIZES:
            value = part.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ModelLoadError(f"{what} config {path}: {where}{key} must be a whole number >= 1, not {value!r}")
    return config


LAYER_NAME = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")  # a decoder layer's tensors


def check_layers_held(path: Path, config: dict, what: str) -> None:
    """A local checkpoint's config bounded by what its files hold, before a model of its size is built: every
    safetensors file regular (weights/load.py: checkpoint_files), and no more decoder layers in the config than the
    weights have (a config of 10^6 layers hung the load). Read from the files' headers only; a folder with no
    safetensors files is left to transformers."""
    if not (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()):
        return
    held = set()
    for f in weight_load.checkpoint_files(path, what):
        try:
            held.update(int(m.group(1)) for name in _safetensors_shapes(f) if (m := LAYER_NAME.match(name)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise ModelLoadError(f"cannot load {what}: its weights {f} have no readable safetensors header ({exc})") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = text.get("num_hidden_layers")
    if held and isinstance(layers, int) and layers > len(held):
        raise ModelLoadError(f"{what} config {path / 'config.json'} says {layers:,} decoder layers; its weights hold "
                             f"{len(held):,} (model.layers.*): the config of another model, or weights missing")


def misshaped_report(path: Path, limit: int = 5) -> str:
    """Which checkpoint tensors do not have the shape the config's model needs (the safetensors headers against the
    model built on the meta device): what transformers' "look at the above report" referred to, in its place."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, trust_remote_code=False))
        expected = {k: list(v.shape) for k, v in model.state_dict().items()}
        stored: dict[str, list[int]] = {}
        for f in weight_load.checkpoint_files(path, "target"):
            stored.update(_safetensors_shapes(f))
    except Exception as exc:  # noqa: BLE001 - the report is a courtesy: say what could not be compared
        return f"some weights do not fit the config (their shapes could not be compared: {type(exc).__name__})"
    renamed = {k.replace("model.language_model.", "model."): v for k, v in stored.items()}
    wrong = [f"{k} {renamed[k]} != {v}" for k, v in sorted(expected.items()) if k in renamed and renamed[k] != v]
    if not wrong:
        return "some weights do not fit the config (transformers found mismatched sizes)"
    more = f" ... ({len(wrong)} in all)" if len(wrong) > limit else ""
    return (f"{plural(len(wrong), 'weight')} {'does' if len(wrong) == 1 else 'do'} not have the config's shape: "
            f"{'; '.join(wrong[:limit])}{more} (checkpoint "
            "shape != the config's); the config.json of another model, or weights of another size")


def hub_offline() -> bool:
    """True when the hub must not be asked (HF_HUB_OFFLINE) or cannot be reached: no route to its endpoint within
    HUB_PROBE_S seconds, so a hub id fails in seconds, not after the hub client's retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_S):
            return False
    except OSError:
        return True


HUB_PROBE_S = 3.0


def _offline_hint(name: str, what: str) -> str:
    flag = "--target" if what == "target" else "--draft"
    why = "HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE") else "the hub cannot be reached (no network)"
    return (f"cannot load {what} {name!r}: {why} and it is not in the local hub cache; download it where there is a "
            f"network, then point at the directory: {flag} /path/to/model (a directory with config.json)")


def load_target(name: str, dtype: torch.dtype, device: str, *, offline: bool = False, keep_quantized: bool | None = None):
    """The target as a causal LM + its tokenizer. A quantized checkpoint keeps its weights as stored where
    `keep_quantized` says so, by default on one CUDA GPU (engine/weights/fp8.py's Fp8Linear: half of bf16's memory,
    the runner's FP8 GEMM; weights/int4_common.py's Int4Linear for a 4-bit one: a quarter, the 4-bit GEMM);
    elsewhere it is dequantized at load. A
    Qwen3.5/3.6 `*ForConditionalGeneration` checkpoint (text_config +
    vision_config, weights under model.language_model.*, a vision tower under model.visual.*, as Qwen3.6-27B is
    published) loads as its text model only: transformers' AutoModelForCausalLM maps model_type qwen3_5 to
    Qwen3_5ForCausalLM, renames model.language_model.* to model.* and never reads model.visual.* or mtp.* (their
    tensors stay on disk). tests/test_checkpoints.py holds it to that."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = _check_local(name, "target")
    hub_down = local is None and not offline and hub_offline()
    if local is None and not offline:
        local = _quantized_snapshot(name, hub_down)
    source = str(local) if local is not None else name
    spec = None
    if local is not None:
        config = check_config(local / "config.json", "target")
        check_layers_held(local, config, "target")  # before transformers builds a model of the config's size
        spec = weights.spec_of(config, "target")
    kwargs = dict(dtype=dtype, attn_implementation="sdpa", trust_remote_code=False)
    if offline or local is not None or hub_down:
        kwargs["local_files_only"] = True
    if device == "auto":
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, local_files_only=kwargs.get("local_files_only", False))
        if spec is not None:  # a quantized layout (FP8, 4-bit): read by us (engine/weights/load.py says why)
            keep = device == "cuda" if keep_quantized is None else keep_quantized
            if keep and device == "cuda":
                weight_load.expandable_segments()
            model = weight_load.load_causal_lm(local, spec, dtype, keep_quantized=keep,
                                       **{k: v for k, v in kwargs.items() if k in ("device_map", "attn_implementation")})
        else:
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        if hub_down:
            raise ModelLoadError(_offline_hint(name, "target")) from None
        raise ModelLoadError(f"cannot load target {name!r}: {exc}") from None
    except (TypeError, AttributeError, IndexError, RuntimeError) as exc:  # a config transformers cannot build from
        if "out of memory" in str(exc).lower():
            raise
        if "above report" in str(exc) and local is not None:  # transformers' report was a log we keep quiet: say it
            raise ModelLoadError(f"cannot load target {name!r}: {misshaped_report(local)}") from None
        raise ModelLoadError(f"cannot load target {name!r}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    if device != "auto":
        model.to(device)
    kernels_follow_device(model)  # transformers' kernel choice by the tensors' device (fla is CUDA-only)
    return model.eval(), tokenizer


def _quantized_snapshot(name: str, local_only: bool) -> Path | None:
    """A hub id whose config.json has a quantization_config (the FP8 layout): its snapshot (configs, tokenizer,
    safetensors) as a local directory, so that engine/weights/ reads it (transformers' own FP8 loading is not the
    dequantized model: weights/load.py says why). None for any other hub id, or when its config cannot be had (transformers'
    own load then says why)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    try:
        config = json.loads(Path(hf_hub_download(name, "config.json", local_files_only=local_only)).read_text("utf-8"))
    except Exception:  # noqa: BLE001 - no config here: the ordinary path reports the failure in its own words
        return None
    if not isinstance(config, dict) or config.get("quantization_config") is None:
        return None
    try:
        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"],
                                      local_files_only=local_only))
    except Exception as exc:  # noqa: BLE001 - any hub failure is a load failure for the user
        raise ModelLoadError(_offline_hint(name, "target") if local_only else f"cannot fetch target {name!r}: {exc}") from None


def load_drafter(name: str, dtype: torch.dtype, device, keep_quantized: bool | None = None) -> DFlashDrafter:
    """The drafter of a folder or hub id; a quantized checkpoint keeps its weights as stored where `keep_quantized`
    says so, by default on a CUDA device (as load_target's)."""
    local = _check_local(name, "drafter")
    if local is None:  # hub id: fetch config + safetensors only
        hub_down = hub_offline()
        try:
            from huggingface_hub import snapshot_download

            local = Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"], local_files_only=hub_down))
        except Exception as exc:  # noqa: BLE001 - any hub failure is a load failure for the user
            if hub_down:
                raise ModelLoadError(_offline_hint(name, "drafter")) from None
            raise ModelLoadError(f"cannot fetch drafter {name!r}: {exc}") from None
    keep = torch.device(device).type == "cuda" if keep_quantized is None else keep_quantized
    return drafter_class(local).from_pretrained(local, dtype=dtype, device=device, keep_quantized=keep).eval()


def drafter_class(path: Path) -> type[DFlashDrafter]:
    """The drafter family a checkpoint's config.json names (`architectures`): DFlash2DraftModel is DFlash2, anything
    else DFlash (whose loader says what is wrong with a config it cannot read)."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return DFlashDrafter
    return DFlash2Drafter if is_dflash2(config) else DFlashDrafter


def embedded_draft(draft: str | None) -> str:
    """The drafter beside the embedded target: None -> the embedded DFlash drafter; a family name of EMBEDDED_DRAFTS
    ('dflash', 'dflash2') -> that embedded drafter; anything else (a folder, a hub id) as given."""
    if draft is None:
        return str(EMBEDDED_DRAFT)
    return str(EMBEDDED_DRAFTS[draft]) if draft in EMBEDDED_DRAFTS else draft


def check_embedded(draft: str | None = None) -> None:
    """A clear error when the embedded target, or the embedded drafter `draft` names (embedded_draft), is not on
    disk (a non-editable install has no assets/)."""
    named = draft is None or draft in EMBEDDED_DRAFTS
    for path in (EMBEDDED_TARGET, Path(embedded_draft(draft))) if named else (EMBEDDED_TARGET,):
        if not path.is_dir():
            raise ModelLoadError(
                f"the embedded default model is not installed ({path} is missing; it is the repository's assets/ "
                "folder, there in a checkout or after `pip install -e .`); pass --target DIR|HUB_ID --draft DIR|HUB_ID"
            )


def quiet_transformers(verbose: bool = False) -> None:
    """transformers' log messages and progress bars off (a command's own output stays readable), unless `verbose`."""
    if verbose:
        return
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def check_draft_weights(weights: str | None) -> str | None:
    return _check_weights("--draft-weights", weights, DRAFT_WEIGHTS)


def check_head_weights(weights: str | None) -> str | None:
    return _check_weights("--head-weights", weights, HEAD_WEIGHTS)


def _check_weights(flag: str, weights: str | None, allowed: tuple[str, ...]) -> str | None:
    if weights is not None and weights not in allowed:
        raise InputError(f"{flag} must be one of {', '.join(allowed)}, not {weights!r}")
    return weights


def quantize_drafter(drafter: torch.nn.Module, weights: str | None, dtype: torch.dtype) -> None:
    """`weights` "int4": every Linear of a plain drafter replaced by a symmetric 4-bit one, groups of 128, made from
    its weights here (int4_common.quantize_linears), in place; None: as loaded. The drafter only proposes: DDTree's
    output is the target's whatever it drafts (its acceptance may fall), so a 24 GB card can hold the 27B's DFlash
    drafter in 0.83 GiB instead of 3.22. On CUDA the products read the 4-bit words (the Triton GEMM); elsewhere
    through the reference product."""
    if check_draft_weights(weights) is None:
        return
    if getattr(drafter, "weight_format", None):
        raise InputError(f"--draft-weights {weights} quantizes a drafter of plain weights; this one is stored as "
                         f"{drafter.weight_format}")
    from .weights import int4_common as int4
    from .weights.at_load import INT4_SPEC as spec

    int4.quantize_linears(drafter, spec)
    name = str(dtype).removeprefix("torch.")
    drafter.weight_format = f"{spec.scheme} (quantized at load; 4-bit weights, {name} activations)"


def quantize_head(model: torch.nn.Module, weights: str | None, dtype: torch.dtype) -> None:
    """`weights` "int4" (symmetric, groups of 128: the drafter's) or "fp8" (e4m3, 128 x 128 block scales: the
    official FP8 layout's): the target's lm_head replaced by one kept quantized, made from its weights here a slice
    of rows at a time (weights/at_load.py); None: as loaded. The target's function changes (its logits are the
    quantized head's), so greedy decoding and DDTree change together and stay equal; how far the new greedy output
    is from the old one is the precision audit's to say (analyze --head-weights-b). The 27B's bf16 lm_head is
    2.37 GiB; 4-bit it is 0.61 GiB, FP8 1.18 GiB. A head that shares the embedding's weights (tied) becomes a copy
    beside it: no memory saved, which its label says."""
    if check_head_weights(weights) is None:
        return
    from .weights import at_load

    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise InputError(f"--head-weights {weights} quantizes a plain lm_head; this target's is {type(head).__name__}")
    if hasattr(head, "_hf_hook"):
        raise InputError(f"--head-weights {weights} needs the target on one device (--device cpu or cuda), not "
                         "dispatched by a device_map")
    tied = head.weight is getattr(model.get_input_embeddings(), "weight", None)
    bias = None if head.bias is None else head.bias.detach()
    quantized, label = at_load.quantized_linear(head.weight.detach(), bias, weights)
    model.set_output_embeddings(quantized)
    setattr(quantized, TIED_COPY, tied)  # the embedding's weights again: not counted twice (count_parameters)
    note = f"lm_head {label} (quantized at load{'; tied: a copy beside the embedding' if tied else ''})"
    name = str(dtype).removeprefix("torch.")
    setattr(model, weight_load.FORMAT_ATTR, f"{getattr(model, weight_load.FORMAT_ATTR, None) or name}; {note}")


def load_pair(target: str | None = None, draft: str | None = None, *, dtype: str = "float32", device: str = "cpu",
              keep_quantized: bool | None = None, draft_weights: str | None = None,
              head_weights: str | None = None) -> ModelPair:
    """Load target + tokenizer + drafter and check that they fit together (`keep_quantized`: load_target's and
    load_drafter's, each an FP8 checkpoint's; `draft_weights`: quantize_drafter's; `head_weights`:
    quantize_head's)."""
    torch_dtype = parse_dtype(dtype)
    device = resolve_device(device)
    embedded = target is None
    if target is None:
        check_embedded(draft)
        target = str(EMBEDDED_TARGET)
        draft = embedded_draft(draft)
    if draft is None:
        raise InputError("a custom --target needs its drafter too: pass --draft DIR|HUB_ID")
    check_draft_weights(draft_weights)  # before the load, not after it
    check_head_weights(head_weights)
    model, tokenizer = load_target(target, torch_dtype, device, offline=embedded, keep_quantized=keep_quantized)
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer when the directory has no tokenizer files
        raise ModelLoadError(f"target {target!r} has no usable tokenizer (no tokenizer files found beside its config.json)")
    drafter = load_drafter(draft, torch_dtype, model.get_input_embeddings().weight.device, keep_quantized=keep_quantized)
    validate_pairing(drafter.config, model.config)
    quantize_drafter(drafter, draft_weights, torch_dtype)
    quantize_head(model, head_weights, torch_dtype)
    local = Path(target).expanduser()
    info = checkpoint_info(local) if local.is_dir() else None
    return ModelPair(model, tokenizer, drafter, _display(target), _display(draft), torch_dtype, device, info,
                     getattr(model, weight_load.FORMAT_ATTR, None), getattr(drafter, "weight_format", None))


def _display(name: str) -> str:
    path = Path(name)
    try:
        return str(path.resolve().relative_to(ASSETS.parent))
    except ValueError:
        return name


__all__ = ["ModelPair", "load_pair", "quantize_drafter", "quantize_head", "DRAFT_WEIGHTS", "HEAD_WEIGHTS", "quiet_transformers", "load_target", "load_drafter", "parse_dtype", "resolve_device",
           "PairingError"]

"""Random real-shape models, built fast on the device: the Qwen3.6-27B text target (layers materialised and initialised
in place; split over GPUs as device_map="auto" would; or with FP8 / 4-bit weights made layer by layer), the DFlash
or DFlash2 drafter of the shipped configs, the pair the engine takes, the report's head (sizes, copy bandwidth, the
weight-read bound: measured_models) and each GEMM of a layer as the runner runs it (layer_gemms)."""

from __future__ import annotations

import json

import torch

from ...configs import CONFIGS
from .config import FP8_BLOCK, INT4_GROUP, SMOKE_DRAFT, SMOKE_TARGET, BenchConfig
from ..harness import clock, timer
from .harness import copy_bandwidth


def target_config(bench: BenchConfig, layers: int | None = None):
    from transformers import Qwen3_5TextConfig

    raw = json.loads((CONFIGS / "qwen3.6-27b-text-config.json").read_text())
    raw = {k: v for k, v in raw.items() if not k.startswith("_") and k not in ("model_type", "architectures")}
    if layers is not None:
        raw["num_hidden_layers"] = layers
    if bench.smoke:
        raw.update(SMOKE_TARGET)
        raw["rope_parameters"] = {**raw["rope_parameters"], "mrope_section": [2, 1, 1]}
    cfg = Qwen3_5TextConfig(**raw)
    cfg._attn_implementation = "sdpa"
    return cfg


@torch.no_grad()
def random_init_(model: torch.nn.Module, seed: int = 0, prefix: str = "") -> None:
    """Initialise weights in place on the GPU: normal(0, 0.02) matrices, identity-like norms, GDN decay params
    (`prefix`: only the parameters whose names start with it). On the meta device (the memory plan) there is
    nothing to initialise."""
    gens: dict = {}
    for name, p in model.named_parameters():
        if not name.startswith(prefix) or p.is_meta:
            continue
        if p.device not in gens:
            gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
        gen = gens[p.device]
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.empty_like(p, dtype=torch.float32).uniform_(1, 16, generator=gen)))
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        elif "norm" in name:
            # Qwen3.5 RMSNorm scales by (1 + w): zeros; gated norm / drafter norms scale by w: ones
            p.fill_(0.0 if p.ndim == 1 and _zero_centred(model, name) else 1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)


def _zero_centred(model, name: str) -> bool:
    module = model.get_submodule(name.rsplit(".", 1)[0])
    return type(module).__name__ in ("Qwen3_5RMSNorm", "Qwen3_5TextRMSNorm")


def build_target(bench: BenchConfig, layers: int | None, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    device = bench.device
    cfg = target_config(bench, layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if bench.split:
        return _build_split(bench, model, cfg)
    model = model.to_empty(device=device)
    random_init_(model)
    model.model.rotary_emb = Qwen3_5TextRotaryEmbedding(cfg).to(device)  # buffers were left empty by to_empty
    return model.eval()


@torch.no_grad()
def build_quantized_target(bench: BenchConfig, layers: int | None, dtype: torch.dtype, weights: str = "fp8",
                           trail: dict | None = None):
    """build_target's model with quantized weights made at random (`weights`: "fp8" or "int4"): each decoder layer
    materialised on the device, initialised as build_target does and its Linears quantized (fp8.quantize_linears:
    e4m3 bytes + float32 scales in 128 x 128 blocks; int4.quantize_linears: 4-bit words + bf16 scales in groups of
    128; the official FP8 layout's bf16 modules left as they are in both) before the next, so the build's peak is
    the quantized model plus one layer in `dtype`, never the bf16 model. `trail` gets the GiB allocated after the
    layers and after each of the embedding, norm and lm_head (where a build's memory goes)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from ...engine.weights import fp8, int4_common as int4

    cfg = target_config(bench, layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    for i, layer in enumerate(model.model.layers):
        layer.to_empty(device=bench.device)
        random_init_(model, seed=i, prefix=f"model.layers.{i}.")
        if weights == "fp8":
            fp8.quantize_linears(layer, FP8_BLOCK)
        else:
            int4.quantize_linears(layer, int4.Int4Spec(INT4_GROUP, True), skip=fp8.NOT_CONVERTED)
    if trail is not None and bench.cuda:
        trail["layers"] = torch.cuda.memory_allocated() / 2**30
    for name, part in (("embed_tokens", model.model.embed_tokens), ("norm", model.model.norm),
                       ("lm_head", model.lm_head)):
        part.to_empty(device=bench.device)
        if trail is not None and bench.cuda:
            trail[name] = torch.cuda.memory_allocated() / 2**30
    random_init_(model, seed=len(model.model.layers), prefix="model.embed_tokens.")
    random_init_(model, seed=len(model.model.layers) + 1, prefix="model.norm.")
    random_init_(model, seed=len(model.model.layers) + 2, prefix="lm_head.")
    if bench.head_weights:  # (the bf16 head is made first: a user's is loaded, then quantized)
        from ...engine.models import quantize_head

        quantize_head(model, bench.head_weights, dtype)
        if trail is not None and bench.cuda:
            trail[f"lm_head_{bench.head_weights}"] = torch.cuda.memory_allocated() / 2**30
    model.model.rotary_emb = Qwen3_5TextRotaryEmbedding(cfg).to(bench.device)
    assert bench.device == "meta" or not any(t.is_meta for t in (*model.parameters(), *model.buffers())), \
        "a part left unmaterialised"
    return model.eval()


def split_map(bench: BenchConfig, model) -> dict[str, str | int]:
    """What `from_pretrained(device_map="auto")` computes: modules balanced over the visible GPUs, decoder
    layers never split. --smoke (CPU): the same dispatch over two halves, both on the CPU."""
    no_split = model._no_split_modules
    if bench.cuda:
        from accelerate.utils import get_balanced_memory, infer_auto_device_map

        max_memory = get_balanced_memory(model, no_split_module_classes=no_split)
        return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)
    n = model.config.num_hidden_layers
    layers = {f"model.layers.{i}": "cpu" for i in range(n)}
    return {"model.embed_tokens": "cpu", **layers, "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def _build_split(bench: BenchConfig, model, cfg):
    """Materialise each module of the device map on its device, initialise, then dispatch with accelerate's
    hooks (which move activations to each layer's device, as in a device_map="auto" load)."""
    from accelerate import dispatch_model
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    device_map = split_map(bench, model)
    for name, dev in device_map.items():
        (model.get_submodule(name) if name else model).to_empty(device=dev)
    random_init_(model)
    rotary_dev = next((d for n, d in device_map.items() if n in ("", "model", "model.rotary_emb")), None)
    if rotary_dev is None:
        rotary_dev = device_map.get("model.embed_tokens", 0)
    model.model.rotary_emb = Qwen3_5TextRotaryEmbedding(cfg).to(_torch_device(rotary_dev))
    return dispatch_model(model.eval(), device_map=device_map)


def _torch_device(dev) -> torch.device:
    return torch.device(f"cuda:{dev}") if isinstance(dev, int) else torch.device(dev)


def layer_devices(model) -> dict[str, list[int]]:
    """Decoder layer indices per device (for the report)."""
    out: dict[str, list[int]] = {}
    for i, layer in enumerate(model.model.layers):
        out.setdefault(str(next(layer.parameters()).device), []).append(i)
    return out


DFLASH_CONFIG = "qwen3.6-27b-dflash-config.json"  # DFlash 1 for Qwen3.6-27B


DFLASH2_CONFIG = "qwen3.8-27b-dflash2-config.json"  # DFlash2 for Qwen3.8-27B (the target has Qwen3.6-27B's text shapes)


def build_drafter(bench: BenchConfig, target, dtype: torch.dtype, config: str = DFLASH_CONFIG):
    """A drafter of the shipped config's shapes (its family from its `architectures`) with random weights; a
    DFlash2 drafter's convolutions start near the identity (offset 0's base tap 1), as the signal would pass."""
    from ...engine.dflash2 import DFlash2Drafter, is_dflash2
    from ...engine.drafter import DFlashDrafter, build_target_layer_ids

    device = target.get_input_embeddings().weight.device if bench.split else bench.device  # split: first GPU
    raw = json.loads((CONFIGS / config).read_text())
    n = target.config.num_hidden_layers
    raw["num_target_layers"] = n
    raw["dflash_config"]["target_layer_ids"] = build_target_layer_ids(n, raw["num_hidden_layers"])
    if bench.smoke:
        raw.update(SMOKE_DRAFT)
        raw["dflash_config"]["mask_token_id"] = SMOKE_DRAFT["vocab_size"] - 1
    cls = DFlash2Drafter if is_dflash2(raw) else DFlashDrafter
    drafter = cls.from_config_meta(cls.config_class.from_dict(raw)).to_empty(device=device).to(dtype)
    random_init_(drafter, seed=1)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("conv.base_kernel"):
                p[:, 0] += 1.0
    return drafter.eval()


def pair_of(bench: BenchConfig, target, drafter, dtype):
    from ...engine.models import ModelPair

    class _Ids:  # the bench feeds token ids (or text as its bytes, for the page: --ui); decoding shows ids
        eos_token_id = None

        def __call__(self, text, **_):
            return {"input_ids": list(text.encode("utf-8"))}

        def decode(self, ids, **_):
            return " ".join(f"<{i}>" for i in ids)

    return ModelPair(target, _Ids(), drafter, "Qwen3.6-27B shapes (random weights)", "DFlash shapes (random weights)",
                     dtype, "auto" if bench.split else bench.device)


def measured_models(bench: BenchConfig, layers: int, dtype: torch.dtype):
    """The target and drafter built (peak memory counted from here), a wait for their devices, and the report's head:
    sizes, the copy bandwidth of the first device and the weight-read bound it gives. (target, drafter, sync, out)."""
    from ...engine.verify import device_sync

    if bench.cuda:
        for d in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(d)
    t0 = clock()
    target = build_target(bench, layers, dtype)
    drafter = build_drafter(bench, target, dtype)
    build_s = clock() - t0
    sync = device_sync(target, drafter)
    first = target.get_input_embeddings().weight.device
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    bw = copy_bandwidth(timer(sync), first, 4.0 if not bench.smoke else 0.25)
    out: dict = {"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weight_bytes": weight_bytes,
                 "copy_bandwidth_TBps": bw / 1e12, "weight_read_bound_ms": weight_bytes / bw * 1e3, "build_s": build_s}
    return target, drafter, sync, out


def layer_gemms(target, fused_kind) -> dict[str, object]:
    """Each GEMM of a layer as the runner runs it: the runs of `fused_kind` (fp8.FusedFp8Linear,
    int4.FusedInt4Linear) in the fused groups of layer 0 (GDN in_proj, MLP gate + up) and of the first attention
    layer (q + k + v), and their single projections (out_proj, o_proj, down_proj: the modules)."""
    from ...engine.fused import ATTENTION_PROJECTIONS, GDN_PROJECTIONS, MLP_PROJECTIONS, fuse_linears
    from ...engine.verify import gdn_modules

    layers = target.model.layers
    attn = next(i for i in range(len(layers)) if i not in set(gdn_modules(target)))
    out: dict[str, object] = {}
    for name, (owner, names) in {"gdn_in_proj": (layers[0].linear_attn, GDN_PROJECTIONS),
                                 "attention_qkv": (layers[attn].self_attn, ATTENTION_PROJECTIONS),
                                 "mlp_gate_up": (layers[0].mlp, MLP_PROJECTIONS)}.items():
        fused = fuse_linears(owner, names)  # the runner's (already made: fusing is idempotent)
        out[name] = next(r for r in getattr(fused, "runs", (fused,)) if isinstance(r, fused_kind))
    out.update(gdn_out_proj=layers[0].linear_attn.out_proj, attention_o_proj=layers[attn].self_attn.o_proj,
               mlp_down=layers[0].mlp.down_proj)
    return out

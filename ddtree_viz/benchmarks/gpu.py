"""Real-shape measurements on a GPU: Qwen3.6-27B text shapes (and its DFlash drafter) with random weights.

    python -m ddtree_viz.benchmarks.gpu [--layers 64] [--dtype bfloat16] [--budgets 16 32 64 128] [--json OUT]
    python -m ddtree_viz.benchmarks.gpu --exactness          # fp32 at real widths (8 layers) + bf16 at full depth
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --exactness --json gpu.json   # issue #18: the runner only,
                                                        # its figures against their targets (speed.fast.targets)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --budgets 64 128 --variants compile   # the runner compiled
                                                        # and eager side by side, compile_s (~70 s on an H200)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --dflash2 --budgets 64 --variants --json gpu.json
                                                        # issue #28 item 7: the DFlash2 drafter (Qwen3.8-27B's shapes)
                                                        # beside DFlash 1 on the runner (speed.fast.dflash2, targets)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --fp8 --budgets 64 --variants --json gpu.json
                                                        # issue #29 items 2 and 5: the same shapes with FP8 weights
                                                        # made at random on the runner beside bf16, its bound, its
                                                        # peak memory at a 4,096-token context under a 40 GB cap
                                                        # (speed.fast.fp8, targets fp8_*)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --fp8 --int4 --budgets 64 128 --json gpu.json
                                                        # and 4-bit weights (W4A16, groups of 128) after them: its own
                                                        # bound, peak under a 24 GB cap (speed.fast.int4, int4_*)

Every time is the median of repeated CUDA-synchronised runs, reported in ms and as a ratio to the
weight-read bound (weight bytes / measured copy bandwidth) and to the greedy decode step.
Weights are random (no download is possible here): speed is what random weights measure; exactness
uses the oracle drafter so that deep trees and long accepted paths occur.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import itertools
import json
import math
import random
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..configs import CONFIGS


# ------------------------------------------------------------------------------------------------------------
# Building random real-shape models fast
# ------------------------------------------------------------------------------------------------------------


# --smoke: the same code path at toy widths, to check the script on a CPU before spending GPU time
SMOKE_TARGET = dict(hidden_size=128, intermediate_size=256, vocab_size=1024, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
                    linear_value_head_dim=16)
SMOKE_DRAFT = dict(hidden_size=128, intermediate_size=256, vocab_size=1024, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32)


# RunnerOptions' fields, every one (BenchConfig holds each; runner_variants can switch each)
VARIANT_FIELDS = ("gdn_kernel", "fused", "attention", "compile", "blas", "gate_up", "gdn_step", "commit", "gdn_prep",
                  "norm", "pdl")


@dataclass(frozen=True)
class BenchConfig:
    """How this run builds and measures, from the command line (``main``); passed to what depends on it."""

    smoke: bool = False  # --smoke: toy widths (SMOKE_TARGET / SMOKE_DRAFT) on the CPU
    device: str = "cuda"  # "cpu" with --smoke
    split: bool = False  # --device-map auto: the target's layers spread over every visible GPU, as from_pretrained does
    fast: bool = False  # --fast: also measure the static runner (engine/runner.py)
    fast_only: bool = False  # --fast-only: of transformers' forward only the bound, prefill and greedy step
    gdn_kernel: str = "auto"  # the runner's options (RunnerOptions): --gdn-kernel, --no-fused, --attention, --no-compile
    fused: bool | None = None
    attention: str = "eager"
    compile: bool | None = None
    blas: str = "auto"
    gate_up: str = "auto"  # --gate-up: the MLP's gate+up GEMM form (RunnerOptions.gate_up)
    gdn_step: str = "auto"  # --gdn-step: the one-node pass's GDN core (RunnerOptions.gdn_step)
    commit: str = "auto"  # --commit: the commit's recurrent-state update (RunnerOptions.commit)
    gdn_prep: str = "auto"  # --gdn-prep: a tree's GDN conv, l2 norms and gates (RunnerOptions.gdn_prep)
    norm: str = "auto"  # --norm: a layer's residual add and the norm after it (RunnerOptions.norm)
    pdl: str = "auto"  # --pdl: programmatic dependent launch of the one-row FP8 products and add + norms (.pdl)
    variants: tuple[str, ...] = VARIANT_FIELDS  # --variants: the options runner_variants switches, one at a time
    dflash2: bool = False  # --dflash2: with --fast, the DFlash2 drafter beside DFlash 1 (dflash2_speed)
    fp8: bool = False  # --fp8: with --fast, the target with FP8 weights made at random beside bf16 (quantized_speed)
    fp8_cap_gb: float = 40.0  # --fp8-memory-cap: the process's GPU memory cap (GB, 1e9 bytes) while the FP8 target runs
    fp8_context: int = 4096  # --fp8-context: the prompt length of the quantized targets' peak-memory session
    int4: bool = False  # --int4: with --fast, the target with 4-bit weights made at random beside bf16 (quantized_speed)
    int4_cap_gb: float = 24.0  # --int4-memory-cap: the GPU memory cap (GB) while the 4-bit target runs (a 24 GB card)
    int4_drafter: bool = False  # --int4-drafter: with --quantized-only, the drafter's Linears 4-bit too (a 24 GB card)
    tree_forms: bool = False  # --tree-forms: with --fast, the tree delta rule's forms and tiles swept (tree_forms)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> BenchConfig:
        return cls(smoke=a.smoke, device="cpu" if a.smoke else "cuda", split=a.device_map == "auto", fast=a.fast,
                   fast_only=a.fast_only, gdn_kernel=a.gdn_kernel, fused=False if a.no_fused else None,
                   attention=a.attention, compile=False if a.no_compile else None, blas=a.blas,
                   gate_up=a.gate_up, gdn_step=a.gdn_step, commit=a.commit,
                   gdn_prep=a.gdn_prep, norm=a.norm, pdl=a.pdl, variants=tuple(a.variants),
                   dflash2=a.dflash2, fp8=a.fp8, tree_forms=a.tree_forms, int4=a.int4, int4_drafter=a.int4_drafter, int4_cap_gb=a.int4_memory_cap,
                   fp8_cap_gb=a.fp8_memory_cap, fp8_context=a.fp8_context if not a.smoke else min(a.fp8_context, 256))

    @property
    def quantized(self) -> tuple[str, ...]:
        """The quantized weight formats asked for (QUANTIZED: --fp8, --int4), each measured beside bf16."""
        return tuple(w for w in QUANTIZED if getattr(self, w))

    def cap_gb(self, weights: str) -> float:
        return self.fp8_cap_gb if weights == "fp8" else self.int4_cap_gb

    def runner_options(self):
        from ..engine.runner import RunnerOptions

        return RunnerOptions(**{name: getattr(self, name) for name in VARIANT_FIELDS})  # every RunnerOptions field

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


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
    (`prefix`: only the parameters whose names start with it)."""
    gens: dict = {}
    for name, p in model.named_parameters():
        if not name.startswith(prefix):
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


FP8_BLOCK = (128, 128)  # the official checkpoints' weight_block_size
INT4_GROUP = 128  # llm-compressor's W4A16 preset: symmetric 4-bit integers, a bf16 scale per 128 columns of a row
QUANTIZED = ("fp8", "int4")  # the weight formats made at random beside bf16 (BenchConfig fields of these names)
FORMAT_NAMES = {"fp8": "FP8", "int4": "4-bit"}


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

    from ..engine.weights import fp8, int4_common as int4

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
    model.model.rotary_emb = Qwen3_5TextRotaryEmbedding(cfg).to(bench.device)
    assert not any(t.is_meta for t in (*model.parameters(), *model.buffers())), "a part left unmaterialised"
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
    from ..engine.dflash2 import DFlash2Drafter, is_dflash2
    from ..engine.drafter import DFlashDrafter, build_target_layer_ids

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
    from ..engine.models import ModelPair

    class _Ids:  # the bench feeds token ids (or text as its bytes, for the page: --ui); decoding shows ids
        eos_token_id = None

        def __call__(self, text, **_):
            return {"input_ids": list(text.encode("utf-8"))}

        def decode(self, ids, **_):
            return " ".join(f"<{i}>" for i in ids)

    return ModelPair(target, _Ids(), drafter, "Qwen3.6-27B shapes (random weights)", "DFlash shapes (random weights)",
                     dtype, "auto" if bench.split else bench.device)


# ------------------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------------------


def timer(sync):
    """``timed(fn, repeats=10, warmup=2)``: the median milliseconds of fn(), each run waited for with ``sync``
    (``engine.verify.device_sync`` of the measured models: every CUDA device their weights live on)."""

    def timed(fn, repeats: int = 10, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return timed


def copy_bandwidth(timed, device, gib: float = 4.0) -> float:
    """Bytes read + written per second by a copy on ``device`` (one that ``timed`` waits for)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), repeats=10)
    return 2 * n * 2 / (ms / 1e3)


# ------------------------------------------------------------------------------------------------------------
# The measurements
# ------------------------------------------------------------------------------------------------------------


def measured_models(bench: BenchConfig, layers: int, dtype: torch.dtype):
    """The target and drafter built (peak memory counted from here), a wait for their devices, and the report's head:
    sizes, the copy bandwidth of the first device and the weight-read bound it gives. (target, drafter, sync, out)."""
    from ..engine.verify import device_sync

    if bench.cuda:
        for d in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(d)
    t0 = time.perf_counter()
    target = build_target(bench, layers, dtype)
    drafter = build_drafter(bench, target, dtype)
    build_s = time.perf_counter() - t0
    sync = device_sync(target, drafter)
    first = target.get_input_embeddings().weight.device
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    bw = copy_bandwidth(timer(sync), first, 4.0 if not bench.smoke else 0.25)
    out: dict = {"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weight_bytes": weight_bytes,
                 "copy_bandwidth_TBps": bw / 1e12, "weight_read_bound_ms": weight_bytes / bw * 1e3, "build_s": build_s}
    return target, drafter, sync, out


@torch.no_grad()
def speed(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], prompt_len: int = 512) -> dict:
    """transformers' forward at these shapes: the bound, prefill, greedy step, the drafter, each budget's exact and
    naive verify, the DFlash chain, whole rounds; with --fast the static runner too (`fast_speed`)."""
    from ..engine.cache import new_cache
    from ..engine.drafter import extract_context_features
    from ..engine.session import DFlashProposer
    from ..engine.tree import DraftTree
    from ..engine.verify import EXACT, verify_tree

    target, drafter, sync, out = measured_models(bench, layers, dtype)
    timed, bound_ms = timer(sync), out["weight_read_bound_ms"]
    if bench.split:
        out["layer_devices"] = layer_devices(target)
    first = target.get_input_embeddings().weight.device
    prompt = torch.randint(0, target.config.vocab_size, (1, prompt_len), device=first)
    base = new_cache(target)
    start = time.perf_counter()
    prefill = target(input_ids=prompt, cache=base, use_cache=True, output_hidden_states=True, logits_to_keep=1)
    sync()
    out["prefill_ms"] = (time.perf_counter() - start) * 1e3
    out["prefill_kernels"] = prefill_kernels()

    # greedy decode step (transformers' own one-token forward)
    cache = copy.deepcopy(base)
    token = prefill.logits[:, -1:].argmax(-1)
    out["greedy_step_ms"] = timed(lambda: target(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1))

    # drafter pass (block 16, context = the prompt's features): the dynamic drafter's first pass of a prompt
    proposer = DFlashProposer(drafter, target, static=False)
    feats = extract_context_features(prefill.hidden_states, proposer.feature_layer_ids)[0]

    def draft():
        proposer.reset()
        return proposer.propose(int(token), prompt_len, feats, drafter.block_size)

    out["draft_ms"] = timed(draft, repeats=5)
    logprobs = draft()
    del proposer
    # a round's pass, dynamic (eager) against static (CUDA graphs), side by side: issue #18's <= 3 ms
    out["drafter_pass"] = drafter_pass(target, drafter, feats, int(token), sync, repeats=4 if bench.smoke else 20)
    rows = [] if bench.fast_only else verify_rows(target, base, int(token), logprobs, budgets, prompt_len, sync)
    out["budgets"] = rows
    chain = DraftTree.chain_from_logprobs(int(token), logprobs)
    if not bench.fast_only:
        out["dflash_chain_verify_ms"] = timed(lambda: verify_tree(target, copy.deepcopy(base), chain, prompt_len, EXACT,
                                                                  want_hidden=True), repeats=5)
        out["rounds"] = session_rounds(bench, target, drafter, dtype, prompt[0].tolist())
    if bench.fast and not bench.split:
        dflash2 = None
        if bench.dflash2:  # the DFlash2 drafter beside DFlash 1: same target, prompt and runner
            drafter2 = build_drafter(bench, target, dtype, DFLASH2_CONFIG)
            dflash2 = (drafter2, extract_context_features(prefill.hidden_states, drafter2.target_layer_ids)[0])
        out["fast"] = fast_speed(bench, pair_of(bench, target, drafter, dtype), prompt[0].tolist(), budgets, logprobs,
                                 bound_ms, out["greedy_step_ms"], out["draft_ms"], sync, out["drafter_pass"], dflash2)
    out["peak_memory_GiB"] = peak_memory_gib(bench)
    for key in ("greedy_step_ms", "draft_ms", "dflash_chain_verify_ms", "prefill_ms"):
        if key in out:
            out[f"{key}_per_bound"] = out[key] / bound_ms
    for row in rows:
        row["verify_exact_per_bound"] = row["verify_exact_ms"] / bound_ms
        row["verify_exact_per_greedy_step"] = row["verify_exact_ms"] / out["greedy_step_ms"]
    if bench.quantized and "fast" in out:  # the quantized targets after the bf16 one is freed (one 27B at a time)
        print(json.dumps({"bf16_targets": out["fast"]["targets"]}), flush=True)  # kept in the log if a limit hits
        del target, base, prefill, cache
        for weights in bench.quantized:
            out["fast"][weights] = quantized_speed_or_error(bench, weights, layers, dtype, budgets, drafter,
                                                            prompt[0].tolist(), logprobs,
                                                            out["copy_bandwidth_TBps"] * 1e12, out["fast"])
            if "error" not in out["fast"][weights]:
                out["fast"]["targets"].update(quantized_targets(out["fast"][weights], weights))
    elif bench.cuda:  # the caller builds the next model; free this one's memory first
        del target, base, prefill
    if bench.cuda:
        del drafter
        torch.cuda.empty_cache()
    return out


@torch.no_grad()
def quantized_alone(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int]) -> dict:
    """--quantized-only: each --fp8 / --int4 target measured with no bf16 target built before it in this process, as
    a user's process holds it (the quantized target, its drafter and the session; and for a device call's time
    limit). The drafter is built against the target's config, bf16, or with --int4-drafter its Linears 4-bit too
    (int4.quantize_linears: the same groups of 128). The trees' shapes come from random log-probs where the bf16
    run drafts them from a prompt's features: a tree's size, not its tokens, sets a verify's cost."""
    from types import SimpleNamespace

    from ..engine.weights import int4_common as int4
    from ..engine.verify import device_sync

    cfg = target_config(bench, layers)
    drafter = build_drafter(bench, SimpleNamespace(config=cfg), dtype)
    if bench.int4_drafter:
        int4.quantize_linears(drafter, int4.Int4Spec(INT4_GROUP, True))
    sync = device_sync(drafter)
    bandwidth = copy_bandwidth(timer(sync), bench.device, gib=0.25 if bench.smoke else 4.0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (512,), generator=gen).tolist()
    logprobs = torch.log_softmax(4 * torch.randn(drafter.block_size - 1, cfg.vocab_size, generator=gen), -1)
    out: dict = {"copy_bandwidth_TBps": bandwidth / 1e12, "quantized_only": True,
                 "drafter": {"weights": "int4" if bench.int4_drafter else str(dtype).removeprefix("torch."),
                             "GiB": model_bytes(drafter) / 2**30},
                 "fast": {"targets": {}}}
    for weights in bench.quantized:
        f = quantized_speed_or_error(bench, weights, layers, dtype, budgets, drafter, prompt,
                                     logprobs.to(bench.device), bandwidth, {"budgets": [], "greedy_step_ms": None})
        out["fast"][weights] = f
        if "error" not in f:
            out["fast"]["targets"].update(quantized_targets(f, weights))
    return out


@torch.no_grad()
def int4_tune(bench: BenchConfig, dtype: torch.dtype) -> dict:
    """--int4-tune: a 4-layer 4-bit target at the 27B's widths (its layer kinds, each GEMM's shape), the copy
    bandwidth, and int4_tune.tune's sweep of the 4-bit GEMM's launches over them."""
    from ..engine.verify import device_sync
    from ..engine.weights import int4_common as int4
    from .int4_tune import tune

    if int4._gemm_module() is None:
        return {"error": "the 4-bit GEMM needs Triton, which this torch build lacks"}
    target = build_quantized_target(bench, 4, dtype, "int4")
    timed = timer(device_sync(target))
    bandwidth = copy_bandwidth(timed, bench.device, gib=0.25 if bench.smoke else 4.0)
    gemms = layer_gemms(target, int4.FusedInt4Linear)
    return {"copy_bandwidth_TBps": bandwidth / 1e12,
            "gemms": tune(gemms, functools.partial(per_call_us, bench, timed, 24), bandwidth)}


def quantized_speed_or_error(bench: BenchConfig, *args) -> dict:
    """quantized_speed, or what broke (traceback on stderr; the cap lifted) beside what it measured before (its
    memory trail among them): the bf16 figures still come back."""
    out: dict = {}
    try:
        return quantized_speed(bench, *args, out=out)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory under the cap: that is a finding, reported
        traceback.print_exc()
        memory_cap(bench, None)
        return {**out, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}


def verify_rows(target, base, token: int, logprobs, budgets: list[int], prompt_len: int, sync) -> list[dict]:
    """Per budget: the best-first tree's build time, and transformers' verify and commit of it, exact and naive
    (medians of 5 after one), each on a fresh copy of the prompt's cache `base`."""
    from ..engine.tree import build_tree
    from ..engine.verify import EXACT, NAIVE

    timed = timer(sync)
    rows = []
    for budget in budgets:
        k = min(budget, logprobs.shape[-1])
        values, ids = torch.topk(logprobs, k, dim=-1)
        v_np, i_np = values.cpu().numpy(), ids.cpu().numpy()
        tree_ms = timed(lambda: build_tree(token, v_np, i_np, budget), repeats=20)
        tree = build_tree(token, v_np, i_np, budget)
        row = {"budget": budget, "positions": len(tree), "tree_build_ms": tree_ms}
        for mode in (EXACT, NAIVE):
            one = functools.partial(verify_commit_ms, target, base, tree, prompt_len, mode, sync)
            one()
            samples = [one() for _ in range(5)]
            row[f"verify_{mode}_ms"] = statistics.median(v for v, _ in samples)
            row[f"commit_{mode}_ms"] = statistics.median(c for _, c in samples)
        row["tree_exact_extra_ms"] = row["verify_exact_ms"] - row["verify_naive_ms"]
        rows.append(row)
    return rows


def verify_commit_ms(target, base, tree, prompt_len: int, mode: str, sync) -> tuple[float, float]:
    """(verify ms, commit ms) of transformers' pass over `tree` in `mode` and the commit of its deepest path, on a
    fresh copy of the prompt's cache `base`."""
    from ..engine.verify import commit, verify_tree

    c = copy.deepcopy(base)
    sync()
    s = time.perf_counter()
    r = verify_tree(target, c, tree, prompt_len, mode, want_hidden=True)
    sync()
    v = (time.perf_counter() - s) * 1e3
    accepted = tree.path_to(len(tree) - 1)
    s = time.perf_counter()
    commit(c, tree, accepted, r)
    sync()
    return v, (time.perf_counter() - s) * 1e3


DRAFT_PATHS = {  # drafter_pass: each path's proposer options (session.make_proposer: the drafter's family)
    "dynamic": dict(static=False),  # drafter.py over its DraftKVCache, eager: the reference
    "static": dict(static=True, compile=False),  # draft_runner.py: CUDA graphs on a GPU (eager on a CPU), eager
    # attention, its pieces not compiled
    "static_eager": dict(static=True, graphs=False),  # the same function without graphs
    "static_sdpa": dict(static=True, attention="sdpa"),  # graphs, SDPA for the attention
    "static_compiled": dict(static=True, compile=True),  # graphs, the pieces between the GEMMs compiled (CUDA's default)
}


@torch.no_grad()
def drafter_pass(target, drafter, feats, token: int, sync, contexts=(512, 2048), new_rows: int = 4,
                 repeats: int = 20, limit_ms: float = 3.0) -> dict:
    """The drafter's pass of a round, each way of DRAFT_PATHS side by side: a context of `c` rows (the prompt's
    features, repeated to c rows) drafted once (the prompt's pass: eager on every path), then rounds of `new_rows`
    new context rows + the block, timed (median of `repeats` after 2 warm-up rounds, which capture the graphs).
    Every path sees the same rounds; its last round's log-probs are compared with the dynamic path's. Ratios:
    `dynamic_per_static` (the graphs' speed-up) and each other path per the static one; the static pass against
    `limit_ms` (issue #18: DFlash 1 at block 16, 3 ms; issue #67: DFlash2 at block 8, with its selector, 3.0 ms)."""
    from ..engine.session import make_proposer

    timed = timer(sync)
    block = drafter.block_size
    out: dict = {"new_rows": new_rows, "block": block, "repeats": repeats, "contexts": {}}
    for c in contexts:
        ctx = feats.repeat(-(-c // feats.shape[0]), 1)[:c]
        row: dict = {}
        reference = None
        for name, options in DRAFT_PATHS.items():
            try:
                proposer = make_proposer(drafter, target, **options)
            except ValueError as exc:  # a split target: no static path
                row[name] = {"error": str(exc)}
                continue
            proposer.reserve(c + (repeats + 4) * new_rows + 2 * block)
            sync()
            start = time.perf_counter()
            proposer.propose(token, c, ctx, block)
            sync()
            first_ms = (time.perf_counter() - start) * 1e3
            committed = c

            def one():
                nonlocal committed
                committed += new_rows
                return proposer.propose(token, committed, ctx[:new_rows], block)

            ms = timed(one, repeats=repeats)
            last = one()
            runner = proposer.runner
            entry = {"ms": ms, "first_pass_ms": first_ms, "path": proposer.path, "context_rows": committed,
                     "capture_s": runner.capture_s if runner is not None else None,
                     "compile_error": runner.compile_error if runner is not None else None,
                     "key_bucket": runner.bucket(committed + block) if runner is not None else None}
            if reference is None:
                reference = last
            else:
                entry["max_abs_logprob_diff_vs_dynamic"] = float((last - reference).abs().max())
                entry["argmax_agreement_vs_dynamic"] = float((last.argmax(-1) == reference.argmax(-1)).float().mean())
            row[name] = entry
            del proposer, runner, last
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        static = row.get("static", {}).get("ms")
        if static:
            for name in DRAFT_PATHS:
                if name != "static" and "ms" in row[name]:
                    row[f"{name}_per_static"] = row[name]["ms"] / static
        out["contexts"][str(c)] = row
    first = out["contexts"][str(contexts[0])]
    if "ms" in first.get("static", {}):
        out["static_ms"], out["dynamic_ms"] = first["static"]["ms"], first["dynamic"]["ms"]
        out["dynamic_per_static"] = first["dynamic_per_static"]
        out["target"], out["met"] = f"<= {limit_ms:g} ms", first["static"]["ms"] <= limit_ms
    return out


@torch.no_grad()
def fast_speed(bench: BenchConfig, pair, prompt: list[int], budgets: list[int], logprobs, bound_ms: float,
               hf_greedy_ms: float, draft_ms: float, sync, draft_pass: dict | None = None, dflash2=None) -> dict:
    """The static runner (engine/runner.py): the same measurements with preallocated state and CUDA graphs, its
    prefill at 512 and 2,048 tokens, the same passes with each of its options switched (``variants``) and every
    figure against issue #18's target (``targets``). ``sync`` waits for the models' devices
    (``engine.verify.device_sync``); ``draft_ms`` is the isolated drafter pass measured before (the dynamic
    drafter's first pass of the prompt), ``draft_pass`` the round's pass both ways (``drafter_pass``). ``dflash2``:
    (DFlash2 drafter, its context features of the prompt) to measure beside DFlash 1 on this runner (dflash2_speed)."""
    from ..engine.engines import RunnerEngine
    from ..engine.tree import DraftTree

    target, drafter = pair.target, pair.drafter
    timed = timer(sync)
    root = int(logprobs.argmax(-1)[0])
    sizes = sorted({1, drafter.block_size, *(b + 1 for b in budgets), *([dflash2[0].block_size] if dflash2 else [])})
    options = bench.runner_options()
    start = time.perf_counter()
    runner, graphs_error = bench_runner(target, len(prompt) + 2048, sizes, drafter.target_layer_ids, options)
    out: dict = {"options": asdict(runner.options), "kernel_error": runner.kernel_error, "graphs": runner.graphs,
                 "graphs_error": graphs_error, "compile_s": runner.compile_s, "compile_error": runner.compile_error}
    out["prefill"] = runner_prefill(runner, prompt, sync, lengths=(len(prompt), 2048))
    logits, feats = runner.prefill(prompt)
    for size in sizes:  # capture every size at this length bucket now, not inside the timings
        runner.slot_for(size)
    out.update(capture_s=time.perf_counter() - start, sizes=sizes, buckets=runner.buckets, blas=dict(runner.blas),
               gate_up_forms=gate_up_forms(runner))
    rounds_tokens = 16 * drafter.block_size  # room for the 14 whole rounds below, however much they accept
    engine = RunnerEngine(target, drafter.target_layer_ids, tree_size=max(sizes), block_size=drafter.block_size,
                          max_new_tokens=rounds_tokens, runner=runner)
    out["greedy_step_ms"] = timed(greedy_stepper(engine, int(logits.argmax())), repeats=30)
    out.update(greedy_step_chained(runner, timed, int(logits.argmax())))
    rows = []
    for budget in budgets:
        tree = DraftTree.from_logprobs(root, logprobs, budget)
        verify_ms = timed(lambda: runner.forward(tree), repeats=20)
        accepted = tree.path_to(len(tree) - 1)

        def forward_commit():
            _, _, slot = runner.forward(tree)
            runner.commit(slot, accepted)

        both_ms = timed(forward_commit, repeats=10)
        rows.append({"budget": budget, "positions": len(tree), "verify_ms": verify_ms, "commit_ms": both_ms - verify_ms,
                     "verify_per_bound": verify_ms / bound_ms, "verify_per_fast_greedy_step": verify_ms / out["greedy_step_ms"]})
    out["budgets"] = rows
    out["tree_build"] = tree_build(root, logprobs, sorted({*budgets, 128}), timed)
    out["best_first_warps"] = best_first_warps(bench, logprobs, sorted({*budgets, 128}), timed)
    chain = DraftTree.chain_from_logprobs(root, logprobs)
    out["dflash_chain_verify_ms"] = timed(lambda: runner.forward(chain), repeats=20)
    out.update(runner_rounds(pair, engine, runner, prompt, rounds_tokens))
    if dflash2 is not None:
        try:
            out["dflash2"] = dflash2_speed(bench, pair, dflash2, engine, runner, prompt, rounds_tokens, root, sync)
        except Exception as exc:  # report what broke (traceback on stderr); DFlash 1's figures and the rest come back
            traceback.print_exc()
            out["dflash2"] = {"error": f"{type(exc).__name__}: {exc}"}
    out["greedy_step_per_bound"] = out["greedy_step_ms"] / bound_ms
    out["greedy_step_chained_per_bound"] = out["greedy_step_chained_ms"] / bound_ms
    out["greedy_step_vs_transformers"] = out["greedy_step_ms"] / hf_greedy_ms
    out["graph_launch"] = graph_launch(runner, sizes, sync)
    # the figures so far, issue #31's targets on them, in the log before the long tail (variants, --tree-forms): a run
    # stopped by its time limit there keeps them (session 19's first run lost every figure that way)
    progress("fast_so_far", {**out, "issue_67": round_targets(out, bound_ms)})
    del engine, runner
    if bench.cuda:
        torch.cuda.empty_cache()
    out["variants"] = runner_variants(bench, target, prompt, root, logprobs, options, sync, bound_ms)
    if bench.tree_forms:
        out["tree_forms"] = tree_forms(bench, target, sync)
    out["targets"] = fast_targets(out, bound_ms, draft_ms, draft_pass)
    return out


# ------------------------------------------------------------------------------------------------------------
# Quantized weights, FP8 and 4-bit (issue #29 items 2 and 5, and its W4A16)
# ------------------------------------------------------------------------------------------------------------


def weight_bytes_of(target) -> dict:
    """What a decode step reads of the target: its quantized weights' bytes (FP8 e4m3 bytes; 4-bit words and zero
    points) and their scales, every other parameter (bf16 embeddings and lm_head, the modules left in bf16, norms);
    `bytes` their sum."""
    from ..engine.weights.registry import KEPT

    quantized = scale_bytes = 0
    for m in target.modules():
        if isinstance(m, KEPT):  # each kept kind says which of its tensors are the weight's, which its scales
            weight, scales = m.stored_bytes()
            quantized += weight
            scale_bytes += scales
    total = sum(p.numel() * p.element_size() for p in target.parameters())
    return {"bytes": total, "quantized_bytes": quantized, "scale_bytes": scale_bytes,
            "other_bytes": total - quantized - scale_bytes}


def memory_cap(bench: BenchConfig, gb: float | None) -> float | None:
    """Cap this process's GPU memory (torch's caching allocator: every tensor, CUDA graph pools included) at `gb` GB
    (None: lift the cap); the cap set."""
    if not bench.cuda:
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(1.0 if gb is None else min(1.0, gb * 1e9 / total), 0)
    return gb


def free_cuda(bench: BenchConfig) -> None:
    """Release what the last phase held: its reference cycles first (a runner, its engine and its graphs can keep
    one another, and with them their buffers, alive past `del`), then the allocator's cached blocks."""
    gc.collect()
    if bench.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


@torch.no_grad()
def quantized_speed(bench: BenchConfig, weights: str, layers: int, dtype: torch.dtype, budgets: list[int], drafter,
                    prompt: list[int], logprobs, bandwidth: float, bf16: dict, out: dict | None = None) -> dict:
    """Issue #29 items 2 and 5, after the bf16 target is freed: the same shapes with quantized weights made at
    random (`weights` "fp8" or "int4": build_quantized_target) under the process's memory cap (bench.cap_gb), on the
    runner with the options of the bf16 run: its weight-read bound (the quantized bytes + scales + the bf16 rest at
    the copy bandwidth measured before), the greedy step, each budget's verify, whole rounds at budget 64 (the same
    bf16 drafter), the peak memory of a session at a `bench.fp8_context`-token prompt and budget 64
    (quantized_peak_memory), for FP8 the GEMMs one by one (fp8_gemms), each beside the bf16 run's figure; the step
    chained and its kernels by kind (greedy_step_chained)."""
    from ..engine.engines import RunnerEngine
    from ..engine.tree import DraftTree
    from ..engine.verify import device_sync

    out = {} if out is None else out
    out.update(quantized_memory_cap(bench, weights, drafter))
    t0 = time.perf_counter()
    target = build_quantized_target(bench, layers, dtype, weights, trail=out.setdefault("build_trail_GiB", {}))
    out.update(build_s=time.perf_counter() - t0, build_peak_GiB=peak_gib(bench), weights=weight_bytes_of(target))
    progress(f"{weights}_built", {k: out[k] for k in ("leftover_GiB", "drafter_GiB", "build_trail_GiB",
                                                      "build_peak_GiB", "memory_cap_GB")})
    out["weight_read_bound_ms"] = bound_ms = out["weights"]["bytes"] / bandwidth * 1e3
    sync = device_sync(target, drafter)
    timed = timer(sync)
    pair = pair_of(bench, target, drafter, dtype)
    root = int(logprobs.argmax(-1)[0])
    sizes = sorted({1, drafter.block_size, *(b + 1 for b in budgets)})
    start = time.perf_counter()
    runner, out["graphs_error"] = bench_runner(target, len(prompt) + 2048, sizes, drafter.target_layer_ids,
                                               bench.runner_options())
    trail = out.setdefault("runner_trail_GiB", {})  # allocated after each stage: where a runner's memory goes
    trail["runner"] = allocated_gib(bench)
    logits, _ = runner.prefill(prompt)
    trail["prefill"] = allocated_gib(bench)
    for size in sizes:
        runner.slot_for(size)
        trail[f"slot_{size}"] = allocated_gib(bench)
    out.update(options=asdict(runner.options), graphs=runner.graphs, compile_error=runner.compile_error,
               capture_s=time.perf_counter() - start, blas=dict(runner.blas))
    rounds_tokens = 16 * drafter.block_size
    engine = RunnerEngine(target, drafter.target_layer_ids, tree_size=max(sizes), block_size=drafter.block_size,
                          max_new_tokens=rounds_tokens, runner=runner)
    out["greedy_step_ms"] = step = timed(greedy_stepper(engine, int(logits.argmax())), repeats=30)
    out.update(greedy_step_chained(runner, timed, int(logits.argmax())))  # and where the FP8 step's time goes
    bf16_verify = {row["budget"]: row["verify_ms"] for row in bf16["budgets"]}
    out["budgets"] = []
    for budget in budgets:
        tree = DraftTree.from_logprobs(root, logprobs, budget)
        ms = timed(lambda: runner.forward(tree), repeats=20)
        out["budgets"].append({"budget": budget, "positions": len(tree), "verify_ms": ms, "verify_per_step": ms / step,
                               "bf16_verify_ms": bf16_verify.get(budget)})
    out.update(runner_rounds(pair, engine, runner, prompt, rounds_tokens))
    bf16_step = bf16["greedy_step_ms"]  # None with --quantized-only (no bf16 target measured in this process)
    out.update(greedy_step_per_bound=step / bound_ms, bf16_greedy_step_ms=bf16_step,
               greedy_step_vs_bf16=step / bf16_step if bf16_step else None)
    progress(weights, {k: v for k, v in out.items() if k != "blas"})
    del engine, runner
    free_cuda(bench)
    out["peak_memory"] = quantized_peak_memory(bench, pair, bench.fp8_context, budget=64, limit=PEAK_LIMIT[weights])
    progress(f"{weights}_peak_memory", out["peak_memory"])
    if weights == "int4":  # issue #67: the 4-bit session at a long context too (what a 24 GB card leaves for it)
        free_cuda(bench)
        out["peak_memory_long"] = quantized_peak_memory(bench, pair, LONG_CONTEXT if bench.cuda else
                                                        2 * bench.fp8_context, budget=64, limit=PEAK_LIMIT[weights])
        progress(f"{weights}_peak_memory_long", out["peak_memory_long"])
    out["gemms"] = (fp8_gemms if weights == "fp8" else int4_gemms)(bench, target, timer(sync))
    del pair, target
    free_cuda(bench)
    memory_cap(bench, None)
    return out


STARTED = time.perf_counter()  # the script's start, for progress lines' `at_s`


def progress(name: str, figures: dict) -> None:
    """A part's figures on stdout as soon as they are measured (a run stopped by a time limit keeps them), with the
    seconds since the script started (`at_s`: what a device call's time limit leaves for the rest)."""
    print(json.dumps({name: figures, "at_s": round(time.perf_counter() - STARTED, 1)}, default=str), flush=True)


def quantized_memory_cap(bench: BenchConfig, weights: str, drafter) -> dict:
    """The cap of a quantized phase, set, and what it is made of. The cap stands for the card: this phase's target,
    its drafter and its session. What earlier phases of this process still hold (allocated beyond the drafter:
    compiled pieces' constants, cached graphs) is not the card's, so the cap is raised by exactly that much, and
    said (`leftover_GiB`)."""
    from ..engine.weights.load import expandable_segments

    free_cuda(bench)
    leftover = max(0, torch.cuda.memory_allocated() - model_bytes(drafter)) if bench.cuda else 0
    return {"weights": weights, "card_GB": bench.cap_gb(weights),
            "memory_cap_GB": memory_cap(bench, bench.cap_gb(weights) + leftover / 1e9), "leftover_GiB": leftover / 2**30,
            **({"block": list(FP8_BLOCK)} if weights == "fp8" else {"group": INT4_GROUP, "symmetric": True}),
            "expandable_segments": expandable_segments() if bench.cuda else None,
            "allocated_before_GiB": allocated_gib(bench), "drafter_GiB": model_bytes(drafter) / 2**30}


def allocated_gib(bench: BenchConfig) -> float | None:
    return torch.cuda.memory_allocated() / 2**30 if bench.cuda else None


def peak_gib(bench: BenchConfig) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if bench.cuda else None


# the peak a session may reach (the two models alone + the session): FP8 the issue's 36 GB (a 40 GB card); 4-bit
# 22 GB, what a 24 GB card leaves beside the CUDA context
PEAK_LIMIT = {"fp8": (36e9, "36 GB"), "int4": (22 * 2**30, "22 GiB")}  # (bytes, as the issue says it)
LONG_CONTEXT = 16384  # the 4-bit session's second peak (issue #67: "the peak at 4k and 16k context")


@torch.no_grad()
def quantized_peak_memory(bench: BenchConfig, pair, context: int, budget: int = 64, rounds: int = 6,
                          limit: tuple[float, str] = PEAK_LIMIT["fp8"]) -> dict:
    """Item 5: a session as a user runs it (DecodeSession on the runner engine: its runner sized for the prompt, CUDA
    graphs, the static drafter) on a `context`-token prompt at `budget`, `rounds` rounds; the peak GPU memory
    torch allocated (reset first: the models are resident, the rest is the session's) and what stays allocated.
    The target is judged on `peak_models_alone_GB`, what a process holding the two models alone would reach: their
    own bytes (`model_bytes`) plus the session's peak; the raw peak beside it also counts what the bench's earlier
    phases left allocated (`leftover_GiB`)."""
    from ..engine.session import DecodeSession, make_proposer

    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, pair.target.config.vocab_size, (context,), generator=gen).tolist()
    resident = torch.cuda.memory_allocated() if bench.cuda else None
    proposer = make_proposer(pair.drafter, pair.target, static=True)
    session = DecodeSession(pair, budget=budget, max_new_tokens=(rounds + 2) * pair.drafter.block_size,
                            engine="runner", record=False, proposer=proposer)
    start = time.perf_counter()
    session.prefill(prompt_ids=prompt)
    prefill_s = time.perf_counter() - start
    session.run(max_steps=rounds)
    out = {"context": context, "budget": budget, "rounds": len(session.history), "prefill_s": prefill_s,
           "runner_max_len": session.cache.max_len, "target": f"<= {limit[1]}"}
    if bench.cuda:
        peak, models = torch.cuda.max_memory_allocated(), model_bytes(pair.target, pair.drafter)
        out.update(peak_GB=peak / 1e9, peak_GiB=peak / 2**30, models_GiB=resident / 2**30,
                   session_GiB=(peak - resident) / 2**30, after_GiB=torch.cuda.memory_allocated() / 2**30,
                   reserved_peak_GiB=torch.cuda.max_memory_reserved() / 2**30, model_bytes_GiB=models / 2**30,
                   leftover_GiB=(resident - models) / 2**30, peak_models_alone_GB=(models + peak - resident) / 1e9,
                   peak_models_alone_GiB=(models + peak - resident) / 2**30, met=models + peak - resident <= limit[0])
    del session, proposer
    return out


def model_bytes(*models) -> int:
    """Bytes the models' parameters and buffers hold, each storage once (fused projections are views of one
    storage; a drafter shares the target's embedding and lm_head)."""
    seen, total = set(), 0
    for model in models:
        for t in itertools.chain(model.parameters(), model.buffers()):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def layer_gemms(target, fused_kind) -> dict[str, object]:
    """Each GEMM of a layer as the runner runs it: the runs of `fused_kind` (fp8.FusedFp8Linear,
    int4.FusedInt4Linear) in the fused groups of layer 0 (GDN in_proj, MLP gate + up) and of the first attention
    layer (q + k + v), and their single projections (out_proj, o_proj, down_proj: the modules)."""
    from ..engine.fused import ATTENTION_PROJECTIONS, GDN_PROJECTIONS, MLP_PROJECTIONS, fuse_linears
    from ..engine.verify import gdn_modules

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


def fp8_gemms(bench: BenchConfig, target, timed, rows=(1, 17, 65, 129), calls: int = 24) -> dict:
    """Each GEMM of a layer as the runner runs it (layer_gemms), microseconds a call (`per_call_us`: a CUDA graph of
    `calls` calls on a GPU) for each row count: FP8 (fp8.linear: the Triton GEMM with the config fp8_gemm.choose
    picks) beside cuBLAS's bf16 GEMM on the dequantized weight, the FP8 bytes a call reads over its time, and at 1,
    65 and 129 rows other configs beside the chosen one (`gemm_configs`), to tune `choose` from one run."""
    from ..engine.weights import fp8

    per_call = functools.partial(per_call_us, bench, timed, calls)
    weights = {name: ((g.weight, g.scale) if isinstance(g, fp8.FusedFp8Linear) else (g.weight, g.weight_scale_inv))
               for name, g in layer_gemms(target, fp8.FusedFp8Linear).items()}
    kernel = fp8._gemm_module() if bench.cuda else None  # other configs: where the Triton GEMM runs
    dtype, out = target.get_input_embeddings().weight.dtype, {}
    for name, (w, s) in weights.items():
        dense = fp8.dequantize(w, s, FP8_BLOCK).to(dtype)
        row: dict = {"shape": list(w.shape)}
        for m in rows:
            x = torch.randn(m, w.shape[1], device=w.device, dtype=dtype)
            us = per_call(lambda: fp8.linear(x, w, s, FP8_BLOCK))
            cell = row[str(m)] = {"fp8_us": us, "bf16_us": per_call(lambda: torch.nn.functional.linear(x, dense))}
            if isinstance(us, float) and us > 0:
                cell["fp8_TBps"] = (w.numel() + s.numel() * 4) / (us * 1e-6) / 1e12
            if kernel is not None and m in (1, 65, 129):
                cell["configs"] = {label: {"config": asdict(c), "us": per_call(lambda: kernel.fp8_linear(x, w, s, FP8_BLOCK, c))}
                                   for label, c in gemm_configs(kernel, m, w).items()}
        out[name] = row
        del dense
    return out


def int4_gemms(bench: BenchConfig, target, timed, rows=(1, 17, 65, 129), calls: int = 24) -> dict:
    """fp8_gemms for the 4-bit target: each GEMM of a layer (layer_gemms) a call, the 4-bit GEMM (int4.linear, the
    config int4_gemm.choose picks) beside cuBLAS's bf16 GEMM on the dequantized weight, the packed bytes (words,
    scales, zero points) a call reads over its time, the same GEMM with zero points (`int4_asym_us`: AWQ's and
    asymmetric AutoRound / GPTQ files' form) where the target has none, and at 1, 65 and 129 rows other configs
    (`int4_configs`: other tiles, and at one row the kernel on the CUDA cores), to choose from one run."""
    from ..engine.weights import int4_common as int4

    per_call = functools.partial(per_call_us, bench, timed, calls)
    kernel = int4._gemm_module() if bench.cuda else None
    dtype, out = target.get_input_embeddings().weight.dtype, {}
    for name, g in layer_gemms(target, int4.FusedInt4Linear).items():
        fused = isinstance(g, int4.FusedInt4Linear)
        parts = ((g.packed, g.scale, g.zero) if fused else (g.weight_packed, g.weight_scale, g.weight_zero_point))
        k = g.in_features if not fused else parts[0].shape[1] * int4.PER_WORD  # (real widths: whole words)
        spec = int4.Int4Spec(g.group if g.group != k else 0, parts[2] is None)
        dense = int4.dequantize({"weight_packed": parts[0], "weight_scale": parts[1], "weight_shape": torch.tensor(
            [parts[0].shape[0], k]), **({"weight_zero_point": parts[2]} if parts[2] is not None else {})}, spec).to(dtype)
        nbytes = sum(t.numel() * t.element_size() for t in parts if t is not None)
        row: dict = {"shape": [parts[0].shape[0], k]}
        zero = None if parts[2] is not None else torch.randint(  # zero points, as an AWQ / asymmetric file has them
            -2 ** 31, 2 ** 31, (math.ceil(parts[0].shape[0] / int4.PER_WORD), parts[1].shape[1]), dtype=torch.int32,
            device=dense.device)
        for m in rows:
            x = torch.randn(m, k, device=dense.device, dtype=dtype)
            us = per_call(lambda: int4.linear(x, *parts, None, g.group))
            cell = row[str(m)] = {"int4_us": us, "bf16_us": per_call(lambda: torch.nn.functional.linear(x, dense))}
            if isinstance(us, float) and us > 0:
                cell["int4_TBps"] = nbytes / (us * 1e-6) / 1e12
            if zero is not None:  # the same product with zero points read too
                cell["int4_asym_us"] = per_call(lambda: int4.linear(x, parts[0], parts[1], zero, None, g.group))
            if kernel is not None and m in (1, 65, 129):
                cell["configs"] = {label: {"config": asdict(c), "us": per_call(
                    lambda: kernel.int4_linear(x, *parts, None, g.group, c))} for label, c in
                    int4_configs(kernel, m, k, g.group).items()}
        out[name] = row
        del dense
    return out


def int4_configs(kernel, m: int, k: int, group: int) -> dict:
    """int4_gemm's chosen config for an [m, k] product and its neighbours, one field changed each; at one row the
    kernel on the CUDA cores (two widths of a step) where the groups allow it."""
    c = kernel.choose(m, 0, k)
    alts = {"chosen": c, **{f"block_n_{n}": dataclasses.replace(c, block_n=n) for n in (32, 128) if n != c.block_n},
            "block_k_128": dataclasses.replace(c, block_k=128), "warps_8": dataclasses.replace(c, num_warps=8),
            "stages_2": dataclasses.replace(c, num_stages=2), "stages_4": dataclasses.replace(c, num_stages=4)}
    if m == 1:
        for bk, bn, warps in ((64, 64, 4), (128, 64, 4), (128, 128, 8), (128, 32, 2)):
            gemv = kernel.Config(block_n=bn, block_k=bk, num_warps=warps, gemv=True)
            if kernel.whole_groups(gemv, group, None):
                alts[f"gemv_{bn}x{bk}_w{warps}"] = gemv
    return alts


def gemm_configs(kernel, m: int, w) -> dict:
    """fp8_gemm's chosen config for an [m, K] x w^T product and its neighbours, one field changed each."""
    c = kernel.choose(m, w.shape[0], w.shape[1], w.device)
    alts = {"chosen": c, **{f"block_n_{n}": dataclasses.replace(c, block_n=n) for n in (32, 64, 128) if n != c.block_n},
            "split_x2": dataclasses.replace(c, split_k=2 * c.split_k),
            "warps_other": dataclasses.replace(c, num_warps=4 if c.num_warps == 8 else 8),  # 4 <-> 8; 2 -> 8
            "stages_2": dataclasses.replace(c, num_stages=2), "stages_4": dataclasses.replace(c, num_stages=4)}
    if c.gemv:  # one row on the CUDA cores against the tile kernel's decode config (2 to 16 rows)
        alts["tile"] = kernel.choose(2, w.shape[0], w.shape[1], w.device)
    else:
        alts["swap_other"] = dataclasses.replace(c, swap=not c.swap)
        alts["tma_other"] = dataclasses.replace(c, tma=not c.tma)  # the weight tiles by bulk copies or by loads
    if c.tail:
        alts["one_block"] = dataclasses.replace(c, block_m=2 * c.block_m, tail=0)
    if c.split_k > 1:
        alts["no_split"] = dataclasses.replace(c, split_k=1)
        alts["sum_other"] = dataclasses.replace(c, sum_in_launch=not c.sum_in_launch)  # in the launch or after
    return alts


# Issue #67's limits for the quantized targets: the step over its own weight-read bound, verify at budget 64 and a
# whole round at 64 over that step (None: the issue sets none for that format)
QUANTIZED_LIMITS = {"fp8": {"step": 1.25, "verify_64": 1.25, "round_64": 1.35},
                    "int4": {"step": 1.4, "verify_64": None, "round_64": 1.4}}


def quantized_targets(f: dict, weights: str) -> dict:
    """Issue #67's targets from quantized_speed's figures (`weights` "fp8" or "int4", the keys' prefix): FP8's step
    <= 1.25x its own bound, verify at 64 <= 1.25x and a round at 64 <= 1.35x that step, the peak at 4,096 tokens and
    budget 64 <= 36 GB; 4-bit's step <= 1.4x its bound, a round at 64 <= 1.4x its step, the peak of a 4k-context
    session with its drafter <= 22 GiB (a 24 GB card), the 16k-context peak beside it (QUANTIZED_LIMITS,
    PEAK_LIMIT)."""
    name, step, limits = FORMAT_NAMES[weights], f["greedy_step_ms"], QUANTIZED_LIMITS[weights]
    chained = f.get("greedy_step_chained_ms")  # the step with no read between steps: the device's share of it
    out = {f"{weights}_step": {**_target(step, f["weight_read_bound_ms"], limits["step"], f"{name} weight-read bound"),
                               "bf16_step_ms": f["bf16_greedy_step_ms"], "chained_ms": chained,
                               "chained_ratio": chained / f["weight_read_bound_ms"] if chained else None}}
    verify = {row["budget"]: row["verify_ms"] for row in f["budgets"]}
    if 64 in verify:
        out[f"{weights}_verify_64"] = (_target(verify[64], step, limits["verify_64"], f"{name} runner greedy step")
                                       if limits["verify_64"] else _untargeted(verify[64], step, f"{name} runner greedy step"))
    out[f"{weights}_round_64"] = _target(f["round_budget_64"]["round_ms"], step, limits["round_64"],
                                         f"{name} runner greedy step")
    for key, peak in (("peak_memory", f["peak_memory"]), ("peak_memory_long", f.get("peak_memory_long"))):
        if peak is None:
            continue
        out[f"{weights}_{key}"] = {"GB": peak.get("peak_models_alone_GB"), "GiB": peak.get("peak_models_alone_GiB"),
                                   "of": "the two models alone + the session", "raw_peak_GB": peak.get("peak_GB"),
                                   "target": peak["target"], "met": peak.get("met"), "context": peak["context"],
                                   "budget": peak["budget"], "cap_GB": f["memory_cap_GB"], "card_GB": f.get("card_GB")}
    return out


def _untargeted(ms: float, of: float, of_name: str) -> dict:
    return {"ms": ms, "ratio": ms / of, "of": of_name, "target": None, "met": None}


def bench_runner(target, max_len: int, sizes: list[int], feature_layer_ids, options):
    """(runner, graphs_error): the static runner with its CUDA graphs, or without them where its construction failed
    (graphs_error says why)."""
    from ..engine.runner import StaticRunner

    try:
        return StaticRunner(target, max_len=max_len, sizes=sizes, feature_layer_ids=feature_layer_ids,
                            options=options), None
    except Exception as exc:  # report what broke, measure without graphs
        return StaticRunner(target, max_len=max_len, sizes=sizes, feature_layer_ids=feature_layer_ids, graphs=False,
                            options=options), f"{type(exc).__name__}: {exc}"


def greedy_stepper(engine, token: int):
    """A greedy step on `engine` from `token` (each call decodes the next token: the one-node tree, its commit)."""
    from ..engine.tree import one_node

    def greedy_step():
        nonlocal token
        tree_pass = engine.forward(one_node(token))
        token = int(tree_pass.logits[0].argmax())
        engine.commit(tree_pass, [0])

    return greedy_step


def chained_greedy_stepper(runner, token: int, keep: bool = True):
    """Greedy steps that read nothing back: each step's one-node tree is the last step's choice where it is (the
    runner's forward_tensors over a token tensor the device rewrites; the walk and the commit queued, queue_walk),
    so the host launches a step while the device still runs the one before. A step accepts its root alone, so the
    committed length moves by one without a read. Returns (step, tokens): tokens() reads the tokens decoded so far
    (with `keep`, each step's token copied on the device, all read at once; without, the timed steps copy nothing)."""
    ids = torch.tensor([token], device=runner.device)
    parents = torch.tensor([-1], device=runner.device)
    depths = torch.zeros(1, dtype=torch.long, device=runner.device)
    made = []

    def step():
        logits, _, slot = runner.forward_tensors(ids, parents, depths, static=True)
        runner.queue_walk(slot, logits.argmax(-1))
        runner.committed += 1
        ids.copy_(slot.walk_out[runner.max_path + 2:])  # the bonus: the next step's token, on the device
        if keep:
            made.append(ids.clone())

    return step, lambda: torch.cat(made).tolist()


def greedy_step_chained(runner, timed, token: int, steps: int = 8) -> dict:
    """The greedy step with the host out of the device's way (chained_greedy_stepper), ms a step over runs of `steps`
    waited for once, beside greedy_step_ms (each step's token read back before the next is launched, as a decode
    that must see its tokens does): how much of the step is the host's wait, not the device's work. And
    `greedy_step_timeline`: the same steps' device activities by kind and their gaps (where the step's time goes
    beside the weight reads: what fusing would take away)."""
    step, _ = chained_greedy_stepper(runner, token, keep=False)
    out = {"greedy_step_chained_ms": timed(lambda: [step() for _ in range(steps)], repeats=5, warmup=1) / steps}
    spans = profiled_spans(lambda: [step() for _ in range(steps)], warmup=step)
    out["greedy_step_timeline"] = ({"error": spans} if isinstance(spans, str) or not spans else
                                   {"steps": steps, "device_events": len(spans),
                                    **timeline_gaps(spans, steps, listed=8),
                                    "kinds": activity_kinds(spans, steps, top=40)})
    return out


def tree_build(root: int, logprobs, budgets: list[int], timed) -> dict:
    """Issue #31 item 1's first part: the round's tree phase from the drafter's log-probs on the device to the tree on
    the host, built on the host (top-k copied back, build_tree) and on the device (device_tree_nodes, the nodes
    copied back) eagerly and in DeviceTreeBuilder's CUDA graph (`graph_ms`; `graph_error` where the capture failed),
    by the best-first kernel where it runs (engine/best_first.py, the default on CUDA) and by tree_on_device's tensor
    ops in a graph too (`graph_torch_ms`), per budget: ms each (medians of 20) and whether the trees are the same."""
    from ..engine.tree import DeviceTreeBuilder, DraftTree

    out = {}
    for budget in budgets:
        host = DraftTree.from_logprobs(root, logprobs, budget)
        device = DraftTree.from_logprobs(root, logprobs, budget, on_device=True)
        builder, torch_ops = DeviceTreeBuilder(budget), DeviceTreeBuilder(budget, kernel=False)
        graph, graph_torch = builder(root, logprobs).to_host(), torch_ops(root, logprobs).to_host()
        out[str(budget)] = {
            "host_ms": timed(lambda: DraftTree.from_logprobs(root, logprobs, budget), repeats=20),
            "device_ms": timed(lambda: DraftTree.from_logprobs(root, logprobs, budget, on_device=True), repeats=20),
            "graph_ms": timed(lambda: builder(root, logprobs).to_host(), repeats=20), "graph_error": builder.error,
            "graph_torch_ms": timed(lambda: torch_ops(root, logprobs).to_host(), repeats=20),
            "same_tree": host == device == graph == graph_torch}
    return out


def best_first_warps(bench: BenchConfig, logprobs, budgets: list[int], timed, warps=(1, 2, 4, 8)) -> dict:
    """The best-first kernel (engine/best_first.py) alone per budget and warps a program: µs a call in a CUDA graph
    of 8 calls (per_call_us) and whether its tree is the default warps' (`same`); where Triton cannot run, why."""
    from ..engine.kernels.device import triton_available

    if not (bench.cuda and triton_available()):
        return {"error": "the kernel runs on CUDA with Triton (tests run it in Triton's interpreter)"}
    from ..engine.kernels.best_first.triton_best_first import MAX_BUDGET, best_first_triton

    out = {}
    for budget in (b for b in budgets if b <= MAX_BUDGET):
        top = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1).values  # as DeviceTree's
        want = best_first_triton(top, budget)
        out[str(budget)] = row = {}
        for w in warps:
            try:  # a warp count that cannot run here says why; the others are still timed
                same = all(torch.equal(a, b) for a, b in zip(best_first_triton(top, budget, w), want))
            except Exception as exc:
                row[str(w)] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            row[str(w)] = {"us": per_call_us(bench, timed, 8, lambda: best_first_triton(top, budget, w)), "same": same}
    return out


# runner_rounds' ratios of the default round to a variant's: (name, variant, the figure compared)
RATIOS_TO_VARIANTS = (("walk_device_per_host", "host_walk", "round_ms"),
                      ("queue_per_no_queue", "no_queue", "step_wall_ms"),
                      ("draft_ahead_per_not", "not_drafted_ahead", "loop_wall_ms"),
                      ("verify_ahead_per_not", "not_verified_ahead", "loop_wall_ms"),
                      ("launch_ahead_per_not", "not_ahead", "loop_wall_ms"),
                      ("drafter_compiled_per_not", "drafter_uncompiled", "draft"))


def runner_rounds(pair, engine, runner, prompt: list[int], rounds_tokens: int, method: str = "ddtree",
                  tree_scoring: str = "marginal") -> dict:
    """Whole rounds as a session runs them on the runner's engine (phases timed, no records), median of 12 after 2
    warm-up rounds (the drafter's graphs are captured in those); host time apart: the tree phase (top-k to the host,
    best-first build; the selector's scores to the host) + the runner's own host work (inputs, path). The drafter
    (its family's proposer): the static path (CUDA graphs; what a session takes on CUDA), then the same rounds with
    the dynamic one, then with the static one and the acceptance walk on the host (`round_budget_64_host_walk`:
    follow_tree and a staged path, as before the walk on the device; `walk_device_per_host`) and, for DDTree's
    marginal tree, the tree built on the device and on the host whatever the default (`round_budget_64_device_tree`:
    DeviceTree, the runner's inputs written by the device; `round_budget_64_host_tree`: build_tree, launched ahead;
    `tree_device_per_host`, of the loop_wall_ms), and with each round drafting at its start instead of queuing the
    next round's draft before its record's reads (`round_budget_64_no_queue`; `queue_per_no_queue`, of the
    step_wall_ms), and with each verify graph launched after its tree is staged (`round_budget_64_not_ahead`; the
    default launches it ahead: `launch_ahead_per_not`, of the loop_wall_ms), and with the static drafter's pieces
    not compiled (`round_budget_64_drafter_uncompiled`; `drafter_compiled_per_not`, of the draft phase); where
    the runner holds budget 128's trees, DDTree's marginal rounds at 128 too (`round_budget_128`). The default's
    device timeline (device_timeline: idle gaps a round, from a profile). DDTree at budget 64 (`tree_scoring`), or `method` dflash / dflash2 (the chains). Each variant's
    `step_wall_ms` (a phase-timed round from one step's start to the next) and `loop_wall_ms` (untimed_rounds: the
    same session's next rounds without phase timing) are what the host waits."""
    out: dict = {}
    variants = [("round_budget_64", True, "device", {"timeline": True}),
                ("round_budget_64_dynamic_draft", False, "device", {}),
                ("round_budget_64_host_walk", True, "host", {}),
                ("round_budget_64_no_queue", True, "device", {"queue_draft": False}),
                ("round_budget_64_not_drafted_ahead", True, "device", {"draft_ahead": False, "timeline": True}),
                ("round_budget_64_not_verified_ahead", True, "device", {"verify_ahead": False, "timeline": True}),
                ("round_budget_64_not_ahead", True, "device", {"launch_ahead": False}),
                ("round_budget_64_drafter_uncompiled", True, "device", {"drafter_compile": False})]
    if method == "ddtree" and tree_scoring == "marginal":
        variants += [("round_budget_64_device_tree", True, "device", {"tree_on_device": True}),
                     ("round_budget_64_host_tree", True, "device", {"tree_on_device": False})]
        if engine.tree_size >= 129:  # the runner has a slot for budget 128's trees (--budgets 128)
            variants.append(("round_budget_128", True, "device", {"budget": 128, "timeline": True}))
    default_walk = engine.walk
    try:
        for key, static, walk, options in variants:
            engine.walk = walk
            out[key] = _round_variant(pair, engine, runner, prompt, rounds_tokens, method, tree_scoring, static,
                                      **options)
    finally:  # the engine's own walk back, whatever a variant raised
        engine.walk = default_walk
    default = out["round_budget_64"]
    default["draft_dynamic_per_static"] = out["round_budget_64_dynamic_draft"]["draft"] / default["draft"]
    for name, variant, figure in RATIOS_TO_VARIANTS:  # the default round over each variant's, by the figure it moves
        default[name] = default[figure] / out[f"round_budget_64_{variant}"][figure]
    if "round_budget_64_device_tree" in out:  # of what the host waits a round, phases untimed (where they ran)
        device, host = (out[f"round_budget_64_{k}_tree"]["loop_wall_ms"] for k in ("device", "host"))
        default["tree_device_per_host"] = device / host if device and host else None
    return out


def _round_variant(pair, engine, runner, prompt: list[int], rounds_tokens: int, method: str, tree_scoring: str,
                   static: bool, tree_on_device: bool | None = None, queue_draft: bool | None = None,
                   launch_ahead: bool | None = None, drafter_compile: bool | None = None, timeline: bool = False,
                   budget: int = 64, draft_ahead: bool = True, verify_ahead: bool = True) -> dict:
    """One of runner_rounds' variants: 14 rounds on the engine as it is set, the first two warm-up, per-phase
    medians, the host's speed just after them (host_loop_us), the round as the host sees it and the draft path;
    with `timeline`, the device's idle time in the next untimed rounds (device_timeline)."""
    from ..engine.session import DecodeSession, make_proposer

    options = {"compile": drafter_compile} if static else {}
    proposer = make_proposer(pair.drafter, pair.target, static=static, **options)
    session = DecodeSession(pair, budget=budget, max_new_tokens=rounds_tokens, engine=engine, record=False,
                            time_phases=True, proposer=proposer, method=method, tree_scoring=tree_scoring,
                            tree_on_device=tree_on_device, queue_draft=queue_draft, launch_ahead=launch_ahead,
                            draft_ahead=draft_ahead, verify_ahead=verify_ahead)
    session.prefill(prompt_ids=prompt)
    assert session.cache is runner, "the runner made above has room for these rounds"
    runner.host_ms.clear()
    phases: dict[str, list[float]] = {"draft": [], "tree": [], "verify_commit": [], "host": [], "host_tree": [],
                                      "host_runner": [], "host_draft": []}
    kept, starts = [], []
    for r in range(14):
        starts.append(time.perf_counter())
        step = session.step()
        t = step.timings_ms
        if r >= 2:  # warm-up rounds (the drafter's graphs are captured in the first two)
            phases["draft"].append(t["draft"])
            phases["tree"].append(t["tree"])
            phases["verify_commit"].append(t["verify"] + t["commit"])
            # the host's own time in a round: the tree's making (on the device: the builder's launch) and the
            # runner's (the verify's inputs and launch, the walk's and the commit's); the next draft's launch apart
            phases["host_tree"].append(session.tree_builder.host_ms if session.tree_on_device else t["tree"])
            phases["host_runner"].append(runner.host_ms[-1])
            phases["host"].append(phases["host_tree"][-1] + phases["host_runner"][-1])
            phases["host_draft"].append(getattr(proposer.runner, "host_ms", 0.0))
            kept.append(step.kept)
    out = {k: statistics.median(v) for k, v in phases.items()}
    out["round_ms"] = sum(out[k] for k in ("draft", "tree", "verify_commit"))
    # the host's speed right after the rounds (between them it would be in step_wall_ms)
    out["host_loop_us"] = statistics.median(host_loop_us() for _ in range(12))
    # a round as the host sees it, from one step's start to the next's (what the phases leave out included:
    # the record's reads after the commit)
    out["step_wall_ms"] = median_gap_ms(starts[2:])
    out["loop_wall_ms"] = untimed_rounds(session)
    if timeline:
        out["device_timeline"] = device_timeline(session, loop_wall_ms=out["loop_wall_ms"])
        out["host_profile"] = host_profile(session)
    out.update(draft_path=proposer.path, draft_ahead=session.draft_ahead, verify_ahead=session.verify_ahead,
               verified_ahead=session.verified_ahead, queue_error=session.queue_error,
               method=method, tree_scoring=tree_scoring, mean_kept=sum(kept) / len(kept),
               draft_capture_s=proposer.runner.capture_s if proposer.runner is not None else None)
    return out


def untimed_rounds(session, rounds: int = 8) -> float | None:
    """The median wall time of a round of `session` with its phases untimed (no records, no waits between the
    phases: the device's walk overlaps the commit with the host's read), from one step's start to the next's, over
    up to `rounds` more rounds (None when fewer than 3 fit in its max new tokens)."""
    session.time_phases = False
    starts = []
    try:
        while len(starts) < rounds and not session.done:
            starts.append(time.perf_counter())
            session.step()
    finally:
        session.time_phases = True
    return median_gap_ms(starts) if len(starts) >= 3 else None


def host_profile(session, rounds: int = 6, top: int = 20) -> dict:
    """Where the host's time goes in `rounds` more untimed rounds of `session` (cProfile, whose own cost per Python
    call inflates the Python functions' figures): the functions with the most time of their own, µs a round, the
    waits for the device (synchronize, a tensor's read) among them, so the launches' and the Python's cost apart."""
    import cProfile
    import pstats

    if session.done:
        return {"error": "no rounds left in the session"}
    before = len(session.history)
    profile = cProfile.Profile()
    profile.runcall(untimed_rounds, session, rounds)
    n = len(session.history) - before
    if n < 1:
        return {"error": "no round ran"}
    stats = pstats.Stats(profile).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {"rounds": n, "own_us_per_round": sum(v[2] for v in stats.values()) * 1e6 / n,
            "top": [{"fn": f"{Path(f).name}:{line}:{name}", "calls_per_round": round(v[1] / n, 2),
                     "own_us_per_round": round(v[2] * 1e6 / n, 1), "cum_us_per_round": round(v[3] * 1e6 / n, 1)}
                    for (f, line, name), v in rows]}


def gate_up_forms(runner) -> dict:
    """Per tree size and GEMM library the runner captured: each MLP gate+up form's µs a call, as "auto" timed them
    (RunnerOptions.gate_up), and the form taken."""
    from ..engine.runner import pick_gate_up

    return {f"{size}_{library}": {**timed, "taken": pick_gate_up(timed)}
            for (size, library), timed in runner.gate_up_forms.items()}


def host_loop_us() -> float:
    """The host's own speed now: µs for a fixed pure-Python loop (2,000 multiplies and adds). The H200 machines'
    hosts moved it 0.9-1.7x within one process (docs/lab/NOTEBOOK.md section 31), and every host figure (a launch, a
    round's host time) moves with it, so each is reported beside it."""
    start = time.perf_counter()
    sum(i * i for i in range(2000))
    return (time.perf_counter() - start) * 1e6


def graph_launch(runner, sizes: list[int], sync, repeats: int = 20) -> dict:
    """Issue #31's stall before a verify's first kernel, unprofiled: per tree size, the host's time in the forward
    graph's replay() call with the device idle before it (`launch_us`: what the device waits for once the inputs are
    up), and the replay's whole time to the device's end (`replay_ms`), medians of `repeats`, with the host's speed
    beside each launch (`host_loop_us`, host_loop_us's median). Where the runner has no graphs (a CPU): why not."""
    out = {}
    for size in sizes:
        try:
            slot = runner.slot_for(size)
        except ValueError as exc:  # the runner's length is full: what was measured, and why no more
            return {**out, "error": str(exc)}
        if slot.graph is None:
            return {"error": "the runner has no CUDA graphs here"}
        launch, whole, loop = [], [], []
        for _ in range(repeats):
            sync()
            loop.append(host_loop_us())
            start = time.perf_counter()
            slot.graph.replay()
            launched = time.perf_counter()
            sync()
            launch.append((launched - start) * 1e6)
            whole.append((time.perf_counter() - start) * 1e3)
        out[str(size)] = {"launch_us": statistics.median(launch), "replay_ms": statistics.median(whole),
                          "host_loop_us": statistics.median(loop)}
    return out


def device_timeline(session, rounds: int = 8, loop_wall_ms: float | None = None) -> dict:
    """Issue #31's "gap between rounds on the device's timeline": up to `rounds` more rounds of `session` untimed (as
    untimed_rounds runs them) under torch.profiler's CUDA activity, and from the device's kernels, copies and sets
    its busy time and idle gaps per round (timeline_gaps) and what they are (activity_kinds). The profiler's own cost
    per launch is in the gaps too, so they are an upper bound; `loop_wall_ms` (the same session's unprofiled round)
    minus the busy time is the idle time without it. Two rounds run under the profiler first and are left out: the
    profiler's start (its first launches are slow, and the device runs dry while it starts), then after its wait
    one round that refills what the rounds queue ahead of their read (the next draft, tree and verify: a wait
    drains them, and the device would idle while the host queues them again), so the figures are a steady round's.
    Then the drafter's pass alone (`draft`: the same figures for passes at the session's context, no new rows). On a
    CPU (--smoke) the host's torch ops stand in for the device's activities: the code path, not figures."""
    if session.done:
        return {"error": "no rounds left in the session"}
    counted = []

    def refilled_rounds():  # the warm-up's wait drained what the rounds queue ahead: one round refills it first
        untimed_rounds(session, 1)
        timeline_mark()  # the counted rounds' device work starts here (queued behind the refill, not waited for)
        counted.append(len(session.history))
        untimed_rounds(session, rounds)

    spans = profiled_spans(refilled_rounds, warmup=lambda: untimed_rounds(session, 1))
    n = len(session.history) - counted[0] if counted else 0
    if isinstance(spans, str) or n < 3 or not spans:
        return {"error": spans if isinstance(spans, str) else f"{n} rounds, {len(spans)} device events seen"}
    out = {"rounds": n, "device_events": len(spans), **timeline_gaps(spans, n), "kinds": activity_kinds(spans, n)}
    if loop_wall_ms:  # the same rounds' wall time unprofiled: the device's idle time without the profiler's cost
        out["idle_unprofiled_us_per_round"] = (loop_wall_ms - out["busy_ms_per_round"]) * 1e3
    passes = 8
    draft = profiled_spans(lambda: [session.proposer.propose(session.generated[-1], session.committed_len, None,
                                                             session.block_size) for _ in range(passes)])
    out["draft"] = ({"error": draft} if isinstance(draft, str) else
                    {"passes": passes, "device_events": len(draft), **timeline_gaps(draft, passes, listed=8),
                     "kinds": activity_kinds(draft, passes, top=16)})
    return out


TIMELINE_START = "ddtree_viz.timeline_start"  # profiled_spans' mark after its warm-up (on a CPU's timeline)


def timeline_mark() -> None:
    """A mark on the profiled timeline (profiled_spans keeps what comes after the last one): on CUDA a spin kernel
    of a few cycles queued on the stream (the device's clock, nothing waited for), on a CPU a named host range."""
    from torch.profiler import record_function

    if torch.cuda.is_available():
        torch.cuda._sleep(100)
    else:
        with record_function(TIMELINE_START):
            pass


PROFILER = [True]  # --no-profiler: no torch.profiler timelines (kineto crashed a process once: section 38)


def profiled_spans(fn, warmup=None) -> list[tuple[float, float, str]] | str:
    """The device's activities (start µs, end µs, name) while fn() runs under torch.profiler's CUDA activity, the
    device waited for at the end (without CUDA: the host's torch ops); or why not (a profiler that cannot run here,
    or what fn raised). `warmup()`, if given, runs under the profiler first, the device waited for, and its
    activities are left out: those up to the last mark (timeline_mark: one made after the wait, and any fn makes)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if not PROFILER[0]:
        return "not profiled (--no-profiler)"
    cuda = torch.cuda.is_available()
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    try:
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            if warmup is not None:
                warmup()
                if cuda:
                    torch.cuda.synchronize()
                timeline_mark()
            fn()
            if cuda:
                torch.cuda.synchronize()
        spans = [(e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3, e.name())
                 for e in prof.profiler.kineto_results.events() if e.device_type() == kind]
        if warmup is not None:
            marks = [end for _, end, name in spans if name == TIMELINE_START or "spin_kernel" in name]
            spans = [span for span in spans if not marks or span[0] >= max(marks)]
        return spans
    except Exception as exc:  # say why; the measurements around it come back
        return f"{type(exc).__name__}: {exc}"


def activity_kinds(spans: list[tuple[float, float, str]], rounds: int, top: int = 24) -> list[dict]:
    """The device's activities by kind (their name's first 60 characters), the `top` by time: calls and µs a round,
    what a round's ~1,700 kernels are made of (where fusing would take kernels and their spacing away)."""
    kinds: dict[str, list[float]] = {}
    for start, end, name in spans:
        kind = kinds.setdefault(name[:60], [0, 0.0])
        kind[0] += 1
        kind[1] += end - start
    ranked = sorted(kinds.items(), key=lambda item: -item[1][1])[:top]
    return [{"kind": name, "calls_per_round": calls / rounds, "us_per_round": us / rounds} for name, (calls, us) in ranked]


def timeline_gaps(spans: list[tuple[float, float, str]], rounds: int, stall_us: float = 10.0, listed: int = 24) -> dict:
    """From the device's activities (start µs, end µs, name), over `rounds` rounds: the span from the first start to
    the last end, the busy time (the union of the activities) and the idle time between them, per round; the idle
    split into the spacing of back-to-back kernels (gaps up to `stall_us`: a CUDA graph's kernels start about a
    microsecond apart) and stalls (longer gaps: the device waiting for the host), and the first `listed` stalls in
    timeline order, each with the activity that ends before it and the one that starts after it."""
    spans = sorted(spans)
    busy, gaps = 0.0, []
    seg_start, seg_end, last = spans[0][0], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > seg_end:
            busy += seg_end - seg_start
            gaps.append((start - seg_end, last, name))
            seg_start = start
        if end >= seg_end:
            seg_end, last = end, name
    busy += seg_end - seg_start
    span = seg_end - spans[0][0]
    stalls = [g for g in gaps if g[0] > stall_us]
    return {"span_ms_per_round": span / rounds / 1e3, "busy_ms_per_round": busy / rounds / 1e3,
            "idle_us_per_round": (span - busy) / rounds,
            "spacing_us_per_round": sum(g[0] for g in gaps if g[0] <= stall_us) / rounds,
            "stall_us_per_round": sum(g[0] for g in stalls) / rounds, "stalls_per_round": len(stalls) / rounds,
            "stalls": [{"us": round(us, 1), "after": a[:80], "before": b[:80]} for us, a, b in stalls[:listed]]}


def median_gap_ms(starts: list[float]) -> float:
    """The median milliseconds from one round's start (perf_counter) to the next's."""
    return statistics.median(b - a for a, b in zip(starts, starts[1:])) * 1e3


@torch.no_grad()
def dflash2_speed(bench: BenchConfig, pair, dflash2, engine, runner, prompt: list[int], rounds_tokens: int, token: int,
                  sync) -> dict:
    """Issue #28 item 7, beside DFlash 1 in the same run (same target, prompt and runner): the DFlash2 drafter (the
    shipped Qwen3.8-27B config's shapes, random weights) at its block (8). Its round's pass each way (drafter_pass:
    the static path's graph holds the convolutions and the candidate selector; target <= 3.0 ms, issue #67), whole
    rounds at budget 64 with the selector tree (target <= 1.3x the runner's greedy step) and the DFlash2 chain."""
    drafter, feats = dflash2
    pair2 = dataclasses.replace(pair, drafter=drafter, draft_name="DFlash2 shapes (random weights)")
    out: dict = {"config": DFLASH2_CONFIG, "block": drafter.block_size, "selector_top_k": drafter.top_k,
                 "selector_rank": drafter.config.selector_rank}
    out["drafter_pass"] = drafter_pass(pair.target, drafter, feats, token, sync, repeats=4 if bench.smoke else 20,
                                       limit_ms=3.0)
    out["selector"] = runner_rounds(pair2, engine, runner, prompt, rounds_tokens, tree_scoring="selector")
    out["chain"] = runner_rounds(pair2, engine, runner, prompt, rounds_tokens, method="dflash2")
    return out


def tree_forms(bench: BenchConfig, target, sync, positions=(65, 129), calls: int = 48) -> dict:
    """The tree delta rule's forms, one GDN layer of ``target`` at a time, on random inputs of a tree of depth 15 with
    T = ``positions`` (budgets 64 and 128): microseconds per call of the torch form (compiled where the runner
    compiles), its parallel part (q, k repeated to the value heads and on their key heads) and its solve + output
    product (cuBLAS's, and the Triton kernel's with each product precision), the whole rule in Triton
    (tree_rule_triton; also with each count of rows a program of its parts kernel, `rule_triton_rows_R`, of rows a
    block of its solve, `rule_triton_solve_R`, and its products by Triton's own TF32 split, in one TF32 or in fp32,
    `rule_triton_triton-tf32x3` / `_tf32` / `_ieee`), each Triton form's largest difference from the torch form. On
    CUDA ``calls`` calls are captured in one CUDA graph and replayed (launch cost out, as in the runner); elsewhere
    they are timed eagerly. A form that cannot run here says why."""
    from ..engine import fused as fz
    from ..engine.kernels.device import triton_available
    from ..engine.kernels.gdn_tree.parallel import solve_steps, tree_delta_rule_masked, tree_delta_rule_parts, tree_solve
    from ..engine.gdn_tree import TreeIndex
    from ..engine.runner import RunnerOptions
    from ..engine.verify import gdn_modules

    layer = next(iter(gdn_modules(target).values()))
    H, Hk, K, V = layer.num_v_heads, layer.num_k_heads, layer.head_k_dim, layer.head_v_dim
    dev = torch.device(bench.device)
    compiles = RunnerOptions().resolve(dev).compile
    kernels = bench.cuda and triton_available()  # the Triton forms run here
    gen = torch.Generator().manual_seed(0)
    per_call = functools.partial(per_call_us, bench, timer(sync), calls)
    out: dict = {"heads": H, "key_heads": Hk, "K": K, "V": V, "calls_per_graph": calls if bench.cuda else None,
                 "compiled": compiles}
    for T in positions:
        parents = [-1] + [max(0, i - 1) if i <= 15 else random.Random(i).randrange(15) for i in range(1, T)]
        masks = TreeIndex.build(parents, 4, dev).masks
        q, k = (torch.nn.functional.normalize(torch.randn(T, Hk, K, generator=gen), dim=-1).to(dev) for _ in range(2))
        q = q / K**0.5
        v, state = torch.randn(T, H, V, generator=gen).to(dev), torch.randn(H, K, V, generator=gen).to(dev)
        g, beta = (-2 * torch.rand(T, H, generator=gen)).to(dev), torch.rand(T, H, generator=gen).to(dev)
        qr, kr = q.repeat_interleave(H // Hk, 1), k.repeat_interleave(H // Hk, 1)
        anc, off = masks.anc_float, masks.off_path
        form = fz.compiled(tree_delta_rule_masked) if compiles else tree_delta_rule_masked
        parts_fn = fz.compiled(tree_delta_rule_parts) if compiles else tree_delta_rule_parts
        want = form(qr, kr, v, g, beta, state, anc, off)
        parts = parts_fn(q, k, v, g, beta, state, anc, off)
        steps = solve_steps(anc)
        row = {"steps": int(steps),
               "torch_form_us": per_call(lambda: form(qr, kr, v, g, beta, state, anc, off)),
               "parts_repeated_heads_us": per_call(lambda: parts_fn(qr, kr, v, g, beta, state, anc, off)),
               "parts_key_heads_us": per_call(lambda: parts_fn(q, k, v, g, beta, state, anc, off)),
               "solve_cublas_us": per_call(lambda: tree_solve(*parts))}
        if not kernels:
            row["solve_triton_tf32x3"] = row["solve_triton_ieee"] = row["rule_triton"] = "needs Triton and a CUDA device"
        else:
            row.update(triton_forms(per_call, (q, k, v, g, beta, state, anc, steps), parts, want, T))
            row["solve_by_depth"] = solve_by_depth(per_call, (q, k, v, g, beta, state), T, dev)
            row["rule_tiles"] = rule_tiles(per_call, (q, k, v, g, beta, state, anc, steps), want, H)
        out[str(T)] = row
    return out


def triton_forms(per_call, args, parts, want, T: int) -> dict:
    """tree_forms' Triton rows for one tree: the solve and the whole rule with each product precision (tf32x3, our
    TF32 split, the default; triton-tf32x3 Triton's; tf32 one TF32 product, not fp32-accurate; ieee CUDA-core fp32;
    triton_solve.PRECISIONS), the whole rule with each count of rows a program of its parts kernel below T and of
    rows a block of its solve; each timed and its largest difference from `want` (the torch form). args: q, k (key
    heads), v, g, beta, state, anc_float, steps; parts: the torch form's parts."""
    from ..engine.kernels.gdn_tree.triton_solve import tree_rule_triton, tree_solve_triton

    steps = args[-1]
    forms = {f"solve_triton_{p}": functools.partial(tree_solve_triton, *parts, steps, precision=p)
             for p in ("tf32x3", "ieee")}
    # the whole rule in Triton (two launches), from grouped q/k heads
    forms["rule_triton"] = functools.partial(tree_rule_triton, *args)
    # the products' other precisions: Triton's own three-TF32 split, one TF32 product (what the split's fp32 accuracy
    # costs), CUDA-core fp32
    for precision in ("triton-tf32x3", "tf32", "ieee"):
        forms[f"rule_triton_{precision}"] = functools.partial(tree_rule_triton, *args, precision=precision)
    for rows in (16, 32, 64, 128):  # the parts kernel's rows a program (the default is PARTS_BLOCK_R's)
        if rows < T:
            forms[f"rule_triton_rows_{rows}"] = functools.partial(tree_rule_triton, *args, block_r=rows)
    for rows in (16, 32, 64, 128):  # the solve's rows a block (SOLVE_BLOCK's; 128: one block at every size)
        if rows < T:
            forms[f"rule_triton_solve_{rows}"] = functools.partial(tree_rule_triton, *args, block_s=rows)
    row = {}
    for key, fn in forms.items():
        row[f"{key}_us"] = per_call(fn)
        if not isinstance(row[f"{key}_us"], str):  # (a form that failed says why there)
            row[f"{key}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    return row


def solve_by_depth(per_call, args, T: int, dev, depths=(2, 3, 4, 6, 8, 12, 16)) -> dict:
    """The whole rule in Triton at T positions on trees of each depth (a chain of `depth` nodes from the root, the
    rest children of random chain nodes), its solve over every row at once (`whole_us`) against by blocks of 16
    and 32 rows (`blocks_R_us`, taken whatever the depth): where SOLVE_BLOCK and BLOCKED_FROM come from."""
    from ..engine.kernels.gdn_tree.parallel import solve_steps
    from ..engine.kernels.gdn_tree.triton_solve import tree_rule_triton
    from ..engine.gdn_tree import TreeIndex

    out = {}
    for depth in depths:
        parents = [-1] + [i - 1 if i < depth else random.Random(i).randrange(depth) for i in range(1, T)]
        anc = TreeIndex.build(parents, 4, dev).masks.anc_float
        steps = solve_steps(anc)
        row = {"steps": int(steps), "whole_us": per_call(functools.partial(tree_rule_triton, *args, anc, steps,
                                                                              block_s=128))}
        for rows in (16, 32):
            if rows < T - 1:
                row[f"blocks_{rows}_us"] = per_call(functools.partial(tree_rule_triton, *args, anc, steps,
                                                                      block_s=rows, blocked_from=0))
        out[str(depth)] = row
    return out


def rule_tiles(per_call, args, want, H: int, block_v=(16, 32, 64, 128), warps=(4, 8, 16)) -> dict:
    """The whole rule in Triton by its launches' shapes: the parts kernel alone (`parts_us`, and with 2 / 8 warps a
    program; `parts_group_G_br_R_warps_W_us`: a program per value head (G 0) or per key head (G 1), R rows a
    program; `rule_group_G_us`: the whole rule with each, and its largest difference from the torch form), and the
    whole rule with each value-column block and warp count of its second kernel (`bv_B_warps_W_us`, each with its
    largest difference from the torch form `want`): where RULE_BLOCK_V and the warps by row tile come from. args: q,
    k (key heads), v, g, beta, state, anc_float, steps."""
    from ..engine.kernels.gdn_tree.triton_solve import tree_parts_triton, tree_rule_triton

    q, k, v, g, beta, state, anc, steps = args
    out = {"parts_us": per_call(functools.partial(tree_parts_triton, q, k, g, beta, anc, H))}
    for w in (2, 8):
        out[f"parts_warps_{w}_us"] = per_call(functools.partial(tree_parts_triton, q, k, g, beta, anc, H, warps=w))
    for group, block_r, w in itertools.product((False, True), (16, 32, 64), (4, 8)):  # by value head or key head
        out[f"parts_group_{int(group)}_br_{block_r}_warps_{w}_us"] = per_call(functools.partial(
            tree_parts_triton, q, k, g, beta, anc, H, group=group, block_r=block_r, warps=w))
    for group in (False, True):
        fn = functools.partial(tree_rule_triton, *args, group=group)
        out[f"rule_group_{int(group)}_us"] = per_call(fn)
        out[f"rule_group_{int(group)}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    for bv in block_v:
        if bv > v.shape[-1]:
            continue
        for w in warps:
            fn = functools.partial(tree_rule_triton, *args, block_v=bv, warps=w)
            key = f"bv_{bv}_warps_{w}"
            out[f"{key}_us"] = per_call(fn)
            if not isinstance(out[f"{key}_us"], str):
                out[f"{key}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    return out


def per_call_us(bench: BenchConfig, timed, calls: int, fn) -> float | str:
    """Microseconds a call of fn: on CUDA `calls` calls captured in one CUDA graph and replayed (launch cost out, as
    in the runner), elsewhere timed eagerly; why, where it cannot run."""
    try:
        if not bench.cuda:
            return round(timed(fn, repeats=5) * 1e3, 2)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return round(timed(graph.replay, repeats=10) * 1e3 / calls, 2)
    except Exception as exc:  # a form that cannot run here
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def runner_prefill(runner, prompt: list[int], sync, lengths=(512, 2048), repeats: int = 3) -> dict:
    """The runner's prefill (transformers' forward + the copy into the static state) at each prompt length: the
    first (cold: kernel compilation and autotuning) and the median of `repeats` more."""
    out = {"kernels": prefill_kernels()}
    for n in lengths:
        ids = (prompt * (n // len(prompt) + 1))[:n]
        times = []
        for _ in range(repeats + 1):
            sync()
            start = time.perf_counter()
            runner.prefill(ids)
            sync()
            times.append((time.perf_counter() - start) * 1e3)
        out[f"prefill_{n}_cold_ms"], out[f"prefill_{n}_ms"] = times[0], statistics.median(times[1:])
    return out


def prefill_kernels() -> dict:
    """Which implementation transformers' Qwen3.5 layers run in a CUDA prefill: fla's chunked delta rule (and
    causal-conv1d's conv) when those packages import, else transformers' own torch fallbacks (CPU tensors always
    take those: engine/backends.kernels_follow_device)."""
    import inspect

    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    out = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        fn = getattr(qwen, name, None)
        fn = getattr(fn, "kernel", fn)  # engine/backends.by_device: the CUDA tensors' choice
        impl = None
        while fn is not None and impl is None:  # the hub-kernel wrappers keep the chosen one in a closure
            impl = inspect.getclosurevars(fn).nonlocals.get("implementation") if inspect.isfunction(fn) else None
            fn = getattr(fn, "__wrapped__", None)
        out[name] = f"{impl.__module__}.{impl.__qualname__}" if impl is not None else "unknown"
    out["fla_active"] = out["torch_chunk_gated_delta_rule"].startswith("fla.")
    return out


def runner_variants(bench: BenchConfig, target, prompt, root: int, logprobs, main, sync, bound_ms: float) -> list[dict]:
    """The runner's greedy step and budget-64 / 128 verify with one option switched at a time (the Triton delta
    rule, fused projections, the attention form, the compiled pieces; `bench.variants` says which), each on a
    runner of its own; a variant that cannot run here (no Triton, no GPU) reports why. `compile_s`: the seconds
    the variant's construction spent compiling (torch.compile keeps its graphs per process: a variant after a
    compiled runner of the same model finds them made)."""
    from dataclasses import replace

    from ..engine.engines import RunnerEngine
    from ..engine.runner import StaticRunner
    from ..engine.tree import DraftTree

    timed = timer(sync)
    resolved = main.resolve(torch.device(bench.device))
    switched = [("gdn_kernel", "torch"), ("gdn_kernel", "triton-rule"), ("gdn_kernel", "triton-solve"),
                ("fused", False),
                ("fused", True), ("attention", "sdpa"), ("attention", "eager"), ("compile", False), ("compile", True),
                ("blas", "default"), ("blas", "auto"), ("gate_up", "fused"), ("gate_up", "auto"), ("gdn_step", "torch"),
                ("gdn_step", "triton"), ("commit", "torch"), ("commit", "triton"),
                ("gdn_prep", "triton"), ("gdn_prep", "torch"), ("norm", "triton"), ("norm", "torch"),
                ("pdl", "on"), ("pdl", "off")]
    rows = []
    for field, value in switched:
        if field not in bench.variants:
            continue
        options = replace(resolved, **{field: value})
        try:
            if options.resolve(torch.device(bench.device)) == resolved:  # nothing switched here (blas on a CPU)
                continue
        except ValueError:  # cannot run here: the row below says why
            pass
        row = {"options": asdict(options)}
        trees = {b: DraftTree.from_logprobs(root, logprobs, b) for b in (64, 128)}
        try:
            runner = StaticRunner(target, max_len=len(prompt) + 512, sizes=[1, *(len(t) for t in trees.values())],
                                  options=options)
        except ValueError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        row.update(options=asdict(runner.options), kernel_error=runner.kernel_error, compile_s=runner.compile_s,
                   compile_error=runner.compile_error)  # as it ran
        runner.prefill(prompt)
        engine = RunnerEngine(target, None, tree_size=129, block_size=16, max_new_tokens=256, runner=runner)
        row["greedy_step_ms"] = timed(greedy_stepper(engine, root), repeats=20)
        row["greedy_step_per_bound"] = row["greedy_step_ms"] / bound_ms
        for budget, tree in trees.items():
            row[f"verify_{budget}_ms"] = timed(lambda: runner.forward(tree), repeats=10)
            row[f"verify_{budget}_per_greedy_step"] = row[f"verify_{budget}_ms"] / row["greedy_step_ms"]
        row["blas"] = dict(runner.blas)  # each size's GEMM library (measured where blas="auto")
        row["gate_up_forms"] = gate_up_forms(runner)
        rows.append(row)
        progress("variant", row)  # in the log as it comes: a run stopped by its time limit keeps the rows made
        del engine, runner
        if bench.cuda:
            torch.cuda.empty_cache()
    return rows


def forms_table(fast: dict, bound_ms: float) -> str:
    """The main runner and each variant side by side, one line each (what --variants switched)."""
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    rows = [({**fast["options"], "main": True}, fast["greedy_step_ms"], verify.get(64), verify.get(128), fast["compile_s"])]
    rows += [(v["options"], v.get("greedy_step_ms"), v.get("verify_64_ms"), v.get("verify_128_ms"), v.get("compile_s"))
             for v in fast.get("variants", [])]
    lines = [f"runner forms (bound {bound_ms:.2f} ms): greedy step ms (x bound) | verify 64, 128 ms (x step) | compile s"]
    for opts, step, v64, v128, comp in rows:
        name = " ".join(f"{k}={v}" for k, v in opts.items())
        if step is None:
            lines.append(f"  {name}: did not run")
            continue
        ver = " ".join(f"{v:.2f} ({v / step:.2f}x)" for v in (v64, v128) if v is not None)
        lines.append(f"  {name}: {step:.2f} ({step / bound_ms:.2f}x) | {ver} | {comp or 0:.1f}")
    return "\n".join(lines)


def _target(ms: float, of: float, limit: float, of_name: str) -> dict:
    return {"ms": ms, "ratio": ms / of, "of": of_name, "target": f"<= {limit}x", "met": ms <= limit * of}


def fast_targets(fast: dict, bound_ms: float, draft_ms: float, draft_pass: dict | None = None) -> dict:
    """Issue #18's targets, each figure with its ratio and whether it is met (exactness is added by main())."""
    step = fast["greedy_step_ms"]
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    rnd = fast["round_budget_64"]
    out = {"greedy_step": _target(step, bound_ms, 1.3, "weight-read bound")}
    for budget, limit in ((64, 1.15), (128, 1.4)):
        if budget in verify:
            out[f"verify_{budget}"] = _target(verify[budget], step, limit, "runner greedy step")
    out["draft_in_round"] = {"ms": rnd["draft"], "ratio": rnd["draft"] / step, "of": "runner greedy step",
                             "target": "<= 3 ms", "met": rnd["draft"] <= 3.0, "path": rnd.get("draft_path"),
                             "isolated_draft_ms": draft_ms,
                             "dynamic_in_round_ms": fast.get("round_budget_64_dynamic_draft", {}).get("draft"),
                             "isolated_static_ms": (draft_pass or {}).get("static_ms"),
                             "isolated_dynamic_ms": (draft_pass or {}).get("dynamic_ms")}
    out["round_64"] = _target(rnd["round_ms"], step, 1.5, "runner greedy step")
    out["host_per_round"] = {"ms": rnd["host"], "target": "< 0.5 ms", "met": rnd["host"] < 0.5}
    prefill = fast["prefill"].get("prefill_2048_ms")
    if prefill is not None:
        out["prefill_2048"] = {"ms": prefill, "target": "<= 400 ms", "met": prefill <= 400.0,
                               "fla_active": fast["prefill"]["kernels"]["fla_active"]}
    if "dflash2" in fast and "error" not in fast["dflash2"]:
        out.update(dflash2_targets(fast["dflash2"], step, rnd, draft_pass))
    out["issue_67"] = round_targets(fast, bound_ms)
    return out


def round_targets(fast: dict, bound_ms: float) -> dict:
    """Issue #67's bf16 targets from the same figures: the greedy step <= 1.12x its bound, verify at 64 <= 1.10x and
    at 128 <= 1.25x the step, the round at budget 64 <= 1.18x and at 128 <= 1.35x, host time in a round <= 0.1 ms,
    the device's stalls <= 50 µs a round (device_timeline: its gaps over 10 µs, the one between rounds among them)."""
    step = fast["greedy_step_ms"]
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    out = {"greedy_step": _target(step, bound_ms, 1.12, "weight-read bound")}
    if "greedy_step_chained_ms" in fast:  # the same step with no read between steps: the device's share of it
        out["greedy_step"].update(chained_ms=fast["greedy_step_chained_ms"],
                                  chained_ratio=fast["greedy_step_chained_per_bound"])
    for budget, limit in ((64, 1.10), (128, 1.25)):
        if budget in verify:
            out[f"verify_{budget}"] = _target(verify[budget], step, limit, "runner greedy step")
    for budget, limit in ((64, 1.18), (128, 1.35)):
        if f"round_budget_{budget}" in fast:
            out[f"round_{budget}"] = _target(fast[f"round_budget_{budget}"]["round_ms"], step, limit, "runner greedy step")
    chained = fast.get("greedy_step_chained_ms")
    for key in ("verify_64", "verify_128", "round_64", "round_128"):  # beside the step chained: its host launch apart (section 27)
        if key in out and chained:
            out[key]["ratio_chained"] = out[key]["ms"] / chained
    host = fast["round_budget_64"]["host"]
    out["host_per_round"] = {"ms": host, "target": "<= 0.1 ms", "met": host <= 0.1,
                             "host_loop_us": fast["round_budget_64"].get("host_loop_us")}
    timeline = fast["round_budget_64"].get("device_timeline", {})
    if "stall_us_per_round" in timeline:  # every stall of a round, the one between rounds among them
        stalls = timeline["stall_us_per_round"]
        out["device_stalls_per_round"] = {"us": stalls, "target": "<= 50 us", "met": stalls <= 50,
                                          "stalls_per_round": timeline["stalls_per_round"],
                                          "spacing_us_per_round": timeline["spacing_us_per_round"],
                                          "idle_unprofiled_us_per_round": timeline.get("idle_unprofiled_us_per_round")}
    return out


def dflash2_targets(d2: dict, step: float, rnd: dict, draft_pass: dict | None) -> dict:
    """Issue #28 item 7's targets, each beside DFlash 1's figure of the same run: the DFlash2 drafter's static pass
    at block 8 <= 3.0 ms (issue #67; DFlash 1's at block 16 beside it), its selector round at budget 64 <= 1.3x the runner's
    greedy step (DFlash 1's marginal round beside it)."""
    passes, sel = d2["drafter_pass"], d2["selector"]["round_budget_64"]
    static = passes.get("static_ms")
    out = {"dflash2_draft_pass": {"ms": static, "target": "<= 3.0 ms", "met": static is not None and static <= 3.0,
                                  "block": d2["block"], "path": passes["contexts"]["512"].get("static", {}).get("path"),
                                  "dynamic_ms": passes.get("dynamic_ms"), "in_round_ms": sel["draft"],
                                  "dflash_static_ms": (draft_pass or {}).get("static_ms"), "dflash_in_round_ms": rnd["draft"]}}
    out["dflash2_round_64"] = {**_target(sel["round_ms"], step, 1.3, "runner greedy step"),
                               "tree_scoring": "selector", "draft_path": sel["draft_path"], "host_ms": sel["host"],
                               "dflash_round_ms": rnd["round_ms"], "dflash_ratio": rnd["round_ms"] / step,
                               "dflash2_chain_round_ms": d2["chain"]["round_budget_64"]["round_ms"]}
    return out


def exactness_target(results: list[dict]) -> dict:
    """Issue #18's exactness target: the runner's DDTree == its greedy (and its greedy == transformers') in every
    float32 run at real widths."""
    return {"runs": len(results), "identical": sum(r["identical"] for r in results),
            "target": "every fp32 run identical", "met": bool(results) and all(r["identical"] for r in results)}


def verdict_summary(results: list[dict]) -> dict:
    """A check list's runs by outcome: identical, or diverging with the verdict `noise`, `mismatch` or none (no noise
    measured there); `mismatches_none` is the reduced-precision target (every divergence within the noise)."""
    from ..trace import VERDICT_MISMATCH, VERDICT_NOISE

    counts = {"runs": len(results), "identical": sum(r["identical"] for r in results)}
    for name, verdict in (("noise", VERDICT_NOISE), ("mismatch", VERDICT_MISMATCH), ("unjudged", None)):
        counts[name] = sum(not r["identical"] and r.get("verdict") == verdict for r in results)
    return {**counts, "mismatches_none": counts["mismatch"] == 0 and counts["unjudged"] == 0}


def exactness_setup(bench: BenchConfig, layers: int, dtype: torch.dtype, prompt_len: int, weights: str = "plain"):
    """The exactness checks' target (real widths, random weights; `weights` "fp8" or "int4": quantized weights made
    at random), its pair (no drafter: oracle drafts) and a seeded random prompt."""
    target = (build_target(bench, layers, dtype) if weights == "plain"
              else build_quantized_target(bench, layers, dtype, weights))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist()
    return target, pair_of(bench, target, None, dtype), prompt


@torch.no_grad()
def fast_exactness(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], new_tokens: int,
                   prompt_len: int = 64, ranks_list=((0,), (1,), (0, 2, 1)), weights: str = "plain") -> list[dict]:
    """The runner's DDTree (oracle drafts) vs the runner's greedy, and the runner's greedy vs transformers' (`weights`
    "fp8" or "int4": on quantized weights made at random, each result saying so). Each divergence is judged as the page judges one
    (session.verdict): its margin against the runner's own numerical noise, measured over the same tokens (the
    largest |margin of a chain pass - margin of the one-token step| where both choose the same token)."""
    from ..engine.engines import RunnerEngine
    from ..engine.oracle import OracleProposer
    from ..engine.runner import StaticRunner
    from ..engine.session import DecodeSession, EngineGreedy, GreedyReference, first_divergence, verdict

    target, pair, prompt = exactness_setup(bench, layers, dtype, prompt_len, weights)
    runner = StaticRunner(target, max_len=prompt_len + new_tokens + 512, sizes=[1, *(b + 1 for b in budgets)],
                          options=bench.runner_options())

    def engine(tree_size: int) -> RunnerEngine:  # every check on the one runner (its graphs are captured once)
        return RunnerEngine(target, None, tree_size=tree_size, block_size=16, max_new_tokens=new_tokens, runner=runner)

    # the runner's greedy, then again with its noise measured: chains over the first run's tokens (as long as the
    # runner's largest tree takes) beside the one-token steps, which decide the same tokens
    first = EngineGreedy(engine(1), prompt, set(), control=False).extend_to(new_tokens).ids
    reference = EngineGreedy(engine(1), prompt, set(), chain=min(16, max(budgets) + 1)).extend_to(new_tokens, first)
    greedy, margins, noise = list(reference.ids), reference.margins, reference.noise
    judged = {"runner_noise": noise, "runner_noise_positions": reference.noise_positions,
              "runner_greedy_repeated": greedy == list(first)}  # the same tokens twice (the chains change nothing)
    hf = list(GreedyReference(target, prompt, set()).extend_to(new_tokens).ids)
    idx = first_divergence(greedy, hf)
    results = [{"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weights": weights,
                "check": "runner greedy vs transformers greedy",
                "runner_options": asdict(runner.options), "kernel_error": runner.kernel_error,
                "compile_error": runner.compile_error, "identical": idx is None, "first_divergence": idx,
                "runner_margin_at_divergence": margins[idx] if idx is not None else None,
                "verdict": verdict(margins[idx], noise) if idx is not None else None, **judged}]
    progress("fast_exactness", results[-1])
    for budget in budgets:
        for ranks in ranks_list:
            oracle = OracleProposer(greedy, prompt_len, list(ranks), target.config.vocab_size, block_size=16)
            session = DecodeSession(pair, budget=budget, max_new_tokens=new_tokens, proposer=oracle,
                                    engine=engine(budget + 1), record=False)
            session.prefill(prompt_ids=prompt)
            session.run()
            out, rounds = session.generated, [r.kept for r in session.history]
            idx = first_divergence(out, greedy)
            results.append({"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weights": weights,
                            "check": "runner ddtree vs runner greedy",
                            "budget": budget, "ranks": list(ranks), "rounds": len(rounds),
                            "mean_acceptance": sum(rounds) / len(rounds), "identical": idx is None, "first_divergence": idx,
                            "greedy_margin_at_divergence": margins[idx] if idx is not None else None,
                            "verdict": verdict(margins[idx], noise) if idx is not None else None,
                            "min_greedy_margin": min(margins), **judged})
            progress("fast_exactness", results[-1])
    del runner, target
    if bench.cuda:
        torch.cuda.empty_cache()
    return results


UI_TEXT = "def area(r):\n    return 3.14159 * r * r\n\n"


def ui_prompt(tokens: int, salt: int = 0) -> str:
    """A text of exactly `tokens` bytes (the bench tokenizer's tokens), different for each salt."""
    text = f"# prompt {salt}\n" + UI_TEXT * (tokens // len(UI_TEXT) + 1)
    return text[:tokens]


@torch.no_grad()
def ui_speed(bench: BenchConfig, layers: int, dtype: torch.dtype, budget: int = 64, prompt_len: int = 600,
             steps: int = 12, long_round: int = 100) -> dict:
    """The web page's Step at real shapes: actions.step (the round, records, trace) + render_views (every view)
    through a ModelHost on the runner engine, as `app.py --engine runner` runs it; the page then checks the
    round against the reference (actions.check + render_check), timed apart. A Step is timed as the page runs it:
    the device is waited for once its views are made (a round queues the next round's draft, which the views'
    making overlaps), so `step_ms` is the host's round and `render_ms` the views and any device work left. Next to
    them: the first Step after a new prompt (in a fresh tab: engines built and CUDA graphs captured; and in a tab
    that has run: its engines kept) against that session's prefill, and the bare round (DecodeSession.step alone,
    no records, as `--fast` times it). Targets (issue #13): a Step <= 1.3x the bare round + 10 ms; the first Step
    after a new prompt <= 2x its prefill. Then the same tab goes on to round `long_round`: the Step there
    (`long_step_ms`, `long_render_ms`, `long_ui_step_ms`: medians of its last 5 Steps), what a long session's
    page costs where the views draw the whole output and every round so far."""
    from ..page import actions
    from ..page.state import TabState, read_settings
    from ..page.views import render_check, render_views

    host, sync, build_s = page_host(bench, layers, dtype, budget)
    pair = host.pair
    block = pair.drafter.block_size
    max_new = (max(steps, long_round) + 4) * block  # room for every round below, however much they accept
    controls = lambda prompt: dict(prompt=prompt, budget=budget, block_size=block, max_new_tokens=max_new,  # noqa: E731
                                   verify="exact", method="ddtree")  # the Step tab's, by name

    def ui_step(tab, prompt):
        """(step ms, render ms) of one page Step: the round shown, the check left for after."""
        s = time.perf_counter()
        actions.step(host, tab, read_settings(host, controls(prompt)), check=False)
        m = time.perf_counter()
        render_views(host, tab)
        sync()
        return (m - s) * 1e3, (time.perf_counter() - m) * 1e3

    def ui_check(tab):
        s = time.perf_counter()
        render_check(host, actions.check(host, tab))
        sync()
        return (time.perf_counter() - s) * 1e3

    out: dict = {"layers": layers, "dtype": str(dtype).removeprefix("torch."), "budget": budget,
                 "prompt_tokens": prompt_len, "steps": steps, "build_s": build_s, "load_warmup_s": host.warmup_s}
    tab = TabState()
    step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 0))  # a fresh tab: engines made, graphs captured
    out["first_step_cold_ms"] = step_ms + render_ms
    out["first_step_cold_prefill_ms"] = tab.session.prefill_ms
    out["first_check_cold_ms"] = ui_check(tab)
    samples: dict[str, list[float]] = {"step": [], "render": [], "ui_step": [], "check": []}
    for _ in range(steps):
        step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 0))
        for key, ms in (("step", step_ms), ("render", render_ms), ("ui_step", step_ms + render_ms)):
            samples[key].append(ms)
        samples["check"].append(ui_check(tab))
    out.update(session_figures(tab.session))
    for key, values in samples.items():
        out[f"{key}_ms"] = statistics.median(values)
    out["step_profile"] = step_profile(tab, lambda: ui_step(tab, ui_prompt(prompt_len, 0)))
    out.update(long_steps(tab, ui_step, ui_check, lambda: ui_prompt(prompt_len, 0), long_round))
    out["long_step_profile"] = step_profile(tab, lambda: ui_step(tab, ui_prompt(prompt_len, 0)))

    # a new prompt in the same tab: its engines are kept
    step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 1))
    out["first_step_ms"] = step_ms + render_ms
    out["prefill_ms"] = tab.session.prefill_ms
    out["first_check_ms"] = ui_check(tab)
    out.update(against_reference(tab.trace))

    # the independent check (transformers' forward) over the tokens shown, its own time
    s = time.perf_counter()
    actions.check_transformers(host, tab)
    result, seconds = tab.session.check_transformers()
    out["independent_check"] = {"tokens": len(result.ids), "ms": seconds * 1e3,
                                "agrees": tuple(result.ids) == tuple(tab.session.generated[:len(result.ids)]),
                                "wall_ms": (time.perf_counter() - s) * 1e3}
    out.update(bare_rounds(pair, budget, max_new, list(ui_prompt(prompt_len, 2).encode()), steps, sync))
    out.update(ui_targets(out))
    if bench.cuda:
        out["peak_memory_GiB"] = peak_memory_gib(bench)
        del pair, host, tab
        torch.cuda.empty_cache()
    return out


def against_reference(trace) -> dict:
    """Whether the tab's output equals its reference, and where it does not, the divergence's token, margin, verdict
    and the measured noise (bf16 at random weights: near-ties, said, never hidden)."""
    out = {"output_identical_to_reference": trace.first_divergence is None and not trace.reference_pending}
    if trace.first_divergence is not None:
        out["divergence"] = {"token": trace.first_divergence, "margin": trace.divergence_margin,
                             "verdict": trace.divergence_verdict, "noise": trace.numerical_noise}
    return out


def long_steps(tab, ui_step, ui_check, prompt, long_round: int, timed: int = 5) -> dict:
    """ui_speed's tab stepped on (each Step checked, as the page does) to round `long_round`, its last `timed` Steps
    timed: medians of the Step, the views and both; {} where the session ended first."""
    samples = []
    while len(tab.trace.steps) < long_round and not tab.session.done:
        samples.append(ui_step(tab, prompt()))
        ui_check(tab)
    if len(tab.trace.steps) < long_round or len(samples) < timed:
        return {}
    step_ms, render_ms = (statistics.median(col) for col in zip(*samples[-timed:]))
    records = tab.session.history[-timed:]  # where the Step's time went: the rounds' phases (device) or the host
    return {"long_round": len(tab.trace.steps), "long_step_ms": step_ms, "long_render_ms": render_ms,
            "long_token_texts": len(tab.trace.token_texts),  # the ids the trace names (random weights: many)
            "long_ui_step_ms": statistics.median(a + b for a, b in samples[-timed:]),
            "long_round_phases_ms": {k: statistics.median(r.timings_ms[k] for r in records)
                                     for k in records[0].timings_ms}}


def step_profile(tab, step) -> dict | str:
    """One more page Step under the profiler: its round's number and lengths (committed tokens, the runner's and the
    drafter's key buckets), the device's busy and idle time (timeline_gaps) and its activities by kind: a long
    session's Step set beside an early one tells the device's growth from the host's."""
    session = tab.session
    spans = profiled_spans(step)
    if isinstance(spans, str) or not spans:
        return spans or "no device activity"
    runner, drafter = session.target_engine.runner, session.proposer.runner
    return {"round": len(session.history), "committed": int(runner.committed),
            "runner_slots": sorted(str(k) for k in runner._slots),
            "drafter_max_len": getattr(drafter, "max_len", None), "gaps": timeline_gaps(spans, 1, listed=8),
            "kinds": activity_kinds(spans, 1, top=16)}


def page_host(bench: BenchConfig, layers: int, dtype: torch.dtype, budget: int):
    """(a page's ModelHost on the runner engine holding the 27B-shaped pair, its device sync, seconds to build the
    models): what the page's load does (ModelHost._load: the runner's compile and a first round, here at `budget`),
    before any Step."""
    from ..engine.cache import cache_layout
    from ..engine.verify import device_sync
    from ..page.host import ModelHost
    from ..render.cache_view import cache_layout_table

    t0 = time.perf_counter()
    target = build_target(bench, layers, dtype)
    drafter = build_drafter(bench, target, dtype)
    build_s = time.perf_counter() - t0
    pair = pair_of(bench, target, drafter, dtype)
    host = ModelHost(None, None, str(dtype).removeprefix("torch."), bench.device, engine="runner")
    host.pair, host.layout, host.stage = pair, cache_layout_table(cache_layout(target, pair.layer_types)), "ready"
    host.warmup_s = host.warm(pair, budget)
    return host, device_sync(target, drafter), build_s


def session_figures(session) -> dict:
    """What ui_speed reports of the page session after its Steps: the rounds' median phases (the first round apart:
    its draft ran the drafter at a new shape first), each round's draft, acceptance, the reference's cost, the
    runner's options and the drafter's path."""
    records = session.history[1:]
    proposer = session.proposer  # the page's default: the static drafter (CUDA graphs) on one GPU
    return {"round_phases_ms": {k: statistics.median(r.timings_ms[k] for r in records) for k in records[0].timings_ms},
            "draft_ms_per_round": [r.timings_ms["draft"] for r in session.history],  # steady, or a spike per shape?
            "mean_acceptance": session.mean_acceptance,
            "reference_ms_per_token": session.greedy_seconds * 1e3 / max(1, len(session.generated)),
            "reference": session.reference,
            "runner_options": asdict(session.target_engine.runner.options),
            "draft_path": proposer.path,
            "draft_capture_s": proposer.runner.capture_s if proposer.runner is not None else None}


def bare_rounds(pair, budget: int, max_new: int, prompt_ids: list[int], steps: int, sync) -> dict:
    """The bare round: DecodeSession.step alone on the runner (phases timed), without records and with them (the tree
    where the session builds it by default, and recorded with the host's tree: `bare_round_recorded_host_tree_ms`);
    the median ms of `steps` rounds after 2 warm-up rounds (graph capture, the drafter's first shapes)."""
    from ..engine.session import DecodeSession

    out = {}
    for key, record, on_device in (("bare_round_ms", False, None), ("bare_round_recorded_ms", True, None),
                                   ("bare_round_recorded_host_tree_ms", True, False)):
        session = DecodeSession(pair, budget=budget, max_new_tokens=max_new, engine="runner", record=record,
                                time_phases=True, tree_on_device=on_device)
        session.prefill(prompt_ids=prompt_ids)
        times = []
        for r in range(steps + 2):
            s = time.perf_counter()
            session.step()
            sync()
            if r >= 2:  # warm-up rounds (graph capture, the drafter's first shapes)
                times.append((time.perf_counter() - s) * 1e3)
        out[key] = statistics.median(times)
        del session
    return out


# the oracle drafter's rank of the true token, position by position (cycled): the chain stops at the first rank
# above 0, a tree reaches ranks 1-3 where its budget allows: an acceptance the run controls
COST_RANKS = (0, 0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 3)


@torch.no_grad()
def cost_study(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], prompt_len: int = 512,
               rounds: int = 8, ranks=COST_RANKS) -> dict:
    """issue #30 at real shapes: the runner's cost table (engine/costs.py: a round per budget, the chain's round,
    greedy's step) with the DFlash drafter's real pass, and S(b) (speedup.py) at an acceptance the run controls.
    Tokens per round come from an oracle drafter (the target's own greedy tokens at ranks `ranks`) on the target at
    real widths, 8 layers, float32, where the tree's decode equals greedy exactly (a bf16 target with random weights
    has near-zero margins: its greedy and its tree passes part at once, and the oracle would draft the wrong tokens);
    a session at the largest budget gives the counterfactual for every smaller one, a chain session the chain's."""
    from ..engine.costs import measure_costs
    from ..speedup import predict, tokens_per_round

    target, drafter, sync, out = measured_models(bench, layers, dtype)
    pair = pair_of(bench, target, drafter, dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist()
    t0 = time.perf_counter()
    table = measure_costs(pair, prompt, budgets, engine="runner", rounds=rounds)
    out["measure_s"] = time.perf_counter() - t0
    out["costs"] = table.to_dict()
    del pair, target, drafter
    if bench.cuda:
        torch.cuda.empty_cache()
    runs, out["oracle"] = oracle_rounds(bench, max(budgets), table.block_size, rounds, ranks)
    prediction = predict(runs["ddtree"], table, tokens_per_round(runs["dflash"]))
    out["speedup"] = prediction.to_dict()
    out["cost_table"] = cost_lines(table, prediction)
    return out


def oracle_rounds(bench: BenchConfig, budget: int, block: int, rounds: int, ranks, prompt_len: int = 64):
    """DDTree at `budget` and the chain, oracle drafts at `ranks`, on the fp32 8-layer real-width target: their
    rounds, and what they were (ranks, layers, whether each decode equals the runner's greedy)."""
    from ..engine.engines import RunnerEngine
    from ..engine.oracle import OracleProposer
    from ..engine.runner import StaticRunner
    from ..engine.session import DecodeSession, EngineGreedy

    layers = 8 if not bench.smoke else 4
    target, pair, prompt = exactness_setup(bench, layers, torch.float32, prompt_len)
    new = (rounds + 2) * block
    runner = StaticRunner(target, max_len=prompt_len + new + 512, sizes=[1, block, budget + 1],
                          options=bench.runner_options())

    def engine(tree_size: int) -> RunnerEngine:
        return RunnerEngine(target, None, tree_size=tree_size, block_size=block, max_new_tokens=new, runner=runner)

    greedy = list(EngineGreedy(engine(1), prompt, set(), with_margins=False).extend_to(new).ids)
    runs, info = {}, {"ranks": list(ranks), "layers": layers, "dtype": "float32", "budget": budget}
    for method, b, size in (("ddtree", budget, budget + 1), ("dflash", 1, block)):
        oracle = OracleProposer(greedy, prompt_len, list(ranks), target.config.vocab_size, block_size=block)
        session = DecodeSession(pair, budget=b, method=method, max_new_tokens=new, proposer=oracle,
                                engine=engine(size), record=False, block_size=block)
        session.prefill(prompt_ids=prompt)
        runs[method] = session.run()
        info[f"{method}_identical_to_greedy"] = session.generated == greedy[:len(session.generated)]
    del runner, target
    if bench.cuda:
        torch.cuda.empty_cache()
    return runs, info


def cost_lines(table, prediction) -> str:
    """The cost table and S(b) as text: one row per budget, the chain last."""
    head = (f"{'budget':>7} {'draft':>7} {'tree':>7} {'verify':>7} {'commit':>7} {'host':>7} {'round':>8} "
            f"{'x step':>7} {'tau':>6} {'S(b)':>6}")
    lines = [f"greedy step {table.greedy_ms:.2f} ms", head]
    rows = [(str(b), c, prediction.budgets.get(b)) for b, c in sorted(table.rounds.items())]
    rows.append(("chain", table.chain, prediction.chain))
    for label, c, p in rows:
        tail = f" {p.tau:>6.2f} {p.speedup:>6.2f}" if p is not None else ""
        lines.append(f"{label:>7} {c.draft:>7.2f} {c.tree:>7.2f} {c.verify:>7.2f} {c.commit:>7.2f} {c.host:>7.2f} "
                     f"{c.total:>8.2f} {c.total / table.greedy_ms:>7.2f}{tail}")
    lines.append(f"best budget {prediction.best_budget}, break-even budget {prediction.break_even_budget}")
    return "\n".join(lines)


def ui_targets(out: dict) -> dict:
    """Issue #13's targets from ui_speed's figures: a Step <= 1.3x the bare round + 10 ms; the first Step after a
    new prompt <= 2x its prefill."""
    target_ms = 1.3 * out["bare_round_ms"] + 10
    per_prefill = out["first_step_ms"] / out["prefill_ms"]
    return {"ui_step_target_ms": target_ms, "ui_step_per_bare_round": out["ui_step_ms"] / out["bare_round_ms"],
            "ui_step_target_met": out["ui_step_ms"] <= target_ms, "first_step_per_prefill": per_prefill,
            "first_step_target_met": per_prefill <= 2,
            "first_step_cold_per_prefill": out["first_step_cold_ms"] / out["first_step_cold_prefill_ms"],
            "long_ui_step_per_bare_round": (out["long_ui_step_ms"] / out["bare_round_ms"]
                                            if "long_ui_step_ms" in out else None)}


def peak_memory_gib(bench: BenchConfig) -> dict[str, float] | None:
    if not bench.cuda:
        return None
    return {f"cuda:{d}": torch.cuda.max_memory_allocated(d) / 2**30 for d in range(torch.cuda.device_count())}


@torch.no_grad()
def session_rounds(bench: BenchConfig, target, drafter, dtype, prompt: list[int], budget: int = 64,
                   rounds: int = 12) -> dict:
    """Whole DDTree rounds as the tool runs them (DFlash draft, tree, exact verify, commit, records), median
    per phase. Random weights accept little, so this measures cost per round, not speed-up."""
    from ..engine.session import DecodeSession

    session = DecodeSession(pair_of(bench, target, drafter, dtype), budget=budget, max_new_tokens=2048,
                            engine="transformers")  # section 3 measures transformers' forward; the runner has its own
    session.prefill(prompt_ids=prompt)
    session.step()  # warm-up
    records = [session.step() for _ in range(rounds)]
    phases = {k: statistics.median(r.timings_ms[k] for r in records) for k in records[0].timings_ms}
    return {"budget": budget, "rounds": rounds, "median_ms": phases, "round_ms": sum(phases.values()),
            "mean_acceptance": sum(r.kept for r in records) / rounds}


@torch.no_grad()
def exactness(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], new_tokens: int,
              prompt_len: int = 64, ranks_list=((0,), (1,), (0, 2, 1))) -> list[dict]:
    """DDTree (oracle drafts at chosen ranks, so trees are deep) vs the target's own greedy decoding."""
    from ..engine.oracle import OracleProposer
    from ..engine.session import DecodeSession, GreedyReference, first_divergence

    target, pair, prompt = exactness_setup(bench, layers, dtype, prompt_len)
    greedy = GreedyReference(target, prompt, set()).extend_to(new_tokens)
    results = []
    for budget in budgets:
        for ranks in ranks_list:
            oracle = OracleProposer(greedy.ids, prompt_len, list(ranks), target.config.vocab_size, block_size=16)
            session = DecodeSession(pair, budget=budget, max_new_tokens=new_tokens, proposer=oracle,
                                    engine="transformers")  # the runner's exactness: fast_exactness
            session.prefill(prompt_ids=prompt)
            session.run()
            idx = first_divergence(session.generated, greedy.ids)
            results.append({
                "layers": layers, "dtype": str(dtype).removeprefix("torch."), "budget": budget, "ranks": list(ranks),
                "tokens": len(session.generated), "rounds": len(session.history), "mean_acceptance": session.mean_acceptance,
                "identical": idx is None, "first_divergence": idx,
                "greedy_margin_at_divergence": greedy.margins[idx] if idx is not None else None,
                "min_greedy_margin": min(greedy.margins),
                **({"layer_devices": layer_devices(target)} if bench.split else {}),
            })
            progress("exactness", results[-1])
    del target
    if bench.cuda:
        torch.cuda.empty_cache()
    return results


def quantized_arguments(p: argparse.ArgumentParser) -> None:
    """build_parser's options for the quantized targets (issue #29): FP8 and 4-bit weights made at random."""
    p.add_argument("--fp8", action="store_true",
                   help="--fast: also the target with FP8 weights made at random (128x128 blocks, kept as fp8 on the GPU) "
                        "on the runner beside bf16, after the bf16 target is freed: its weight-read bound, greedy step, "
                        "verify, rounds at budget 64, each GEMM, and the peak memory of a session at --fp8-context "
                        "tokens and budget 64 under --fp8-memory-cap (speed.fast.fp8; targets fp8_*); with --exactness "
                        "the runner's exactness on FP8 weights too (with --skip-speed as well: the checks alone)")
    p.add_argument("--fp8-memory-cap", type=float, default=40.0, metavar="GB",
                   help="--fp8: the process's GPU memory cap (GB) while the FP8 target runs (default: 40)")
    p.add_argument("--fp8-context", type=int, default=4096,
                   help="--fp8, --int4: the peak-memory session's prompt (default: 4096)")
    p.add_argument("--int4", action="store_true",
                   help="--fast: also the target with 4-bit weights made at random (W4A16: symmetric, groups of 128, "
                        "kept packed on the GPU, engine/int4_gemm.py) on the runner beside bf16, after the bf16 (and "
                        "FP8) target is freed: its weight-read bound, greedy step, verify, rounds at budget 64, each GEMM "
                        "and the peak memory of a session under --int4-memory-cap (speed.fast.int4; targets int4_*); with "
                        "--exactness the runner's exactness on 4-bit weights too")
    p.add_argument("--int4-memory-cap", type=float, default=24.0, metavar="GB",
                   help="--int4: the process's GPU memory cap (GB) while the 4-bit target runs (default: 24)")


def build_parser() -> argparse.ArgumentParser:
    from ..engine.kernels.device import ONE_LAUNCH_CHOICES
    from ..engine.kernels.gdn_tree.dispatch import GDN_KERNELS
    from ..engine.kernels.pdl import CHOICES as PDL_CHOICES
    from ..engine.runner import BLAS_CHOICES, GATE_UP_CHOICES

    p = argparse.ArgumentParser(prog="python -m ddtree_viz.benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--exactness", action="store_true", help="fp32 real widths (8 layers) + bf16 full depth vs greedy")
    p.add_argument("--exactness-weights", nargs="+", choices=("plain", *QUANTIZED), metavar="W",
                   help="with --exactness: only these weights' checks (plain, fp8, int4; default: plain and each of "
                        "--fp8 / --int4), so that the checks can be split over calls of a time limit")
    p.add_argument("--quantized-only", action="store_true",
                   help="with --fp8 / --int4: only the quantized targets, no bf16 target before them (quantized_alone)")
    p.add_argument("--int4-drafter", action="store_true", help="with --quantized-only: the drafter's Linears 4-bit")
    p.add_argument("--int4-tune", action="store_true",
                   help="only the 4-bit GEMM's launches swept at the 27B's shapes (benchmarks/int4_tune.py)")
    p.add_argument("--no-profiler", action="store_true",
                   help="no device timelines through torch.profiler (each comes back as 'not profiled')")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--device-map", choices=("none", "auto"), default="none",
                   help="auto: split the target's layers over every visible GPU with accelerate (drafter on the first)")
    p.add_argument("--fast", action="store_true", help="also measure the static runner (CUDA graphs), and check its exactness")
    p.add_argument("--ui", action="store_true",
                   help="the web page's Step at these shapes on the runner (ui.step + ui.render_views, then the check "
                        "against the reference), the first Step after a new prompt, the bare round (issue #13's targets)")
    p.add_argument("--ui-prompt-tokens", type=int, default=600, help="--ui: prompt length (default: 600)")
    p.add_argument("--ui-steps", type=int, default=12, help="--ui: Steps measured (medians; default: 12)")
    p.add_argument("--fast-only", action="store_true",
                   help="the runner only: of transformers' forward just the bound, prefill, greedy step and drafter pass; "
                        "with --exactness, check the runner only")
    p.add_argument("--gdn-kernel", choices=GDN_KERNELS, default="auto",
                   help="the runner's delta rule: auto = the tree delta rule in Triton (triton-rule) on CUDA when "
                        "Triton imports, else torch")
    p.add_argument("--no-fused", action="store_true", help="the runner without fused projections")
    p.add_argument("--attention", choices=("eager", "sdpa"), default="eager", help="the runner's attention form")
    p.add_argument("--no-compile", action="store_true",
                   help="the runner without its torch.compile'd elementwise pieces (the compiled form is then a variant)")
    p.add_argument("--blas", choices=BLAS_CHOICES, default="auto",
                   help="the runner's GEMM library: auto = cuBLAS or cuBLASLt, whichever replays a tree size's graph "
                        "faster (measured when the size is first captured)")
    p.add_argument("--gate-up", choices=GATE_UP_CHOICES, default="auto",
                   help="the runner's MLP gate+up GEMM: auto = the fastest of fused, split and padded, timed per tree "
                        "size and library at its first capture")
    for flag, what, launch, otherwise in (  # RunnerOptions' one-launch pieces (dispatch.ONE_LAUNCH_CHOICES)
            ("--gdn-step", "one-node GDN core (the greedy step)", "a layer (delta_rule/triton_step.py)",
             "the tree form's own"),
            ("--commit", "commit of the GDN states", "for every layer (delta_rule/triton_commit.py)",
             "a batched matmul and a pass"),
            ("--gdn-prep", "GDN conv, l2 norms and gates over a tree", "a layer (delta_rule/triton_step.py)",
             "the compiled piece"),
            ("--norm", "residual add and the norm after it", "each, a program a row (engine/triton_norm.py)",
             "the compiled piece")):
        p.add_argument(flag, choices=ONE_LAUNCH_CHOICES, default="auto",
                       help=f"the runner's {what}: auto = one Triton launch {launch} on CUDA when Triton imports, "
                            f"else {otherwise}")
    p.add_argument("--pdl", choices=PDL_CHOICES, default="auto",
                   help="the runner's one-row FP8 products and add + norm launches launched behind the kernel before "
                        "them (programmatic dependent launch, engine/pdl.py): auto = on for a CUDA device of compute "
                        "capability 9.0 or later with Triton")
    p.add_argument("--variants", nargs="*", choices=VARIANT_FIELDS, default=list(VARIANT_FIELDS), metavar="OPTION",
                   help="--fast: the runner options switched one at a time in speed.fast.variants (default: all of "
                        f"{', '.join(VARIANT_FIELDS)}; none: no variants)")
    p.add_argument("--tree-forms", action="store_true",
                   help="--fast: also sweep the tree delta rule's forms, precisions and tiles one GDN layer at a time "
                        "(speed.fast.tree_forms: minutes on a GPU, so asked for apart from issue #31's figures)")
    p.add_argument("--dflash2", action="store_true",
                   help="--fast: also the DFlash2 drafter (qwen3.8-27b-dflash2-config.json, random weights) beside DFlash "
                        "1 on the runner: its pass at block 8 and whole rounds at budget 64 with the selector tree "
                        "(speed.fast.dflash2; targets dflash2_draft_pass, dflash2_round_64)")
    quantized_arguments(p)
    p.add_argument("--costs", action="store_true",
                   help="issue #30: the runner's cost table at --budgets and S(b) at an oracle-controlled acceptance")
    p.add_argument("--smoke", action="store_true", help="toy widths on the CPU: checks the script, measures nothing real")
    return p


def checked_flags(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The combinations that measure nothing, refused (argparse's error: exit 2)."""
    if a.dflash2 and (not a.fast or a.skip_speed or a.device_map == "auto"):
        parser.error("--dflash2 measures on the static runner: it needs --fast, without --skip-speed or --device-map auto")
    for flag in ("fp8", "int4"):
        if getattr(a, flag) and (not a.fast or (a.skip_speed and not a.exactness) or a.device_map == "auto"):
            parser.error(f"--{flag} measures on the static runner: it needs --fast, without --device-map auto, and "
                         "without --skip-speed unless --exactness (then the exactness checks alone, plain and "
                         "quantized weights)")
    if a.quantized_only and (not (a.fp8 or a.int4) or a.skip_speed):
        parser.error("--quantized-only measures the --fp8 / --int4 targets: name one, without --skip-speed")
    if a.int4_drafter and not a.quantized_only:
        parser.error("--int4-drafter goes with --quantized-only")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    checked_flags(parser, a)
    bench = BenchConfig.from_args(a)
    PROFILER[0] = not a.no_profiler
    try:
        return measure(a, bench)
    finally:
        PROFILER[0] = True  # the module's default again (tests call main in one process)


def measure(a: argparse.Namespace, bench: BenchConfig) -> int:
    """What the flags ask for, measured part by part, the report saved after each part (--json)."""
    if not a.smoke and not torch.cuda.is_available():
        raise SystemExit("error: gpu_bench needs a CUDA GPU (or --smoke for a CPU check of the script)")
    if bench.quantized and bench.cuda:  # before the first allocation, so that every segment can grow (weights/load.py)
        from ..engine.weights.load import expandable_segments

        expandable_segments()
    report = {"device": torch.cuda.get_device_name() if bench.cuda else "cpu (smoke)", "torch": torch.__version__,
              "gpus": torch.cuda.device_count() if bench.cuda else 0, "device_map": a.device_map}
    import transformers

    report["transformers"] = transformers.__version__

    def save():  # after every part, so that a run stopped midway keeps what it measured
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))

    if a.int4_tune:
        report["int4_tune"] = int4_tune(bench, getattr(torch, a.dtype))
        save()
        return 0
    if a.quantized_only:
        report["speed"] = quantized_alone(bench, a.layers, getattr(torch, a.dtype), a.budgets)
        print(json.dumps({"targets": report["speed"]["fast"]["targets"]}, indent=1), flush=True)
        save()
        return 0
    if not a.skip_speed:
        report["speed"] = speed(bench, a.layers, getattr(torch, a.dtype), a.budgets)
        print(json.dumps(report["speed"], indent=1), flush=True)
        save()
    if a.costs:
        report["costs"] = cost_study(bench, a.layers, getattr(torch, a.dtype), a.budgets)
        print(report["costs"]["cost_table"], flush=True)
        save()
    if a.ui:
        report["ui"] = ui_speed(bench, a.layers, getattr(torch, a.dtype), prompt_len=a.ui_prompt_tokens,
                                steps=a.ui_steps)
        print(json.dumps(report["ui"], indent=1), flush=True)
        save()
    checks = []  # transformers' forward (DecodeSession), then the static runner
    chosen = set(a.exactness_weights or ("plain", *bench.quantized))
    if a.exactness and not a.fast_only and "plain" in chosen:
        checks.append(("exactness", exactness))
    if a.exactness and bench.fast and not bench.split and "plain" in chosen:
        checks.append(("fast_exactness", fast_exactness))
    for name, check in checks:
        report[f"{name}_fp32_8_layers"] = check(bench, 8 if not a.smoke else 4, torch.float32, [4, 32, 64], a.new_tokens)
        save()
        report[f"{name}_bf16_full_depth"] = check(bench, a.layers, torch.bfloat16, [32], a.new_tokens,
                                                  ranks_list=((0,), (1,)))
        save()
    for weights in [w for w in bench.quantized if w in chosen] if a.exactness else ():  # quantized weights' checks
        report[f"fast_exactness_{weights}_fp32_8_layers"] = fast_exactness(
            bench, 8 if not a.smoke else 4, torch.float32, [4, 32, 64], a.new_tokens, weights=weights)
        save()
        report[f"fast_exactness_{weights}_bf16_full_depth"] = fast_exactness(
            bench, a.layers, torch.bfloat16, [32, 64], a.new_tokens, ranks_list=((0,), (1,)), weights=weights)
        save()
    verdicts = {key: verdict_summary(runs) for key, runs in report.items() if key.startswith("fast_exactness")}
    if verdicts:  # every runner check's outcome at a glance, the reduced-precision ones' verdicts among them
        report["fast_exactness_verdicts"] = verdicts
        print(json.dumps({"fast_exactness_verdicts": verdicts}), flush=True)
    fast = report.get("speed", {}).get("fast")
    if fast is not None and "fast_exactness_fp32_8_layers" in report:
        fast["targets"]["exactness_fp32"] = exactness_target(report["fast_exactness_fp32_8_layers"])
    for weights in bench.quantized:
        if fast is not None and f"fast_exactness_{weights}_fp32_8_layers" in report:
            fast["targets"][f"{weights}_exactness_fp32"] = exactness_target(
                report[f"fast_exactness_{weights}_fp32_8_layers"])
    if fast is not None:
        print(json.dumps({"targets": fast["targets"]}, indent=1), flush=True)
        print(forms_table(fast, report["speed"]["weight_read_bound_ms"]), flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a gpu_bench run builds and measures (BenchConfig, from the command line) and the shapes and formats every
part shares: the --smoke widths, the runner's parts, the quantized formats made at random."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ...engine.weights.at_load import FP8_BLOCK, INT4_GROUP  # noqa: F401 (the formats' one definition)


# --smoke: the same code path at toy widths, to check the script on a CPU before spending GPU time
SMOKE_TARGET = dict(hidden_size=128, intermediate_size=256, vocab_size=1024, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
                    linear_value_head_dim=16)
SMOKE_DRAFT = dict(hidden_size=128, intermediate_size=256, vocab_size=1024, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=32)

# the runner's parts, every one (engine/runner/options.py PARTS, in its order; BenchConfig holds each, forced into
# every runner it builds; runner_variants can switch each)
VARIANT_FIELDS = ("gdn_kernel", "fused", "attention", "compile", "blas", "gate_up", "gdn_step", "commit", "gdn_prep",
                  "norm", "pdl")

QUANTIZED = ("fp8", "int4")  # the weight formats made at random beside bf16 (BenchConfig fields of these names)
FORMAT_NAMES = {"fp8": "FP8", "int4": "4-bit"}


@dataclass(frozen=True)
class BenchConfig:
    """How this run builds and measures, from the command line (``main``); passed to what depends on it."""

    smoke: bool = False  # --smoke: toy widths (SMOKE_TARGET / SMOKE_DRAFT) on the CPU
    device: str = "cuda"  # "cpu" with --smoke
    split: bool = False  # --device-map auto: the target's layers spread over every visible GPU, as from_pretrained does
    fast: bool = False  # --fast: also measure the static runner (engine/runner.py)
    fast_only: bool = False  # --fast-only: of transformers' forward only the bound, prefill and greedy step
    gdn_kernel: str = "auto"  # the runner's parts (PARTS): --gdn-kernel, --no-fused, --attention, --no-compile
    fused: bool | None = None
    attention: str = "eager"
    compile: bool | None = None
    blas: str = "auto"
    gate_up: str = "auto"  # --gate-up: the MLP's gate+up GEMM form (the part gate_up)
    gdn_step: str = "auto"  # --gdn-step: the one-node pass's GDN core (the part gdn_step)
    commit: str = "auto"  # --commit: the commit's recurrent-state update (the part commit)
    gdn_prep: str = "auto"  # --gdn-prep: a tree's GDN conv, l2 norms and gates (the part gdn_prep)
    norm: str = "auto"  # --norm: a layer's residual add and the norm after it (the part norm)
    pdl: str = "auto"  # --pdl: programmatic dependent launch of the one-row FP8 products and add + norms (.pdl)
    variants: tuple[str, ...] = VARIANT_FIELDS  # --variants: the parts runner_variants switches, one at a time
    dflash2: bool = False  # --dflash2: with --fast, the DFlash2 drafter beside DFlash 1 (dflash2_speed)
    fp8: bool = False  # --fp8: with --fast, the target with FP8 weights made at random beside bf16 (quantized_speed)
    fp8_cap_gb: float = 40.0  # --fp8-memory-cap: the process's GPU memory cap (GB, 1e9 bytes) while the FP8 target runs
    fp8_context: int = 4096  # --fp8-context: the prompt length of the quantized targets' peak-memory session
    int4: bool = False  # --int4: with --fast, the target with 4-bit weights made at random beside bf16 (quantized_speed)
    int4_cap_gb: float = 24.0  # --int4-memory-cap: the GPU memory cap (GB) while the 4-bit target runs (a 24 GB card)
    int4_drafter: bool = False  # --int4-drafter: with --quantized-only, the drafter's Linears 4-bit too (a 24 GB card)
    head_weights: str | None = None  # --head-weights: the quantized targets' lm_head int4 or fp8 (models.quantize_head)
    long_capped: bool = False  # --long-capped: the 16,384-token peak under the format's memory cap, not uncapped
    long_only: bool = False  # --long-only: after the build, that session alone (as a user's process runs it)
    tree_forms: bool = False  # --tree-forms: with --fast, the tree delta rule's forms and tiles swept (tree_forms)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> BenchConfig:
        return cls(smoke=a.smoke, device="cpu" if a.smoke else "cuda", split=a.device_map == "auto", fast=a.fast,
                   fast_only=a.fast_only, gdn_kernel=a.gdn_kernel, fused=False if a.no_fused else None,
                   attention=a.attention, compile=False if a.no_compile else None, blas=a.blas,
                   gate_up=a.gate_up, gdn_step=a.gdn_step, commit=a.commit,
                   gdn_prep=a.gdn_prep, norm=a.norm, pdl=a.pdl, variants=tuple(a.variants),
                   dflash2=a.dflash2, fp8=a.fp8, tree_forms=a.tree_forms, int4=a.int4, int4_drafter=a.int4_drafter, int4_cap_gb=a.int4_memory_cap,
                   head_weights=a.head_weights,
                   long_capped=a.long_capped or a.long_only, long_only=a.long_only,
                   fp8_cap_gb=a.fp8_memory_cap, fp8_context=a.fp8_context if not a.smoke else min(a.fp8_context, 256))

    @property
    def quantized(self) -> tuple[str, ...]:
        """The quantized weight formats asked for (QUANTIZED: --fp8, --int4), each measured beside bf16."""
        return tuple(w for w in QUANTIZED if getattr(self, w))

    def cap_gb(self, weights: str) -> float:
        return self.fp8_cap_gb if weights == "fp8" else self.int4_cap_gb

    def runner_forms(self) -> dict:
        """Every runner part's value this run forces (StaticRunner's `forms`: "auto" / None its device's default)."""
        return {name: getattr(self, name) for name in VARIANT_FIELDS}

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

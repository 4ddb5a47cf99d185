"""RunnerOptions: how the static runner computes on its device, each switch's choices, and what `resolve` makes of
them on a device. The library builds its runners with the defaults (engines.RunnerEngine); every other value is
set by the GPU benchmark (benchmarks/gpu.py's BenchConfig, `--variants`) and the tests, to measure or check a form
beside the default.

Closer to the hardware on a GPU (each resolves to the torch form on the CPU, whose numbers stay bitwise what they
were):
    gdn_kernel  the tree delta rule's form, chosen once at construction (kernels/gdn_tree/dispatch.py, made a form
                by gdn_forms.py): "triton-rule" (the default on CUDA) the whole rule in two Triton launches between
                the compiled conv / gates and gated norm; "triton-solve" the parallel part in torch, the solve and
                output product in Triton; "torch" the torch forms (cuBLAS's solve)
    gdn_step    the one-node pass's GDN core (the greedy step): "triton" (the default on CUDA) conv, gates, the
                one-step rule and gated norm in one launch a layer (kernels/gdn_step/); "torch" the form's own
    commit      the commit's recurrent-state update: "triton" (the default on CUDA) every GDN layer's state read and
                written once in one launch (kernels/state_commit/); "torch" a batched matmul and a pass
    gdn_prep    a tree's GDN conv, l2 norms and gates: "triton" (the default on CUDA) one launch a layer
                (kernels/gdn_step/), for the forms that take q and k at their key heads; "torch" a piece
    norm        a layer's residual adds and the norms after them: "triton" (the default on CUDA) one launch each,
                a program a row (kernels/add_norm/); "torch" the piece fused.add_rms_norm
    pdl         "on" (the default on a CUDA device of compute capability 9.0 or later, with Triton) the one-row FP8
                products and the add + norm launches launched behind the kernel before them, programmatic dependent
                launch (kernels/pdl.py); "off" each launched after the kernel before has finished
    fused       one GEMM per input for the projections (engine/fused.py: the fused weight is the storage)
    attention   "eager" (matmuls + fp32 softmax over the bucket) or "sdpa" (F.scaled_dot_product_attention with
                the bucket's boolean mask), to measure both in one run
    compile     the pieces between the GEMMs (norms, residual adds, the GDN conv / gates / one-step delta rule /
                gated norm, q/k norms + rope, the softmax, SiLU * up, the GDN commit) through torch.compile, a few
                fused kernels per layer instead of ~60 (compiled once per process at the first runner's
                construction, `compile_s`); on by default on CUDA, off on a CPU
    blas        the GEMMs' library, and gate_up, the MLP's gate+up GEMM form: "auto" measures per tree size
                (autotune.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import pdl
from ..kernels.device import resolve_step, triton_available
from ..kernels.gdn_tree.dispatch import GDN_KERNELS, resolve_option

ATTENTION_KINDS = ("eager", "sdpa")
BLAS_CHOICES = ("auto", "default", "cublas", "cublaslt")
# the MLP's gate and up projections, fused into one weight: one GEMM, two GEMMs on its halves, or one GEMM over the
# rows padded to a multiple of 16 (what cuBLAS picks differs by row count; docs/lab/NOTEBOOK.md section 23)
GATE_UP_FORMS = ("fused", "split", "padded")
GATE_UP_CHOICES = ("auto", *GATE_UP_FORMS)


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner computes on its device. "auto" / None pick the measured-fastest forms: fused projections and
    the compiled elementwise pieces on CUDA (greedy step 21.4 -> 16.2 ms at Qwen3.6-27B shapes on an H200), the
    tree delta rule in Triton on CUDA and the torch tree form elsewhere (docs/lab/NOTEBOOK.md section 6); `resolve`
    says what a device gets."""

    # auto (CUDA with Triton: triton-rule; else torch) | torch | triton-rule | triton-solve: kernels/gdn_tree's forms
    gdn_kernel: str = "auto"
    fused: bool | None = None  # fused projections (None: on CUDA)
    attention: str = "eager"  # eager | sdpa
    compile: bool | None = None  # fused elementwise pieces through torch.compile (None: on CUDA where Triton imports)
    # the GEMMs' library: auto (CUDA graphs: cuBLAS and cuBLASLt each captured for a tree size's first graph, the
    # faster replay kept for that size) | default (torch's preference, untouched) | cublas | cublaslt
    blas: str = "auto"
    # the MLP's gate+up GEMM (GATE_UP_FORMS): auto (CUDA graphs: each form timed alone on the model's weight at a tree
    # size's first capture, per library, the fastest kept; elsewhere fused) | fused | split | padded
    gate_up: str = "auto"
    # the one-node pass's GDN core (a greedy step): auto (CUDA with Triton: triton) | torch (the tree form's own) |
    # triton (kernels/gdn_step/triton_step.py: conv, gates, the one-step rule and gated norm in one launch a layer)
    gdn_step: str = "auto"
    # the commit's recurrent-state update: auto (CUDA with Triton: triton) | torch (the piece commit_recurrent,
    # kernels/state_commit/closed_form.py) | triton (kernels/state_commit/triton_commit.py: every layer's state read
    # and written once, in one launch)
    commit: str = "auto"
    # a tree's GDN conv, l2 norms and gates before the rule: auto (CUDA with Triton: triton) | torch (the compiled
    # piece gdn_prep) | triton (kernels/gdn_step's gdn_prep_triton: one launch a layer; for the form with q and k
    # at their key heads: triton-rule)
    gdn_prep: str = "auto"
    # a layer's residual add and the norm after it: auto (CUDA with Triton: triton) | torch (the piece
    # fused.add_rms_norm) | triton (kernels/add_norm/triton_norm.py: one launch, a program a row)
    norm: str = "auto"
    # the one-row FP8 products and the add + norm launches launched behind the kernel before them (kernels/pdl.py):
    # auto (a CUDA device of compute capability 9.0 or later, with Triton: on) | on | off
    pdl: str = "auto"

    def resolve(self, device: torch.device) -> "RunnerOptions":
        if self.gdn_kernel not in GDN_KERNELS:
            raise ValueError(f"gdn_kernel must be one of {', '.join(GDN_KERNELS)}, not {self.gdn_kernel!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, not {self.attention!r}")
        if self.blas not in BLAS_CHOICES:
            raise ValueError(f"blas must be one of {', '.join(BLAS_CHOICES)}, not {self.blas!r}")
        cuda = device.type == "cuda"
        kernel = resolve_option(self.gdn_kernel, device)
        compiles = (cuda and triton_available()) if self.compile is None else bool(self.compile)
        if self.gate_up not in GATE_UP_CHOICES:
            raise ValueError(f"gate_up must be one of {', '.join(GATE_UP_CHOICES)}, not {self.gate_up!r}")
        blas = self.blas if cuda else "default"  # a CPU has one BLAS
        gate_up = self.gate_up if cuda or self.gate_up != "auto" else "fused"  # nothing to measure without graphs
        return RunnerOptions(kernel, cuda if self.fused is None else bool(self.fused), self.attention, compiles, blas,
                             gate_up, resolve_step(self.gdn_step, device), resolve_step(self.commit, device, "commit"),
                             resolve_step(self.gdn_prep, device, "gdn_prep"), resolve_step(self.norm, device, "norm"),
                             pdl.resolve(self.pdl, device, triton_available()))

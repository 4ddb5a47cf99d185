"""The runner's parts: each a computation the static runner can do in more than one form, its choices, its default
and what a value of it means on a device (PARTS, one Part each), and the forms a runner computes with (RunnerForms).

The library never chooses: a runner built without `forms` (engines.RunnerEngine's) takes each part's default for its
device. A benchmark or a test forces a part's form by name, to measure or check it beside the default:
`StaticRunner(target, ..., forms={"commit": "torch"})` (benchmarks/gpu's BenchConfig and `--variants`, the tests).
Each part is one entry of PARTS; adding a form is a choice there and its branch in the runner (or its kernel's
dispatch). Closer to the hardware on a GPU, each part's default is the torch form on the CPU, whose numbers stay
bitwise what they were. The defaults pick the measured-fastest forms: fused projections and the compiled elementwise
pieces on CUDA (greedy step 21.4 -> 16.2 ms at Qwen3.6-27B shapes on an H200), the tree delta rule in Triton on CUDA
and the torch tree form elsewhere (docs/lab/NOTEBOOK.md section 6). Each part's `what` says what it is and what
its choices mean.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Mapping

import torch

from ..kernels import pdl
from ..kernels.device import ONE_LAUNCH_CHOICES, resolve_step, triton_available
from ..kernels.gdn_tree.dispatch import GDN_KERNELS, resolve_option

ATTENTION_KINDS = ("eager", "sdpa")
BLAS_CHOICES = ("auto", "default", "cublas", "cublaslt")
# the MLP's gate and up projections, fused into one weight: one GEMM, two GEMMs on its halves, or one GEMM over the
# rows padded to a multiple of 16 (what cuBLAS picks differs by row count; docs/lab/NOTEBOOK.md section 23)
GATE_UP_FORMS = ("fused", "split", "padded")
GATE_UP_CHOICES = ("auto", *GATE_UP_FORMS)
SWITCH = (None, True, False)  # a part on or off; None: its device's default


@dataclass(frozen=True)
class Part:
    """One of the runner's parts: its `name`, the value it takes when nothing forces one (`default`), the values
    it takes (`choices`), what a value means on a device (`resolve(value, device) -> form`) and what it is (`what`)."""

    name: str
    default: object
    choices: tuple
    resolve: Callable[[object, torch.device], object]
    what: str

    def pick(self, value, device: torch.device):
        """The form `value` (one of `choices`) means on `device`; a value not among them, or a form that cannot run
        there, is a ValueError naming the part."""
        if value not in self.choices:
            raise ValueError(f"{self.name} must be one of {', '.join(map(str, self.choices))}, not {value!r}")
        return self.resolve(value, device)


def _cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def _one_launch(name: str, what: str) -> Part:
    """A piece in one Triton launch or not (kernels/device.py's ONE_LAUNCH_CHOICES): auto is triton on CUDA where
    Triton imports, else torch; triton where it cannot run is a ValueError."""
    return Part(name, "auto", ONE_LAUNCH_CHOICES, lambda value, device: resolve_step(value, device, name), what)


PARTS: dict[str, Part] = {part.name: part for part in (
    Part("gdn_kernel", "auto", GDN_KERNELS, resolve_option,
         "the tree delta rule's form, chosen once at construction (kernels/gdn_tree/dispatch.py, made a form by "
         "gdn_forms.py): auto (CUDA with Triton: triton-rule, else torch); \"triton-rule\" the whole rule in two "
         "Triton launches between the compiled conv / gates and gated norm; \"triton-solve\" the parallel part in "
         "torch, the solve and output product in Triton; \"torch\" the torch forms (cuBLAS's solve)"),
    Part("fused", None, SWITCH, lambda value, device: _cuda(device) if value is None else bool(value),
         "one GEMM per input for the projections (engine/fused.py: the fused weight is the storage); None: on CUDA"),
    Part("attention", "eager", ATTENTION_KINDS, lambda value, device: value,
         "\"eager\" (matmuls + fp32 softmax over the bucket) or \"sdpa\" (F.scaled_dot_product_attention with the "
         "bucket's boolean mask), to measure both in one run"),
    Part("compile", None, SWITCH,
         lambda value, device: (_cuda(device) and triton_available()) if value is None else bool(value),
         "the pieces between the GEMMs (norms, residual adds, the GDN conv / gates / one-step delta rule / gated "
         "norm, q/k norms + rope, the softmax, SiLU * up, the GDN commit) through torch.compile, a few fused kernels "
         "per layer instead of ~60 (compiled once per process at the first runner's construction, `compile_s`); "
         "None: on CUDA where Triton imports, off on a CPU"),
    Part("blas", "auto", BLAS_CHOICES, lambda value, device: value if _cuda(device) else "default",  # a CPU: one BLAS
         "the GEMMs' library: auto (CUDA graphs: cuBLAS and cuBLASLt each captured for a tree size's first graph, "
         "the faster replay kept for that size, autotune.py) | default (torch's preference, untouched) | cublas | "
         "cublaslt; \"default\" on a CPU"),
    Part("gate_up", "auto", GATE_UP_CHOICES,
         lambda value, device: value if _cuda(device) or value != "auto" else "fused",  # nothing to time off CUDA
         "the MLP's gate+up GEMM (GATE_UP_FORMS): auto (CUDA graphs: each form timed alone on the model's weight "
         "at a tree size's first capture, per library, the fastest kept, autotune.py; elsewhere fused) | fused | "
         "split | padded"),
    _one_launch("gdn_step", "the one-node pass's GDN core (the greedy step): \"triton\" (the default on CUDA) conv, "
                "gates, the one-step rule and gated norm in one launch a layer (kernels/gdn_step/triton_step.py); "
                "\"torch\" the tree form's own"),
    _one_launch("commit", "the commit's recurrent-state update: \"triton\" (the default on CUDA) every GDN layer's "
                "state read and written once in one launch (kernels/state_commit/triton_commit.py); \"torch\" a "
                "batched matmul and a pass (the piece commit_recurrent, kernels/state_commit/closed_form.py)"),
    _one_launch("gdn_prep", "a tree's GDN conv, l2 norms and gates before the rule: \"triton\" (the default on CUDA) "
                "one launch a layer (kernels/gdn_step's gdn_prep_triton), for the forms that take q and k at their "
                "key heads (triton-rule); \"torch\" the compiled piece gdn_prep"),
    _one_launch("norm", "a layer's residual adds and the norms after them: \"triton\" (the default on CUDA) one "
                "launch each, a program a row (kernels/add_norm/triton_norm.py); \"torch\" the piece "
                "fused.add_rms_norm"),
    Part("pdl", "auto", pdl.CHOICES, lambda value, device: pdl.resolve(value, device, triton_available()),
         "the one-row FP8 products and the add + norm launches launched behind the kernel before them, programmatic "
         "dependent launch (kernels/pdl.py): \"on\" (the default on a CUDA device of compute capability 9.0 or "
         "later, with Triton); \"off\" each launched after the kernel before has finished"),
)}


@dataclass(frozen=True)
class RunnerForms:
    """What a runner computes with, each part resolved on its device (PARTS: what each is). Made by `of`."""

    gdn_kernel: str
    fused: bool
    attention: str
    compile: bool
    blas: str
    gate_up: str
    gdn_step: str
    commit: str
    gdn_prep: str
    norm: str
    pdl: str

    @classmethod
    def of(cls, forced: Mapping[str, object] | None, device: torch.device) -> "RunnerForms":
        """Each part's form on `device`: the value `forced` names for it, else its default. A name that is no part
        is a ValueError naming the parts; so is a value a part does not take or cannot run here. Resolving resolved
        forms gives them back: `RunnerForms.of(asdict(forms), device) == forms`."""
        forced = dict(forced or {})
        unknown = [name for name in forced if name not in PARTS]
        if unknown:
            raise ValueError(f"no runner part named {unknown[0]}: the parts are {', '.join(PARTS)}")
        return cls(**{name: part.pick(forced.get(name, part.default), device) for name, part in PARTS.items()})


assert tuple(PARTS) == tuple(f.name for f in fields(RunnerForms))  # a part per field, in the fields' order

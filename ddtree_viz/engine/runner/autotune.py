"""What the runner settles for itself: the kernel forms its parts' forms name, chosen once at construction (Forms:
gdn_forms.py's and the kernels' dispatch's choice, each held to its reference where its Triton kernel is refused),
and what it measures or warms once per process and remembers: the GEMM library of each tree size's graphs (the part
"blas" at "auto", options.py PARTS: both captured, the faster replay kept), the MLP's gate+up form under each library
(the part "gate_up" at "auto": each form timed on the model's own weight), and the compiled pieces (a warm-up at
construction)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from ..gdn_forms import choose
from ..kernels.add_norm.dispatch import choose_norm
from ..kernels.state_commit.dispatch import choose_commit
from ..weights.plain import FusedLinear
from ..weights.registry import KEPT
from .buffers import State
from .capture import replay_ms
from .layers import StaticModel, gate_up
from .options import GATE_UP_FORMS, RunnerForms

BLAS_LIBRARIES = ("cublas", "cublaslt")  # what "auto" measures
GATE_UP_GAIN = 0.98  # "auto" takes a form other than the fused GEMM where it is at least 2% faster
COMPILED_GATED_NORM = "Qwen3_5RMSNormGated"  # the GDN gated norm the compiled pieces are made for (silu)

_WARMED: set = set()  # (device, dtype, model config, max_path, forms) whose compiled pieces have run in this process
# (device, dtype, model config, forms, tree size) -> the GEMM library "auto" measured for it in this process, so
# that a later runner of the model (a page's new session) captures each size once, as before "auto"
_BLAS_CHOSEN: dict[tuple, dict] = {}
_GATE_UP_CHOSEN: dict[tuple, dict] = {}  # (model key, tree size, library) -> each gate+up form's µs, as timed


@dataclass(frozen=True)
class Forms:
    """The kernel forms a runner runs, chosen once: the tree delta rule's form (`rule`, with its one-node core and
    tree prep), the commit's state update and the add + norm (a Triton launch, or None: the torch piece), and why a
    Triton one asked for was refused here (`error`; the torch one runs in its place)."""

    rule: object
    commit: object
    norm: object
    error: str | None

    @classmethod
    def choose(cls, forms: RunnerForms, device, gdn_module, dtype, hidden: int) -> "Forms":
        rule, why_rule = choose(forms.gdn_kernel, device, gdn_module, forms.gdn_step, forms.gdn_prep)
        commit, why = choose_commit(forms.commit, device)
        norm, why_norm = choose_norm(forms.norm, device, dtype, hidden)
        return cls(rule, commit, norm, "; ".join(e for e in (why_rule, why, why_norm) if e) or None)

    def held(self, forms: RunnerForms) -> RunnerForms:
        """The runner's forms as these kernels run them."""
        return replace(forms, gdn_kernel=self.rule.name, gdn_step="torch" if self.rule.one_node is None else "triton",
                       commit="torch" if self.commit is None else "triton",
                       gdn_prep="torch" if self.rule.prep is None else "triton",
                       norm="torch" if self.norm is None else "triton")


def model_key(target, device, dtype) -> tuple:
    """The model's part of the keys of work done once per process (the compile warm-up, the GEMM library choice)."""
    return (str(device), dtype, target.config.to_json_string(),
            any(isinstance(m, KEPT) for m in target.modules()))  # weights kept quantized: GEMMs differ


@contextmanager
def blas_library(name: str | None):
    """torch's preferred BLAS library for the CUDA GEMMs issued inside (None: leave it as it is). It applies when a
    GEMM is issued, so a CUDA graph captured inside keeps that library's kernels."""
    if name is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def pick_gate_up(timed: dict[str, float]) -> str:
    """The gate+up form "auto" takes from each form's timing: the fastest where it is at least 2% faster than the
    fused GEMM (GATE_UP_GAIN), else the fused GEMM (also where nothing was timed)."""
    best = min(timed, key=timed.get, default="fused")
    return best if "fused" in timed and timed[best] <= GATE_UP_GAIN * timed["fused"] else "fused"


def fixed_gate_up(option: str) -> str:
    """The gate+up form outside a capture: the forms' fixed one, the fused GEMM for "auto"."""
    return "fused" if option == "auto" else option


class Tuner:
    """A runner's captures under the GEMM library and the gate+up form of their tree size: `blas` (per tree size:
    the library its graphs use and, where "auto" measured it, each one's replay ms) and `gate_up_forms` (per (tree
    size, library) that "auto" measured: each form's µs a call)."""

    def __init__(self, model: StaticModel, key: tuple, device: torch.device):
        self.model, self.key, self.device = model, key, device
        self.blas: dict[int, dict] = {}
        self.gate_up_forms: dict[tuple[int, str | None], dict[str, float]] = {}

    def capture(self, slot, forms: RunnerForms, capture):
        """`capture()` (a slot's graphs) under the GEMM library of the slot's tree size: the one chosen before (by
        this runner, or for this model and forms earlier in the process), the one the forms fix, or, for "auto"
        the first time, each library's capture replayed and the faster kept (and remembered: `blas`,
        _BLAS_CHOSEN)."""
        key = (*self.key, forms, slot.size)
        chosen = self.blas.get(slot.size) or _BLAS_CHOSEN.get(key)
        if chosen is None and forms.blas != "auto":
            chosen = {"library": forms.blas}
        if chosen is not None:
            self.blas[slot.size] = chosen
            library = None if chosen["library"] == "default" else chosen["library"]
            with blas_library(library), self.gate_up_for(slot.size, library, forms.gate_up):
                return capture()
        trials = {}
        for library in BLAS_LIBRARIES:
            with blas_library(library), self.gate_up_for(slot.size, library, forms.gate_up):
                captured = capture()
            trials[library] = (replay_ms(captured[0]), captured)
        library = min(trials, key=lambda name: trials[name][0])
        self.blas[slot.size] = _BLAS_CHOSEN[key] = {"library": library,
                                                    **{f"{name}_ms": ms for name, (ms, _) in trials.items()}}
        return trials[library][1]  # the other library's graphs and outputs go back to the pool with `trials`

    @contextmanager
    def gate_up_for(self, size: int, library: str | None, option: str):
        """The MLP's gate+up form inside (the model's `gate_up_form`): the forms' fixed one, or for "auto" the one
        measured for this tree size under this library (`gate_up_forms`: each form's µs; measured once a process per
        model, size and library, _GATE_UP_CHOSEN)."""
        form = option
        if form == "auto":
            key = (*self.key, size, library)
            if key not in _GATE_UP_CHOSEN:
                _GATE_UP_CHOSEN[key] = self.time_gate_up(size)
            self.gate_up_forms[size, library] = _GATE_UP_CHOSEN[key]
            form = pick_gate_up(_GATE_UP_CHOSEN[key])
        self.model.gate_up_form = form
        try:
            yield
        finally:
            self.model.gate_up_form = fixed_gate_up(option)

    def time_gate_up(self, size: int) -> dict[str, float]:
        """µs a call of each gate+up form (GATE_UP_FORMS) on the first fused MLP weight, `size` rows of random input,
        under the library in force: a CUDA graph of 8 calls per form (after a warm-up), the median of 5 replays. An
        empty dict where there is no fused gate+up of two parts to time (an FP8 one runs its own kernel)."""
        fused = next((f for (i, part), f in self.model.fused.items() if part == "mlp" and isinstance(f, FusedLinear)),
                     None)
        if fused is None or len(fused.sizes) != 2:
            return {}
        x = torch.randn(1, size, fused.weight.shape[1], device=self.device, dtype=fused.weight.dtype)
        out = {}
        for form in GATE_UP_FORMS:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                gate_up(fused, x, form)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(8):
                    gate_up(fused, x, form)
            out[form] = replay_ms(graph) * 1e3 / 8
        return out


def uncovered(gdn: dict) -> str | None:
    """Why the compiled pieces cannot serve these GDN layers (a kind they are not made for), or None."""
    odd = sorted({type(m.norm).__name__ for m in gdn.values() if type(m.norm).__name__ != COMPILED_GATED_NORM
                  or getattr(m.norm, "activation", "silu") != "silu" or getattr(m, "activation", "silu") != "silu"})
    return f"layers of a kind the fused pieces do not cover: {', '.join(odd)}" if odd else None


def warm_compiled(key: tuple, model: StaticModel, state: State, slots, device: torch.device) -> None:
    """A warm-up, once a process per `key`: one pass and commit over each of `slots` (made as they are run) on scratch
    state (restored), so that torch.compile compiles here, at the runner's construction, and not in a user's first
    round. Dynamo keeps its graphs per process: a later runner of the same model finds them made. What raises
    (a compiler that fails here) is the caller's to turn into running the pieces uncompiled."""
    if key in _WARMED:
        return
    saved = state.copy()
    try:
        with torch.no_grad():
            for slot in slots:
                slot.out = model.forward(slot)
                model.commit(slot)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        _WARMED.add(key)
    finally:
        State.restore(saved)

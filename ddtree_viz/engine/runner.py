"""A static-shape runner for a Qwen3.5 hybrid target on one device: the engine's fast GPU path.

transformers' forward grows its cache with torch.cat and launches a few thousand small kernels per token from
Python; on a 27B model that is ~11x the time the GPU needs to read the weights once. The runner keeps the same
arithmetic (the target's own projections and MLPs, the tree-exact GDN of gdn_tree.py and delta_rule/) but over
preallocated state, one stacked tensor per kind so that the commit is a few batched kernels:

    keys / values  [attn_layers, kv_heads, max_len, head_dim] (rows past `committed` are scratch)
    conv           [gdn_layers, C, kernel] (raw inputs, oldest first)
    recurrent      [gdn_layers, H, K, V] fp32

and two shape-static functions, captured as CUDA graphs per tree size and attention length bucket:

    forward(T):  tokens [T], positions [T], ancestor mask [T, T], conv windows [T, kernel]
                 -> logits [T, vocab] (fp32) and the drafter's context features [T, F].
                 Attention rows of the tree are written at committed .. committed+T-1 and each row sees the
                 committed prefix plus its ancestors, over the smallest power-of-two bucket of rows that holds
                 them; GDN layers run the tree delta rule's form (delta_rule/dispatch.py: the one-step recurrence
                 when T = 1) and leave the state untouched (their per-node k, g, delta and raw conv inputs are kept
                 for the commit).
    commit(T):   accepted path [P] (padded), its length -> attention rows moved into place, every GDN layer's
                 recurrent state advanced along the path at once (closed form of delta_rule/parallel.state_after)
                 and its conv window taken at the path's last node; committed += length.
    walk(T):     the target's choices [T] -> the accepted path, its length and the bonus token (tree.follow_on_device
                 over the staged tree), written into the commit's inputs on the device: `commit_walk` replays it,
                 then the commit, and reads the path back once both are queued.

Each layer kind is written once, from engine/fused.py's pure pieces, which run as they are or through
torch.compile (`Pieces`: gpt-fast's habit, one function either way). Greedy decoding is the one-node tree (T = 1,
path [0]), so greedy and DDTree run the same code. The runner is driven through engines.RunnerEngine
(DecodeSession, EngineGreedy), which also sizes it. The prefill runs transformers' own forward once and copies its
cache in. The tree size T is padded up to the nearest captured size with inert nodes (children of the root that
nothing descends from).

Closer to the hardware on a GPU (`RunnerOptions`; each resolves to the torch form on the CPU, whose numbers stay
bitwise what they were):
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
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ..errors import ModelLoadError
from .backends import sdpa_backends
from .cache import layer_types
from . import fused as fz
from .kernels import pdl
from .launch import LaunchAhead, device_word
from .gdn_forms import choose
from .kernels.add_norm.dispatch import choose_norm
from .kernels.device import resolve_step, triton_available
from .kernels.gdn_tree.dispatch import GDN_KERNELS, resolve_option
from .kernels.state_commit.dispatch import choose_commit
from .fused import ATTENTION_PROJECTIONS, GDN_PROJECTIONS, MLP_PROJECTIONS, GDNWeights, Pieces, fuse_linears
from ..treeops import conv_gather
from .tree import DraftTree, follow_on_device, tree_inputs_on_device
from .verify import decoder_layers, gdn_modules
from .weights.plain import FusedLinear
from .weights.registry import KEPT

ATTENTION_KINDS = ("eager", "sdpa")
BLAS_CHOICES = ("auto", "default", "cublas", "cublaslt")
BLAS_LIBRARIES = ("cublas", "cublaslt")  # what "auto" measures
# the MLP's gate and up projections, fused into one weight: one GEMM, two GEMMs on its halves, or one GEMM over the
# rows padded to a multiple of 16 (what cuBLAS picks differs by row count; docs/lab/NOTEBOOK.md section 23)
GATE_UP_FORMS = ("fused", "split", "padded")
GATE_UP_CHOICES = ("auto", *GATE_UP_FORMS)
# a prefill's tokens a forward: transformers' forward over a long prompt in chunks, its cache carried from one to
# the next (the GDN layers start from the carried conv window and recurrent state), so a prefill's transients (a
# layer's activations, the MLP's intermediate, the reference conv's copies) are a chunk's, not the prompt's: a 16k
# prompt on a 4-bit 27B asked 322 MB more past a 24 GB card's cap in one forward (docs/lab/NOTEBOOK.md section 39)
PREFILL_CHUNK = 4096
GATE_UP_GAIN = 0.98  # "auto" takes a form other than the fused GEMM where it is at least 2% faster
# the norms the pieces compute (zero-centred RMSNorm: x / rms(x) * (1 + w), the scale precomputed in fp32)
NORM_KINDS = ("Qwen3_5RMSNorm", "Qwen3_5TextRMSNorm", "Qwen3_5MoeRMSNorm")
COMPILED_GATED_NORM = "Qwen3_5RMSNormGated"  # the GDN gated norm the compiled pieces are made for (silu)


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


def gate_up(fused: FusedLinear, x: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's gate and up projections of x [..., T, D] from their fused weight (GATE_UP_FORMS): one GEMM, one GEMM
    per half of the weight (its rows: views, no copy), or one GEMM over x's rows padded with zeros to a multiple of
    16 (the padding's outputs dropped). The same products; the kernels cuBLAS picks differ by shape."""
    if form == "split":
        rows = fused.sizes[0]
        return F.linear(x, fused.weight[:rows]), F.linear(x, fused.weight[rows:])
    if form == "padded":
        T = x.shape[-2]
        y = F.linear(F.pad(x, (0, 0, 0, -T % 16)), fused.weight)
        return y[..., :T, :].split(fused.sizes, dim=-1)
    return fused(x)


def pick_gate_up(timed: dict[str, float]) -> str:
    """The gate+up form "auto" takes from each form's timing: the fastest where it is at least 2% faster than the
    fused GEMM (GATE_UP_GAIN), else the fused GEMM (also where nothing was timed)."""
    best = min(timed, key=timed.get, default="fused")
    return best if "fused" in timed and timed[best] <= GATE_UP_GAIN * timed["fused"] else "fused"


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
    # triton (delta_rule/triton_step.py: conv, gates, the one-step rule and gated norm in one launch a layer)
    gdn_step: str = "auto"
    # the commit's recurrent-state update: auto (CUDA with Triton: triton) | torch (fused.commit_recurrent, a piece) |
    # triton (delta_rule/triton_commit.py: every layer's state read and written once, in one launch)
    commit: str = "auto"
    # a tree's GDN conv, l2 norms and gates before the rule: auto (CUDA with Triton: triton) | torch (the compiled
    # piece gdn_prep) | triton (kernels/gdn_step's gdn_prep_triton: one launch a layer; for the form with q and k
    # at their key heads: triton-rule)
    gdn_prep: str = "auto"
    # a layer's residual add and the norm after it: auto (CUDA with Triton: triton) | torch (the piece
    # fused.add_rms_norm) | triton (engine/triton_norm.py: one launch, a program a row)
    norm: str = "auto"
    # the one-row FP8 products and the add + norm launches launched behind the kernel before them (engine/pdl.py):
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


@dataclass
class _Slot:
    """Static inputs and outputs of one tree size and one attention length bucket.

    The forward's integer inputs are views of one device tensor (`inputs`: ids [T], pos [T], parents [T] (-1 for
    the root and the padding: the walk's), gather [T, kernel]) and the commit's of another (`commit_in`: path
    [max_path], last [1], length []), each filled from a host staging buffer of its own (pinned on CUDA) by one copy;
    the ancestor mask has its own (bool). So a round queues three host-to-device copies and no fills. Or the walk
    on the device fills `commit_in` from the target's choices (`choice` [T]; `walk_out`: commit_in's layout and the
    bonus token, read back through `walk_host` after the commit is queued)."""

    size: int
    cols: int  # attention reads cache rows [0, cols): the smallest bucket that holds committed + size
    inputs: torch.Tensor
    anc: torch.Tensor
    commit_in: torch.Tensor
    stage: torch.Tensor  # host copies of inputs, anc and commit_in
    anc_stage: torch.Tensor
    commit_stage: torch.Tensor
    choice: torch.Tensor
    walk_out: torch.Tensor
    walk_host: torch.Tensor
    ids: torch.Tensor = None
    pos: torch.Tensor = None
    parents: torch.Tensor = None
    gather: torch.Tensor = None
    path: torch.Tensor = None
    last: torch.Tensor = None
    length: torch.Tensor = None
    copied: object = None  # CUDA event after the last copies from the staging buffers
    walked: object = None  # CUDA event after the walk's copy to walk_host
    depth: int = 0  # the staged tree's depth (the walk needs it under max_path)
    out: tuple | None = None  # (logits, feats, stash) of the forward
    graph: object = None
    commit_graph: object = None
    walk_graph: object = None
    tree_graph: object = None  # forward_tensors' inputs written from a static tree's tensors (runner.forward_tensors)
    tree_key: tuple | None = None  # the storage (address, length) of the tensors tree_graph reads

    def __post_init__(self):
        T, P = self.size, self.commit_in.shape[0] - 2
        self.ids, self.pos, self.parents = self.inputs[:T], self.inputs[T:2 * T], self.inputs[2 * T:3 * T]
        self.gather = self.inputs[3 * T:].view(T, -1)
        self.path, self.last, self.length = self.commit_in[:P], self.commit_in[P:P + 1], self.commit_in[P + 1]

    def staging(self) -> None:
        """Wait until the last copies out of the staging buffers are done (before writing them again)."""
        if self.copied is not None:
            self.copied.synchronize()

    def copied_now(self) -> None:
        if self.copied is not None:
            self.copied.record()


_WARMED: set = set()  # (device, dtype, model config, max_path, options) whose compiled pieces have run in this process
# (device, dtype, model config, options, tree size) -> the GEMM library "auto" measured for it in this process, so
# that a later runner of the model (a page's new session) captures each size once, as before "auto"
_BLAS_CHOSEN: dict[tuple, dict] = {}
_GATE_UP_CHOSEN: dict[tuple, dict] = {}  # (model key, tree size, library) -> each gate+up form's µs, as timed


class StaticRunner:
    def __init__(self, target, *, max_len: int, sizes=(1,), feature_layer_ids=None, max_path: int = 16,
                 graphs: bool | None = None, options: RunnerOptions | None = None):
        self.target = target
        self.layers = decoder_layers(target)
        self.types = layer_types(target.config)
        if any(getattr(m, "_hf_hook", None) is not None for m in target.modules()):
            raise ModelLoadError("the static runner needs the whole target on one device (no device_map hooks)")
        gdn = gdn_modules(target)
        if not gdn:
            raise ModelLoadError("the static runner is written for Qwen3.5 hybrid targets (Gated DeltaNet layers)")
        weight = target.get_input_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.graphs = (self.device.type == "cuda") if graphs is None else graphs
        self.options = (options or RunnerOptions()).resolve(self.device)
        # the tree delta rule's form, the one-node core, the tree's prep, the commit and the add and norm, once (why a
        # Triton one was refused here, kernel_error; the torch one runs in its place)
        self.rule, self.kernel_error = choose(self.options.gdn_kernel, self.device, next(iter(gdn.values())),
                                              self.options.gdn_step, self.options.gdn_prep)
        self._commit_kernel, why = choose_commit(self.options.commit, self.device)
        self._norm_kernel, why_norm = choose_norm(self.options.norm, self.device, self.dtype,
                                                   weight.shape[-1])
        self.kernel_error = "; ".join(e for e in (self.kernel_error, why, why_norm) if e) or None
        self.options = replace(self.options, gdn_kernel=self.rule.name,
                               gdn_step="torch" if self.rule.one_node is None else "triton",
                               commit="torch" if self._commit_kernel is None else "triton",
                               gdn_prep="torch" if self.rule.prep is None else "triton",
                               norm="torch" if self._norm_kernel is None else "triton")
        self.kernel = next(iter(gdn.values())).conv_kernel_size
        self.max_len, self.max_path = int(max_len), int(max_path)
        self.feature_layer_ids = list(feature_layer_ids or [])
        # the model's part of the keys of work done once per process (the compile warm-up, the GEMM library choice)
        self._model_key = (str(self.device), self.dtype, target.config.to_json_string(),
                           any(isinstance(m, KEPT) for m in target.modules()))  # weights kept quantized: GEMMs differ
        self._allocate_state(gdn)
        self._layer_weights(gdn)
        self.committed = 0
        self.committed_t = torch.zeros((), dtype=torch.long, device=self.device)
        self._cols = torch.arange(self.max_len, device=self.device)
        self._steps = torch.arange(self.max_path, device=self.device)
        self.host_ms: list[float] = []  # per forward + commit: host work (inputs, path), GPU waits excluded
        self._fixed_records: dict = {}  # snapshot's GDN layer records: (layer, type) -> LayerCache
        self._host = 0.0
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._ahead: LaunchAhead | None = None  # launch_ahead's, made at its first call on a GPU
        self.launch_error: str | None = None  # why verify graphs cannot be launched ahead here
        self.passes_launched_ahead = 0  # forwards that took a launch made ahead
        # attention length buckets: a pass attends over the smallest bucket holding the committed rows and the
        # tree, so its cost follows the sequence, not max_len (one graph per tree size and bucket, made on first use)
        self.buckets = sorted({min(self.max_len, 2 ** k) for k in range(8, max(9, self.max_len.bit_length() + 1))})
        self.sizes = sorted(set(int(s) for s in sizes))
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._eyes: dict[int, np.ndarray] = {}
        # per tree size: the GEMMs' library its graphs use and, where "auto" measured it, each one's replay ms
        self.blas: dict[int, dict] = {}
        # the MLP's gate+up form _mlp computes (set per capture by _gate_up_for) and, per (tree size, library) that
        # "auto" measured, each form's µs a call
        self._gate_up_form = self._fixed_gate_up()
        self.gate_up_forms: dict[tuple[int, str | None], dict[str, float]] = {}
        self.pieces = Pieces(self.options.compile)  # the layers' pieces, compiled or not
        self.compile_error: str | None = None  # why the compiled pieces were refused here (they run uncompiled)
        self.compile_s = 0.0  # seconds this construction spent compiling and warming them up
        if self.options.compile:
            self._compile_setup(gdn)

    def _allocate_state(self, gdn) -> None:
        """The committed state, sized here once: one stacked tensor per kind (so the commit is a few batched
        kernels), a view per layer."""
        cfg = self.target.config.get_text_config()
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        self._rep = cfg.num_attention_heads // kvh  # query heads per KV head
        self.gdn_ids = [i for i, kind in enumerate(self.types) if kind == "linear_attention"]
        self.attn_ids = [i for i, kind in enumerate(self.types) if kind != "linear_attention"]
        m, d = gdn[self.gdn_ids[0]], self.device
        self.conv_all = torch.zeros(len(self.gdn_ids), m.conv_dim, self.kernel, dtype=self.dtype, device=d)
        self.rec_all = torch.zeros(len(self.gdn_ids), m.num_v_heads, m.head_k_dim, m.head_v_dim, dtype=torch.float32,
                                   device=d)
        self.keys_all = torch.zeros(len(self.attn_ids), kvh, self.max_len, hd, dtype=self.dtype, device=d)
        self.values_all = torch.zeros_like(self.keys_all)
        self.conv = {i: self.conv_all[j] for j, i in enumerate(self.gdn_ids)}
        self.rec = {i: self.rec_all[j] for j, i in enumerate(self.gdn_ids)}
        self.keys = {i: self.keys_all[j][None] for j, i in enumerate(self.attn_ids)}
        self.values = {i: self.values_all[j][None] for j, i in enumerate(self.attn_ids)}

    def _layer_weights(self, gdn) -> None:
        """What the pieces read of each layer, taken once: the norms (`_norms`), each GDN layer's weights, whether an
        MLP's activation is SiLU, and the fused projections (None where a group is not fusable, e.g. a MoE block's
        MLP). Kept by layer position, not module identity, so that a deep copy of the runner (a forked session's)
        reads its own."""
        norms = {(len(self.layers), "input"): self.target.model.norm}  # the final norm: the input norm of "layer L"
        for i, layer in enumerate(self.layers):
            norms[i, "input"], norms[i, "post"] = layer.input_layernorm, layer.post_attention_layernorm
            if i not in gdn:
                norms[i, "q"], norms[i, "k"] = layer.self_attn.q_norm, layer.self_attn.k_norm
        odd = sorted({type(m).__name__ for m in norms.values() if type(m).__name__ not in NORM_KINDS})
        if odd:
            raise ModelLoadError(f"the static runner is written for Qwen3.5 hybrid targets: norms {', '.join(odd)}")
        # (layer, input | post | q | k) -> (scale, eps): Qwen3.5's zero-centred RMSNorm scales by 1 + w, in fp32
        self._norms = {key: (1.0 + m.weight.detach().float(), m.eps) for key, m in norms.items()}
        self._gdn_weights = {i: GDNWeights.of(m) for i, m in gdn.items()}
        self._silu = {i: type(getattr(layer.mlp, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
                      for i, layer in enumerate(self.layers)}
        self._fused: dict[tuple[int, str], object] = {}
        if self.options.fused:
            for i, layer in enumerate(self.layers):
                mixer = (layer.linear_attn, GDN_PROJECTIONS) if i in gdn else (layer.self_attn, ATTENTION_PROJECTIONS)
                self._fused[i, "mixer"] = fuse_linears(*mixer)
                self._fused[i, "mlp"] = fuse_linears(layer.mlp, MLP_PROJECTIONS)

    # -- the compiled pieces (RunnerOptions.compile) ------------------------------------------------------------

    def _compile_setup(self, gdn) -> None:
        """A warm-up: one pass and commit at T = 1 and one over a tree, on scratch state (restored), so that
        torch.compile compiles here, at construction, and not in a user's first round (`compile_s`). Dynamo keeps
        its graphs per process: a later runner of the same model finds them made. A GDN layer of a kind the
        compiled pieces are not made for, or a compiler that fails here, leaves the pieces running uncompiled,
        with `compile_error` saying why."""
        start = time.perf_counter()
        odd = sorted({type(m.norm).__name__ for m in gdn.values() if type(m.norm).__name__ != COMPILED_GATED_NORM
                      or getattr(m.norm, "activation", "silu") != "silu" or getattr(m, "activation", "silu") != "silu"})
        if odd:
            return self._compile_refused(f"layers of a kind the fused pieces do not cover: {', '.join(odd)}", start)
        key = (*self._model_key, self.max_path, self.options)
        if key in _WARMED:
            self.compile_s = time.perf_counter() - start
            return
        saved = self._state_copy()
        try:
            with torch.no_grad():
                for size in (1, max(2, *self.sizes)):
                    fits = [b for b in self.buckets if b >= max(size, self.max_path)]
                    if not fits:
                        continue
                    slot = self._new_slot(size, fits[0])
                    slot.out = self._forward(slot)
                    self._commit(slot)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            _WARMED.add(key)
        except Exception as exc:  # a compiler that cannot run here must not stop the runner
            self._state_restore(saved)
            return self._compile_refused(f"{type(exc).__name__}: {str(exc)[:500]}", start)
        self._state_restore(saved)
        self.compile_s = time.perf_counter() - start

    def _compile_refused(self, why: str, start: float) -> None:
        self.compile_error = why
        self.options = replace(self.options, compile=False)
        self.pieces = Pieces(False)
        self.compile_s = time.perf_counter() - start

    # -- slots and graphs ---------------------------------------------------------------------------------

    def _new_slot(self, size: int, cols: int) -> _Slot:
        d, cuda = self.device, self.device.type == "cuda"
        n_in = size * (3 + self.kernel)
        slot = _Slot(
            size, cols, inputs=torch.zeros(n_in, dtype=torch.long, device=d),
            anc=torch.eye(size, dtype=torch.bool, device=d),
            commit_in=torch.zeros(self.max_path + 2, dtype=torch.long, device=d),
            stage=torch.zeros(n_in, dtype=torch.long, pin_memory=cuda),
            anc_stage=torch.zeros(size, size, dtype=torch.bool, pin_memory=cuda),
            commit_stage=torch.zeros(self.max_path + 2, dtype=torch.long, pin_memory=cuda),
            choice=torch.zeros(size, dtype=torch.long, device=d),
            walk_out=torch.zeros(self.max_path + 3, dtype=torch.long, device=d),
            walk_host=torch.zeros(self.max_path + 3, dtype=torch.long, pin_memory=cuda),
            copied=torch.cuda.Event() if cuda else None, walked=torch.cuda.Event() if cuda else None,
        )
        slot.gather.copy_(torch.as_tensor(conv_gather([-1] + [0] * (size - 1), [0] + [1] * (size - 1), self.kernel)))
        slot.anc[:, 0] = True
        return slot

    @torch.no_grad()
    def _add_slot(self, size: int, cols: int) -> _Slot:
        slot = self._new_slot(size, cols)
        if self.graphs:
            saved = self._state_copy()  # capture runs mutate the state; it is restored (and prefill overwrites it)
            slot.graph, slot.commit_graph, slot.walk_graph, slot.out = self._capture_with_blas(slot)
            self._state_restore(saved)
        self._slots[(size, cols)] = slot
        return slot

    def _capture_with_blas(self, slot: _Slot):
        """_capture under the GEMM library of the slot's tree size: the one chosen before (by this runner, or for this
        model and options earlier in the process), the one the options fix, or, for "auto" the first time, each
        library's capture replayed and the faster kept (and remembered: `blas`, _BLAS_CHOSEN)."""
        key = (*self._model_key, self.options, slot.size)
        chosen = self.blas.get(slot.size) or _BLAS_CHOSEN.get(key)
        if chosen is None and self.options.blas != "auto":
            chosen = {"library": self.options.blas}
        if chosen is not None:
            self.blas[slot.size] = chosen
            library = None if chosen["library"] == "default" else chosen["library"]
            with blas_library(library), self._gate_up_for(slot.size, library):
                return self._capture(slot)
        trials = {}
        for library in BLAS_LIBRARIES:
            with blas_library(library), self._gate_up_for(slot.size, library):
                captured = self._capture(slot)
            trials[library] = (self._replay_ms(captured[0]), captured)
        library = min(trials, key=lambda name: trials[name][0])
        self.blas[slot.size] = _BLAS_CHOSEN[key] = {"library": library,
                                                    **{f"{name}_ms": ms for name, (ms, _) in trials.items()}}
        return trials[library][1]  # the other library's graphs and outputs go back to the pool with `trials`

    @contextmanager
    def _gate_up_for(self, size: int, library: str | None):
        """The MLP's gate+up form inside (`_gate_up_form`, what _mlp computes): the options' fixed form, or for "auto"
        the one measured for this tree size under this library (`gate_up_forms`: each form's µs; measured once a
        process per model, size and library, _GATE_UP_CHOSEN)."""
        form = self.options.gate_up
        if form == "auto":
            key = (*self._model_key, size, library)
            if key not in _GATE_UP_CHOSEN:
                _GATE_UP_CHOSEN[key] = self._time_gate_up(size)
            self.gate_up_forms[size, library] = _GATE_UP_CHOSEN[key]
            form = pick_gate_up(_GATE_UP_CHOSEN[key])
        self._gate_up_form = form
        try:
            yield
        finally:
            self._gate_up_form = self._fixed_gate_up()

    def _fixed_gate_up(self) -> str:
        """The gate+up form outside a capture: the options' fixed form, the fused GEMM for "auto"."""
        return "fused" if self.options.gate_up == "auto" else self.options.gate_up

    def _time_gate_up(self, size: int) -> dict[str, float]:
        """µs a call of each gate+up form (GATE_UP_FORMS) on the first fused MLP weight, `size` rows of random input,
        under the library in force: a CUDA graph of 8 calls per form (after a warm-up), the median of 5 replays. An
        empty dict where there is no fused gate+up of two parts to time (an FP8 one runs its own kernel)."""
        fused = next((f for (i, part), f in self._fused.items() if part == "mlp" and isinstance(f, FusedLinear)), None)
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
            out[form] = self._replay_ms(graph) * 1e3 / 8
        return out

    def _capture(self, slot: _Slot):
        """(forward graph, commit graph, walk graph, forward outputs) of a slot: two warm-up runs on a side stream,
        then the captures; the state they mutate is the caller's to restore."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                slot.out = self._forward(slot)
                self._walk(slot)
                slot.commit_in.zero_()  # a warm-up commits nothing (length 0), whatever the walk made of zeros
                self._commit(slot)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            slot.out = out = self._forward(slot)
        commit_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(commit_graph, pool=self._pool):
            self._commit(slot)
        walk_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(walk_graph, pool=self._pool):
            self._walk(slot)
        return graph, commit_graph, walk_graph, out

    @staticmethod
    def _replay_ms(graph, repeats: int = 5) -> float:
        """The median milliseconds of a forward graph's replay (after one untimed); it writes only its outputs
        and the tree's scratch K/V rows past the committed ones."""
        graph.replay()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[repeats // 2]

    def _state_copy(self):
        return [(t, t.clone()) for t in (self.keys_all, self.values_all, self.conv_all, self.rec_all, self.committed_t)]

    @staticmethod
    def _state_restore(saved) -> None:
        for t, copy in saved:
            t.copy_(copy)

    def slot_for(self, n: int, ahead: bool = False) -> _Slot:
        """The slot for a tree of n nodes at the current length (made, and captured, on first use); `ahead`: a walk
        queued and not read yet may move the length on by up to max_path first (its key bucket holds that too)."""
        fits = [s for s in self.sizes if s >= n]
        if not fits:
            self.sizes.append(n)
            fits = [n]
        size = min(fits)
        need = self.committed + max(size, self.max_path) + (self.max_path if ahead else 0)
        fitting = [b for b in self.buckets if b >= need]
        if not fitting:
            raise ValueError(f"the runner's max_len {self.max_len} is full")
        key = (size, fitting[0])
        return self._slots[key] if key in self._slots else self._add_slot(*key)

    # -- the two static functions: each layer kind once, from the pieces (compiled or not) ----------------------

    def _forward(self, slot: _Slot):
        """_pass, its one-row FP8 products and add + norm launches launched early where RunnerOptions.pdl is on."""
        with pdl.early(self.options.pdl == "on"):
            return self._pass(slot)

    def _pass(self, slot: _Slot):
        """One pass over the slot's tree (what a CUDA graph captures): (logits [T, vocab] fp32, features [T, F] or
        None, the GDN layers' stash for the commit: u [Lg, T, C], k, g, delta [Lg, T, H, .]). Each layer's closing
        residual add is one piece with the next norm."""
        T, p = slot.size, self.pieces
        x = self.target.get_input_embeddings()(slot.ids)[None]  # [1, T, D]
        cos, sin = self.target.model.rotary_emb(x, slot.pos.view(1, 1, T).expand(3, 1, T))
        tree_cols, mask = self._attention_mask(slot)
        gdn_core = self.rule.at(slot.anc, p)  # the tree delta rule's core for this pass, shared by every GDN layer
        p.mark(x, 1, cos, 1, sin, 1, mask, 2, mask, 3)
        feats, stash = {}, []
        h = p(fz.rms_norm)(x, *self._norms[0, "input"])
        for i, layer in enumerate(self.layers):
            if i in self.conv:
                out, parts = self._gdn(i, layer.linear_attn, h, slot.gather, gdn_core)
                stash.append(parts)
            else:
                out = self._attention(i, layer.self_attn, h, cos, sin, mask, tree_cols, slot.cols)
            x, h = self._add_norm(x, out, self._norms[i, "post"])
            x, h = self._add_norm(x, self._mlp(i, layer.mlp, h), self._norms[i + 1, "input"])  # L: the final norm
            if i in self.feature_layer_ids:
                feats[i] = x[0]
        logits = self.target.get_output_embeddings()(h)[0].float()
        features = torch.cat([feats[i] for i in self.feature_layer_ids], dim=-1) if feats else None
        stacked = tuple(torch.stack(parts) for parts in zip(*stash))  # u [Lg, T, C], k, g, delta [Lg, T, H, .]
        return logits, features, stacked

    def _attention_mask(self, slot: _Slot):
        """(the tree's cache rows [T], mask [1, 1, rep*T, cols]): one row per (query head of a KV group, node), the
        committed prefix plus the node's ancestors; eager wants True = not attended, SDPA True = attended."""
        cols = self._cols[: slot.cols]
        tree_cols = self.committed_t + cols[: slot.size]
        visible = (cols < self.committed_t)[None].expand(slot.size, slot.cols).clone()
        visible.index_copy_(1, tree_cols, slot.anc)
        mask = (visible if self.options.attention == "sdpa" else ~visible).repeat(self._rep, 1)[None, None]
        return tree_cols, mask

    def _add_norm(self, x, y, norm):
        """A residual add and the norm after it (`norm`: (scale, eps) of `_norms`): (x + y, norm(x + y)), in one
        launch where RunnerOptions.norm is triton (engine/triton_norm.py), else the piece."""
        if self._norm_kernel is not None:
            return self._norm_kernel(x, y, *norm)
        return self.pieces(fz.add_rms_norm)(x, y, *norm)

    def _gdn(self, i, gdn, h, gather, core):
        """One GDN layer: its projections (one GEMM where fused), the pass's core (delta_rule/dispatch.py: conv,
        gates, the tree delta rule, gated norm), out_proj. h [1, T, D] -> ([1, T, D], its stash (u, k, g, delta))."""
        x = h[0]
        fused = self._fused.get((i, "mixer"))
        u, z, b, a = fused(x) if fused is not None else (gdn.in_proj_qkv(x), gdn.in_proj_z(x), gdn.in_proj_b(x),
                                                          gdn.in_proj_a(x))
        self.pieces.mark(u, 0, z, 0, b, 0, a, 0, gather, 0)
        o, k, g, delta = core(u, z, b, a, self.conv[i], self.rec[i], gather, self._gdn_weights[i])
        return gdn.out_proj(o)[None], (u, k, g, delta)

    def _attention(self, i, attn, h, cos, sin, mask, tree_cols, n_cols):
        """Gated attention over the length bucket: projections, the q/k norms + rope + gate split (a piece), the
        cache write, scores and softmax (a piece) or SDPA, the output gate (a piece), o_proj. Grouped heads without
        copying K/V: query heads h*rep .. h*rep+rep-1 share KV head h. Plain matmuls and an fp32 softmax over the
        static cache: a fused SDPA kernel with a mask costs ~0.13 ms per layer here. mask: as _attention_mask's."""
        p = self.pieces
        fused = self._fused.get((i, "mixer"))
        qg, k, v = fused(h) if fused is not None else (attn.q_proj(h), attn.k_proj(h), attn.v_proj(h))
        keys, values = self.keys[i], self.values[i]
        kvh = keys.shape[1]
        p.mark(qg, 1, k, 1, v, 1)
        (q_scale, q_eps), (k_scale, k_eps) = self._norms[i, "q"], self._norms[i, "k"]
        q, k, v, gate = p(fz.attention_prep)(qg, k, v, q_scale, k_scale, q_eps, k_eps, cos, sin, attn.head_dim, kvh)
        keys.index_copy_(2, tree_cols, k.to(keys.dtype))
        values.index_copy_(2, tree_cols, v.to(values.dtype))
        keys, values = keys[:, :, :n_cols], values[:, :, :n_cols]
        if self.options.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        else:
            scores = q @ keys.transpose(-1, -2)
            p.mark(scores, 2, scores, 3)
            o = p(fz.masked_softmax)(scores, mask, attn.scaling) @ values
        p.mark(o, 2, gate, 1)
        return attn.o_proj(p(fz.gate_heads)(o, gate, kvh * self._rep))

    def _mlp(self, i, mlp, x):
        """The MLP: gate and up in one GEMM where fused, SiLU * up a piece; the module itself where not fusable."""
        fused = self._fused.get((i, "mlp"))
        if fused is None:
            return mlp(x)
        gate, up = gate_up(fused, x, self._gate_up_form) if isinstance(fused, FusedLinear) else fused(x)
        if not self._silu[i]:
            return mlp.down_proj(mlp.act_fn(gate) * up)
        self.pieces.mark(gate, 1, up, 1)
        return mlp.down_proj(self.pieces(fz.silu_mul)(gate, up))

    def _commit(self, slot: _Slot) -> None:
        """The accepted path's attention rows moved into place and every GDN layer's state advanced along it (one
        piece, fused.commit_state; or the recurrent states by triton_commit's launch and the conv windows a piece);
        committed += length, on the device."""
        c = self.committed_t
        src, dst = c + slot.path, c + self._steps
        for buf in (self.keys_all, self.values_all):  # every attention layer at once
            buf.index_copy_(2, dst, buf.index_select(2, src))
        u, k, g, delta = slot.out[2]  # every GDN layer at once: [Lg, T, ...]
        self.pieces.mark(u, 1, k, 1, g, 1, delta, 1, slot.gather, 0)
        if self._commit_kernel is not None:  # the recurrent states in one launch, the conv windows a piece
            self._commit_kernel(self.rec_all, k, g, delta, slot.path, self._steps, slot.length)
            self.pieces(fz.commit_conv)(self.conv_all, u, slot.gather, slot.last)
        else:
            self.pieces(fz.commit_state)(self.rec_all, self.conv_all, u, k, g, delta, slot.path, self._steps,
                                         slot.length, slot.gather, slot.last)
        c.add_(slot.length)

    def _walk(self, slot: _Slot) -> None:
        """The acceptance walk over the staged tree and the target's choices (tree.follow_on_device) into commit_in,
        and with the bonus token into walk_out, on the device."""
        walk, bonus = follow_on_device(slot.parents, slot.pos - slot.pos[0], slot.ids, slot.choice, self.max_path)
        slot.commit_in.copy_(walk)
        slot.walk_out[:-1].copy_(walk)
        slot.walk_out[-1:].copy_(bonus[None])

    # -- public API ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int]):
        """transformers' own forward over the prompt, its cache copied in. Returns (logits [vocab] fp32 of the
        last position, context features [n, F] or None)."""
        if len(prompt_ids) + 2 * self.max_path + max(self.sizes) > self.max_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in max_len {self.max_len}")
        self.release_ahead()
        cache = DynamicCache(config=self.target.config)
        ids = torch.tensor([prompt_ids], device=self.device)
        with sdpa_backends(self.device), self._features_kept() as kept:
            for start in range(0, ids.shape[1], PREFILL_CHUNK):  # the cache carried from chunk to chunk
                out = self.target(input_ids=ids[:, start:start + PREFILL_CHUNK], cache=cache, use_cache=True,
                                  logits_to_keep=1)
        n = len(prompt_ids)
        for i, layer in enumerate(cache.layers):
            if i in self.conv:
                self.conv[i].copy_(layer.conv_states[0][0])
                self.rec[i].copy_(layer.recurrent_states[0][0])
            else:
                self.keys[i][:, :, :n].copy_(layer.keys)
                self.values[i][:, :, :n].copy_(layer.values)
        self.committed = n
        self.committed_t.fill_(n)
        feats = (torch.cat([torch.cat(kept[i], dim=1)[0] for i in self.feature_layer_ids], dim=-1)
                 if self.feature_layer_ids else None)
        return out.logits[0, -1].float(), feats

    @contextmanager
    def _features_kept(self):
        """The drafter's context features of a prefill, kept by hooks as the forward makes them: layer i's output
        (the last layer's through the final norm, as transformers' hidden_states[L] is), what
        output_hidden_states=True gives at [i + 1], without holding every layer's (65 x 42 MB at 4,096 tokens of a
        27B model: 2.7 GB at the prefill's peak)."""
        kept: dict[int, list[torch.Tensor]] = {i: [] for i in self.feature_layer_ids}  # a tensor a chunk
        last = len(self.layers) - 1
        hooks = []
        for i in kept:  # a layer named twice (a toy drafter's ids) hooked once
            module = self.target.model.norm if i == last else self.layers[i]
            hooks.append(module.register_forward_hook(
                lambda m, args, out, i=i: kept[i].append(out[0] if isinstance(out, tuple) else out)))
        try:
            yield kept
        finally:
            for h in hooks:
                h.remove()

    def launch_ahead(self, n: int) -> bool:
        """Queue the verify graph for a tree of up to n nodes now, before the tree is known (launch.py): it starts
        once the next forward has staged its inputs, and the host's replay() is off the round's critical path.
        False where it cannot be (no CUDA graphs, the driver's stream memory operations missing: `launch_error`),
        or while a launch is pending. A launch no forward takes must be released (release_ahead)."""
        if not self.graphs or self.launch_error is not None or (self._ahead and self._ahead.pending):
            return False
        slot = self.slot_for(n)  # captured here on first use, before anything waits
        if slot.graph is None:
            return False
        if self._ahead is None:
            word, self.launch_error = device_word(self.device)
            if word is None:
                return False
            self._ahead = LaunchAhead(word, self.device)
        self._ahead.launch(slot)
        return True

    def release_ahead(self) -> None:
        """Let a pending launch run over the inputs it has (its outputs dropped), the main stream behind it."""
        if self._ahead is not None:
            self._ahead.release(self._ahead.take())

    @torch.no_grad()
    def forward(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None, _Slot]:
        """One pass over the tree: (logits [T, vocab] fp32, features [T, F] or None, slot for the commit). After
        launch_ahead, the launched graph's slot where the tree fits it: its inputs staged, then the launch let go."""
        start = time.perf_counter()
        self._host = 0.0
        n = len(tree)
        launched = self._ahead.take() if self._ahead is not None else None
        if launched is not None and n > launched.slot.size:  # let go before slot_for, which may capture (and wait)
            self._ahead.release(launched)
            launched = None
        try:
            slot = launched.slot if launched is not None else self.slot_for(n)
            self._stage_tree(slot, tree)
            slot.inputs.copy_(slot.stage, non_blocking=True)
            slot.anc.copy_(slot.anc_stage, non_blocking=True)
            slot.copied_now()
        finally:
            if launched is not None:
                self._ahead.release(launched)
        self._host += time.perf_counter() - start
        return self._run(slot, n, launched=launched is not None)

    @torch.no_grad()
    def forward_tensors(self, token_ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                        static: bool = False, ahead: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, _Slot]:
        """forward over a tree held as tensors where the runner is (tree.tree_on_device's nodes: [n] each, root
        first, shallower than max_path): the slot's inputs written by the device (_stage_tensors), the same values
        _stage_tree writes from the host (tests/test_runner.py), nothing staged or copied up. `static`: the three
        tensors are rewritten in place for every tree (DeviceTreeBuilder's graph outputs), so where the slot has
        graphs the writing is captured once as a graph of its own (`tree_graph`, for these tensors' storage) and
        replayed: one launch where it is a few dozen ops. `ahead`: queued behind a walk not read yet (slot_for's; the
        positions are the device's committed length's, so the pass reads the state that walk's commit leaves)."""
        self.release_ahead()
        start = time.perf_counter()
        self._host = 0.0
        slot = self.slot_for(token_ids.shape[0], ahead)
        if static and slot.graph is not None:
            key = tuple((t.data_ptr(), t.shape[0]) for t in (token_ids, parents, depths))
            if slot.tree_key != key:
                slot.tree_graph, slot.tree_key = self._capture_staging(slot, token_ids, parents, depths), key
            slot.tree_graph.replay()
        else:
            self._stage_tensors(slot, token_ids, parents, depths)
        slot.depth = self.max_path - 1  # a bound (the walk's check): the tree is not read back
        self._host += time.perf_counter() - start
        return self._run(slot, token_ids.shape[0])

    def _stage_tensors(self, slot: _Slot, token_ids: torch.Tensor, parents: torch.Tensor,
                       depths: torch.Tensor) -> None:
        """The slot's inputs from a tree held as tensors, by the device (tree.tree_inputs_on_device), padded to the
        slot's size with children of the root; positions from the committed length on the device (committed_t).
        A tree built elsewhere (a proposer's log-probs on the CPU) is moved here first."""
        token_ids, parents, depths = (t.to(self.device) for t in (token_ids, parents, depths))
        pad = slot.size - token_ids.shape[0]
        seen_parents = torch.cat([parents, parents.new_zeros(pad)])  # the padding: children of the root
        seen_depths = torch.cat([depths, depths.new_ones(pad)])
        anc, gather = tree_inputs_on_device(seen_parents, seen_depths, self.kernel, self.max_path - 1)
        slot.ids.copy_(torch.cat([token_ids, token_ids.new_zeros(pad)]))
        slot.pos.copy_(seen_depths + self.committed_t)
        slot.parents.copy_(torch.cat([parents, parents.new_full((pad,), -1)]))  # the walk's: padding no one's child
        slot.gather.copy_(gather)
        slot.anc.copy_(anc)

    def _capture_staging(self, slot: _Slot, token_ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor):
        """_stage_tensors of these tensors as a CUDA graph (a warm-up run on a side stream first): it writes only the
        slot's inputs, which every forward rewrites (its temporaries in a pool of its own: a few small tensors)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._stage_tensors(slot, token_ids, parents, depths)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._stage_tensors(slot, token_ids, parents, depths)
        return graph

    def _run(self, slot: _Slot, n: int, launched: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, _Slot]:
        """The slot's pass (its graph replayed, or its function run where there is none; `launched`: its graph
        already queued by launch_ahead) and the outputs for the tree's n nodes."""
        if launched:
            self.passes_launched_ahead += 1
        elif slot.graph is not None:
            slot.graph.replay()
        else:
            slot.out = self._forward(slot)
        logits, feats, _ = slot.out
        return logits[:n], (feats[:n] if feats is not None else None), slot

    def _stage_tree(self, slot: _Slot, tree: DraftTree) -> None:
        """The tree's inputs in the slot's host staging buffers, padded to the slot's size with inert nodes
        (children of the root): token ids (0 for padding), positions, conv windows, ancestor mask. The same
        arrays as treeops.conv_gather and treeops.ancestor_matrix of the padded tree (tests/test_runner.py), built
        a level of ancestry at a time for all nodes at once (the m-th step marks every node's m-th ancestor, the
        root its own past the top; the first kernel - 1 steps also fill the conv windows' columns): as many numpy
        steps as the tree is deep, not one per node."""
        T, n, k = slot.size, len(tree), self.kernel
        slot.staging()
        stage, anc = slot.stage.numpy(), slot.anc_stage.numpy()  # views (made here: a deepcopy keeps no numpy view)
        ids, pos, parents, gather = stage[:T], stage[T:2 * T], stage[2 * T:3 * T], stage[3 * T:].reshape(T, k)
        ids[:n] = tree.token_ids
        ids[n:] = 0
        parents[:n] = tree.parents
        parents[n:] = -1  # the padding is no one's child for the walk (the forward sees it as the root's)
        slot.depth = max(tree.depths)
        depth = pos  # the padded tree's depths, committed added below
        depth[:n] = tree.depths
        depth[n:] = 1
        up = np.zeros(T, dtype=np.int64)  # each node's parent, the padding's and the root's the root
        up[1:n] = tree.parents[1:]
        np.copyto(anc, self._eye(T))
        rows = np.arange(T)
        gather[:, k - 1] = k + rows  # each node last in its own window
        ancestor = rows
        for m in range(1, max(slot.depth, int(n < T), k - 1) + 1):
            ancestor = up[ancestor]
            anc[rows, ancestor] = True
            if m < k:  # past the root (ancestor 0) the window goes on into the committed inputs, newest last
                np.subtract(k + ancestor, np.maximum(m - depth, 0), out=gather[:, k - 1 - m])
        pos += self.committed

    def _eye(self, n: int) -> np.ndarray:
        eye = self._eyes.get(n)
        if eye is None:
            eye = self._eyes[n] = np.eye(n, dtype=np.bool_)
        return eye

    @torch.no_grad()
    def commit(self, slot: _Slot, accepted: list[int]) -> None:
        """Keep the accepted path (tree positions, root first) and advance every layer's state along it."""
        start = time.perf_counter()
        L = len(accepted)
        if not 1 <= L <= self.max_path:
            raise ValueError(f"accepted path of {L} nodes; the runner keeps 1..{self.max_path}")
        slot.staging()
        stage, P = slot.commit_stage.numpy(), self.max_path
        stage[:L] = accepted
        stage[L:P] = accepted[-1]  # padding: the last node again (its steps are not valid: length says so)
        stage[P] = accepted[-1]
        stage[P + 1] = L
        slot.commit_in.copy_(slot.commit_stage, non_blocking=True)
        slot.copied_now()
        self._host += time.perf_counter() - start
        self.host_ms.append(self._host * 1e3)
        self._replay(slot.commit_graph, self._commit, slot)
        self.committed += L

    @torch.no_grad()
    def commit_walk(self, slot: _Slot, choice: torch.Tensor) -> tuple[list[int], int]:
        """The acceptance walk and the commit on the device, from the target's choices at the forward's positions
        (choice [n]: argmax or samples, where the logits are): queue_walk, then read_walk. Returns (accepted path,
        bonus token), treeops.follow's (tests/test_runner.py)."""
        self.queue_walk(slot, choice)
        return self.read_walk(slot)

    @torch.no_grad()
    def queue_walk(self, slot: _Slot, choice: torch.Tensor) -> None:
        """The walk's graph, its result's copy to the host and the commit's graph, queued; nothing waited for. Until
        read_walk, the result is the device's alone: `walk_out` (the accepted length at [max_path + 1], the bonus
        token at [max_path + 2]), the path (`slot.path`, padded with its last node) and committed_t, advanced."""
        start = time.perf_counter()
        if slot.depth >= self.max_path:
            raise ValueError(f"tree of depth {slot.depth}; the runner keeps paths of 1..{self.max_path} nodes")
        slot.choice[:choice.shape[0]].copy_(choice)
        self._replay(slot.walk_graph, self._walk, slot)
        if slot.walked is not None:
            slot.walk_host.copy_(slot.walk_out, non_blocking=True)
            slot.walked.record()
        self._replay(slot.commit_graph, self._commit, slot)
        self._host += time.perf_counter() - start
        self.host_ms.append(self._host * 1e3)

    def read_walk(self, slot: _Slot) -> tuple[list[int], int]:
        """The queued walk's result on the host (a wait for its copy alone, the commit may still run): (accepted
        path, bonus token); `committed` moves past the path."""
        if slot.walked is not None:
            slot.walked.synchronize()
        walk = (slot.walk_host if slot.walked is not None else slot.walk_out).tolist()
        P = self.max_path
        length = walk[P + 1]
        self.committed += length
        return walk[:length], walk[P + 2]

    @staticmethod
    def _replay(graph, eager, slot: _Slot) -> None:
        """A slot's captured graph replayed, or its function run eagerly where there is none (no CUDA graphs)."""
        if graph is not None:
            graph.replay()
        else:
            eager(slot)

    def snapshot(self, types: list[str], pending: int = 0):
        """Per-layer LayerCache records in the shapes transformers' cache would hold (batch of one); `pending`
        tree rows written by a forward and not yet committed count as held, as in transformers' cache."""
        from ..trace import LayerCache, TensorInfo

        def info(name, t, shape):
            return TensorInfo(name, tuple(int(x) for x in shape), str(t.dtype).removeprefix("torch."))

        def fixed(i, kind):  # a GDN layer's record never changes (its state's shapes): made once per runner
            conv, rec = self.conv[i], self.rec[i]
            infos = (info("conv_state", conv, (1, *conv.shape)), info("recurrent_state", rec, (1, *rec.shape)))
            nbytes = conv.numel() * conv.element_size() + rec.numel() * rec.element_size()
            return LayerCache(i, kind, "LinearAttentionLayer", infos, int(nbytes), None)

        out = []
        rows = self.committed + pending
        for i, kind in enumerate(types):
            if i in self.conv:
                key = (i, kind)
                if key not in self._fixed_records:
                    self._fixed_records[key] = fixed(i, kind)
                out.append(self._fixed_records[key])
            else:
                k = self.keys[i]
                shape = (1, k.shape[1], rows, k.shape[3])
                nbytes = 2 * k.shape[1] * rows * k.shape[3] * k.element_size()
                out.append(LayerCache(i, kind, "DynamicLayer", (info("keys", k, shape), info("values", k, shape)),
                                      nbytes, rows))
        return tuple(out)

    def state(self) -> dict:
        """Views of the committed state per layer (attention rows up to `committed`)."""
        out = {}
        for i in range(len(self.types)):
            if i in self.conv:
                out[i] = {"conv": self.conv[i], "recurrent": self.rec[i]}
            else:
                out[i] = {"keys": self.keys[i][:, :, : self.committed], "values": self.values[i][:, :, : self.committed]}
        return out

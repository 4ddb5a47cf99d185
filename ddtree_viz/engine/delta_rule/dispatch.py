"""THE choice of the tree delta rule's form: `RunnerOptions.gdn_kernel` (a name of GDN_KERNELS) mapped to a form
once per runner, at its construction (`choose`), so that the runner's GDN layer calls one function and has no
branch on the name.

A form gives, once a pass (`form.at(anc, pieces)`), the GDN layer's core between its projections and out_proj,
(u, z, b, a, conv_state, state, gather, weights) -> (o, k, g, delta), made of engine/fused.py's pure pieces (plain
or through torch.compile: `Pieces`) and, where it runs, a Triton kernel:

    torch         step.py's one step (T = 1) or parallel.py's tree form, the whole core one piece (fused.gdn_core):
                  a CPU's form and every other form's fallback
    triton-rule   the whole tree rule in two launches (triton_solve.tree_rule_triton) between the pieces gdn_prep
                  and gated_norm, on q and k at their key heads; trees of 2 .. MAX_T positions. CUDA's default
    triton-solve  the parallel part a piece (fused.gdn_tree_parts), the solve and output product in Triton
                  (triton_solve.tree_solve_triton); trees of 2 .. MAX_T positions

(The whole rule in one kernel, "triton" and "triton-tree", lost every measurement and was deleted:
docs/lab/NOTEBOOK.md section 40.)

Each form's `rule(q, k, v, g, beta, state, ancestors) -> (o, delta)` is its tree delta rule alone (q, k at their Hk
key heads), which `check` compares with the torch form at construction: a Triton form that cannot compile or
differs here leaves the torch form, and says why. Triton is imported only when a Triton form is chosen.

Apart from the tree's form, four pieces each have a one-launch form (ONE_LAUNCH_CHOICES: "torch" or "triton",
"auto" the latter on CUDA): the one-node pass's core (`RunnerOptions.gdn_step`; "torch" the form's own, "triton"
the whole core in one launch a layer, triton_step.gdn_step_triton: conv, gates, the one-step rule, gated norm),
which `check_one_node` holds to the torch core at construction the same way; a tree's conv, l2 norms and gates
before the rule (`RunnerOptions.gdn_prep`; "torch" the compiled piece, "triton" triton_step.gdn_prep_triton,
`check_prep`), for the form that takes q and k at its key heads (triton-rule); the
commit's recurrent update (`RunnerOptions.commit`, `choose_commit`); and a layer's residual add and the norm after
it (`RunnerOptions.norm`, `choose_norm`: engine/triton_norm.py, a program a row).
"""

from __future__ import annotations

import importlib.util
import os
import random
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from ...treeops import ancestor_matrix
from ..fused import GDNWeights, Pieces, gated_norm, gdn_core, gdn_prep, gdn_tree_parts
from .parallel import TreeMasks, solve_steps, tree_delta_rule, tree_delta_rule_parts

GDN_KERNELS = ("auto", "torch", "triton-rule", "triton-solve")
# gdn_step, commit, gdn_prep and norm (each a piece in one launch, or not): auto is triton on CUDA where Triton imports
ONE_LAUNCH_CHOICES = ("auto", "torch", "triton")


def triton_available() -> bool:
    """Triton importable (CUDA builds of torch ship it; the CPU build and CI do not)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors in Triton's interpreter (tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def resolve_option(option: str, device: torch.device) -> str:
    """The form `option` (a name of GDN_KERNELS) means on `device`: "auto" is triton-rule on CUDA where Triton
    imports, else torch; a Triton form where Triton cannot run is a ValueError."""
    cuda = device.type == "cuda"
    if option == "auto":
        return "triton-rule" if cuda and triton_available() else "torch"
    if option != "torch" and not (triton_available() and (cuda or interpreting())):
        raise ValueError(f"gdn_kernel={option!r} needs Triton and a CUDA device (or TRITON_INTERPRET=1)")
    return option


def resolve_step(option: str, device: torch.device, name: str = "gdn_step") -> str:
    """What `option` (a name of ONE_LAUNCH_CHOICES: RunnerOptions' `name`: gdn_step, commit, gdn_prep or norm) means on
    `device`, as resolve_option: auto is triton on CUDA where Triton imports, else torch."""
    if option not in ONE_LAUNCH_CHOICES:
        raise ValueError(f"{name} must be one of {', '.join(ONE_LAUNCH_CHOICES)}, not {option!r}")
    if option == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    return option if option == "torch" else resolve_option(option, device)


# -- the cores: a GDN layer between its projections and out_proj --------------------------------------------------


def torch_core(pieces: Pieces, masks: TreeMasks | None, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """The torch forms, the whole core one piece: one step (masks None: T = 1) or the parallel tree form. u [T, C],
    z [T, H*V], b, a [T, H]; conv_state [C, kernel]; state [H, K, V] fp32; gather [T, kernel]. Returns (o [T, H*V],
    k [T, H, K], g [T, H], delta [T, H, V])."""
    anc, off = (masks.anc_float, masks.off_path) if masks is not None else (None, None)
    return pieces(gdn_core)(u, z, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias, state, w.norm_weight,
                            anc, off, **w.dims)


def step_core(kernel, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """The one-node core in one launch (triton_step.gdn_step_triton). Shapes as torch_core at T = 1; k is returned
    at its Hk key heads [1, Hk, K]."""
    return kernel(u, z, b, a, conv_state, state, gather, w.conv_weight, w.A_log, w.dt_bias, w.norm_weight, **w.dims)


def solve_core(pieces: Pieces, solve, masks: TreeMasks, steps, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """triton-solve: the parallel part one piece, `solve` (the Triton solve + output product) after it. Shapes as
    torch_core; k is returned at its Hk key heads [T, Hk, K] (the commit repeats it)."""
    d = w.dims
    A, Qd, rhs, base, k, g = pieces(gdn_tree_parts)(u, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias,
                                                    state, masks.anc_float, masks.off_path, key_dim=d["key_dim"],
                                                    head_k=d["head_k"], head_v=d["head_v"])
    core, delta = solve(A, Qd, rhs, base, steps)
    pieces.mark(core, 0)
    return pieces(gated_norm)(core, z, w.norm_weight, d["head_v"], d["eps"]), k, g, delta


def grouped_core(pieces: Pieces, rule, prep, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """A Triton rule, `rule(q, k, v, g, beta, state) -> (o, delta)` on q and k at their key heads, between gdn_prep
    (the piece, or `prep`'s launch where given) and the piece gated_norm. Shapes as torch_core; k is returned at its
    Hk key heads [T, Hk, K]."""
    d = w.dims
    if prep is not None:
        q, k, v, g, beta = prep(u, b, a, conv_state, gather, w.conv_weight, w.A_log, w.dt_bias, **d_prep(d))
    else:
        q, k, v, g, beta = pieces(gdn_prep)(u, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias,
                                            d["key_dim"], d["head_k"], d["head_v"], 1)
    core, delta = rule(q, k, v, g, beta, state)
    pieces.mark(core, 0)
    return pieces(gated_norm)(core, z, w.norm_weight, d["head_v"], d["eps"]), k, g, delta


def _masks(anc: torch.Tensor, pieces: Pieces) -> TreeMasks:
    masks = TreeMasks.of(anc)
    pieces.mark(masks.anc_float, 0, masks.anc_float, 1, masks.off_path, 0, masks.off_path, 1)
    return masks


# -- the forms --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchForm:
    """torch: the one-step and parallel tree forms."""

    name: str = "torch"
    kernel: Callable | None = None  # the Triton function (None: torch)
    one_node: Callable | None = None  # the one-node pass's core in one launch (gdn_step="triton"; None: the form's)
    prep: Callable | None = None  # a tree's conv, l2 norms and gates in one launch (gdn_prep="triton"; None: a piece)
    takes_prep: ClassVar[bool] = False  # whether the form's tree core runs `prep` (q and k at their key heads)

    def at(self, anc: torch.Tensor, pieces: Pieces) -> Callable:
        """The core of one pass over a tree whose ancestor-or-self mask is `anc` [T, T] bool (what every GDN layer
        of the pass shares is built here, once)."""
        if anc.shape[0] == 1 and self.one_node is not None:
            return partial(step_core, self.one_node)
        return partial(torch_core, pieces, _masks(anc, pieces) if anc.shape[0] > 1 else None)

    def rule(self, q, k, v, g, beta, state, ancestors):
        """The tree delta rule alone: q, k [T, Hk, K]; v [T, H, V]; g, beta [T, H]; state [H, K, V]; ancestors
        [T, T] bool. Returns o, delta [T, H, V]."""
        return tree_delta_rule(q, k, v, g, beta, state, ancestors)


@dataclass(frozen=True)
class LevelsForm(TorchForm):
    """The level-by-level solve of triton_solve.py (a form of `steps`: the tree's depth - 1, counted on the device)
    for trees of 2 .. max_t positions; the torch forms for one node and for larger trees."""

    max_t: int = 0

    def at(self, anc: torch.Tensor, pieces: Pieces) -> Callable:
        if anc.shape[0] == 1 or anc.shape[0] > self.max_t:
            return TorchForm.at(self, anc, pieces)
        masks = _masks(anc, pieces)
        return self.core(pieces, masks, solve_steps(masks.anc_float))


class RuleForm(LevelsForm):
    """triton-rule: the whole rule in two launches."""

    takes_prep = True

    def core(self, pieces, masks, steps):
        return partial(grouped_core, pieces, partial(self.kernel, anc_float=masks.anc_float, steps=steps), self.prep)

    def rule(self, q, k, v, g, beta, state, ancestors):
        masks = TreeMasks.of(ancestors)
        return self.kernel(q, k, v, g, beta, state, masks.anc_float, solve_steps(masks.anc_float))


class SolveForm(LevelsForm):
    """triton-solve: the parallel part in torch, the solve and output product in Triton."""

    def core(self, pieces, masks, steps):
        return partial(solve_core, pieces, self.kernel, masks, steps)

    def rule(self, q, k, v, g, beta, state, ancestors):
        masks = TreeMasks.of(ancestors)
        parts = tree_delta_rule_parts(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
        return self.kernel(*parts, solve_steps(masks.anc_float))


def _levels(cls, name: str) -> LevelsForm:
    from . import triton_solve

    kernel = triton_solve.tree_rule_triton if cls is RuleForm else triton_solve.tree_solve_triton
    return cls(name, kernel, max_t=triton_solve.MAX_T)


FORMS: dict[str, Callable[[], TorchForm]] = {  # a resolved option (never "auto") -> its form, kernels imported here
    "torch": TorchForm,
    "triton-rule": partial(_levels, RuleForm, "triton-rule"),
    "triton-solve": partial(_levels, SolveForm, "triton-solve"),
}


def check(form: TorchForm, device: torch.device, gdn) -> None:
    """The form's rule against the torch form on this device at this GDN layer's head dims (a 17-node tree, grouped
    heads: the kernel compiles here); raises if it cannot run or differs."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    parents = [-1] + [rng.randrange(i) for i in range(1, 17)]
    anc = torch.from_numpy(ancestor_matrix(parents)).to(device)
    K, V, n = gdn.head_k_dim, gdn.head_v_dim, len(parents)
    q, k = (F.normalize(torch.randn(n, 2, K, generator=gen), dim=-1) for _ in range(2))
    v, state = torch.randn(n, 4, V, generator=gen), torch.randn(4, K, V, generator=gen)
    g, beta = -torch.rand(n, 4, generator=gen), torch.rand(n, 4, generator=gen)
    args = [x.to(device) for x in (q, k, v, g, beta, state)]
    repeated = [x.repeat_interleave(2, dim=1) for x in args[:2]] + args[2:]
    want = tree_delta_rule(*repeated, anc)
    for got, ref in zip(form.rule(*args, anc), want):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def check_one_node(kernel, device: torch.device, gdn) -> None:
    """The one-node core `kernel` against the torch core (eager) on this device, on this GDN layer's own weights and
    random inputs at its widths (the window from the committed conv inputs and the node's own); raises if it cannot
    run or differs (by more than a rounding of the model's dtype)."""
    w = GDNWeights.of(gdn)
    dtype, d, gen = w.conv_weight.dtype, w.dims, torch.Generator().manual_seed(0)
    H, C, kw = gdn.num_v_heads, w.conv_weight.shape[0], w.conv_weight.shape[1]
    u, z, b, a = (torch.randn(1, n, generator=gen).to(device, dtype) for n in (C, H * d["head_v"], H, H))
    conv_state = torch.randn(C, kw, generator=gen).to(device, dtype)
    state = torch.randn(H, d["head_k"], d["head_v"], generator=gen).to(device)
    gather = torch.arange(1, kw + 1, device=device)[None]  # a root's window
    got = step_core(kernel, u, z, b, a, conv_state, state, gather, w)
    want = list(torch_core(Pieces(False), None, u, z, b, a, conv_state, state, gather, w))
    want[1] = want[1][:, :: d["rep"]]  # k at its key heads
    _held(got, want, dtype)


def _held(got, want, dtype: torch.dtype) -> None:
    """A one-launch piece's outputs against the torch form's: within 1e-4 in fp32, a rounding (2e-2) in bf16/fp16."""
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for x, y in zip(got, want):
        torch.testing.assert_close(x.float(), y.float(), atol=tol, rtol=tol)


def d_prep(dims: dict) -> dict:
    """gdn_prep_triton's keywords from GDNWeights.dims."""
    return {name: dims[name] for name in ("key_dim", "head_k", "head_v", "rep")}


def check_prep(kernel, device: torch.device, gdn) -> None:
    """The tree's prep `kernel` against the piece gdn_prep (q, k at their key heads) on this GDN layer's weights and
    random inputs over a random 9-node tree's conv windows; raises if it cannot run or differs by more than a
    rounding of the model's dtype."""
    from ..gdn_tree import TreeIndex

    w = GDNWeights.of(gdn)
    dtype, d, gen, rng = w.conv_weight.dtype, w.dims, torch.Generator().manual_seed(0), random.Random(0)
    H, C, kw = gdn.num_v_heads, w.conv_weight.shape[0], w.conv_weight.shape[1]
    gather = TreeIndex.build([-1] + [rng.randrange(i) for i in range(1, 9)], kw, device).conv_gather
    u, b, a = (torch.randn(9, n, generator=gen).to(device, dtype) for n in (C, H, H))
    conv_state = torch.randn(C, kw, generator=gen).to(device, dtype)
    got = kernel(u, b, a, conv_state, gather, w.conv_weight, w.A_log, w.dt_bias, **d_prep(d))
    want = gdn_prep(u, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias, d["key_dim"], d["head_k"],
                    d["head_v"], 1)
    _held(got, want, dtype)


def choose(option: str, device: torch.device, gdn, step: str = "torch",
           prep: str = "torch") -> tuple[TorchForm, str | None]:
    """The form of resolved options (`resolve_option`, `resolve_step`) for a runner on `device` whose GDN layers are
    like `gdn`: (form, None), or (the torch forms, why) where a Triton form cannot run here (it must not stop the
    runner): the tree's form, the one-node core and the tree's prep each fall back alone."""
    why = []
    try:
        form = FORMS[option]()
        if form.kernel is not None:
            check(form, device, gdn)
    except Exception as exc:
        form = TorchForm()
        why.append(f"{type(exc).__name__}: {str(exc)[:500]}")
    wanted = [("one_node", "gdn_step_triton", check_one_node, "the one-node step")] if step == "triton" else []
    if prep == "triton" and form.takes_prep:
        wanted.append(("prep", "gdn_prep_triton", check_prep, "the tree's prep"))
    for field, name, held, what in wanted:  # each one-launch piece checked here, falling back alone
        try:
            from . import triton_step

            kernel = getattr(triton_step, name)
            held(kernel, device, gdn)
            form = replace(form, **{field: kernel})
        except Exception as exc:
            why.append(f"{what}: {type(exc).__name__}: {str(exc)[:500]}")
    return form, "; ".join(why) or None


def choose_commit(option: str, device: torch.device) -> tuple[Callable | None, str | None]:
    """The commit's recurrent update for a resolved option (`resolve_step`): (triton_commit's kernel, None) where it
    runs here and matches fused.commit_recurrent on a small commit (two layers, grouped keys, a path of 3 of 4
    padded steps); (None, why) where it cannot (the torch piece runs); (None, None) for "torch"."""
    if option != "triton":
        return None, None
    try:
        from ..fused import commit_recurrent
        from .triton_commit import commit_recurrent_triton

        gen = torch.Generator().manual_seed(0)
        rec = torch.randn(2, 4, 16, 32, generator=gen).to(device)
        k, g = torch.randn(2, 5, 2, 16, generator=gen).to(device), -torch.rand(2, 5, 4, generator=gen).to(device)
        delta = torch.randn(2, 5, 4, 32, generator=gen).to(device)
        path, steps, length = (torch.tensor(x, device=device) for x in ([0, 2, 3, 3], [0, 1, 2, 3], 3))
        want = rec.clone()
        commit_recurrent(want, k, g, delta, path, steps, length)
        commit_recurrent_triton(rec, k, g, delta, path, steps, length)
        torch.testing.assert_close(rec, want, atol=1e-4, rtol=1e-4)
        return commit_recurrent_triton, None
    except Exception as exc:
        return None, f"the commit: {type(exc).__name__}: {str(exc)[:500]}"


def choose_norm(option: str, device: torch.device, dtype: torch.dtype,
                width: int) -> tuple[Callable | None, str | None]:
    """A layer's residual add and norm for a resolved option (`resolve_step`): (triton_norm's launch, None) where it
    takes the model's rows (`width` columns) and gives fused.add_rms_norm's sum and, to a rounding, its norm, on
    three rows of 1,000 columns in the model's dtype; (None, why) where it cannot (the piece runs); (None, None)
    for "torch"."""
    if option != "triton":
        return None, None
    try:
        from ..fused import add_rms_norm
        from ..triton_norm import WIDEST, add_rms_norm_triton

        if width > WIDEST:
            return None, f"the add and norm: rows of {width} columns, wider than the launch's {WIDEST}"

        gen = torch.Generator().manual_seed(0)
        x, y = (torch.randn(1, 3, 1000, generator=gen).to(device, dtype) for _ in range(2))
        scale = (1 + 0.1 * torch.randn(1000, generator=gen)).to(device)
        got, want = add_rms_norm_triton(x, y, scale, 1e-6), add_rms_norm(x, y, scale, 1e-6)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[1], want[1])  # the dtype's tolerance: a rounding apart at most
        return add_rms_norm_triton, None
    except Exception as exc:
        return None, f"the add and norm: {type(exc).__name__}: {str(exc)[:500]}"

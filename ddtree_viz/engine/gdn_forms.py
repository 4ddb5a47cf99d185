"""The static runner's GDN core in the forms the kernels' dispatch chose: `RunnerForms.gdn_kernel` (the tree delta
rule's form: kernels/gdn_tree/dispatch.py), `gdn_step` and `gdn_prep` (one launch each: kernels/gdn_step/dispatch.py)
made into one form object once per runner, at its construction (`choose`), so that the runner's GDN layer calls one
function and has no branch on a name.

A form gives, once a pass (`form.at(anc, pieces)`), the GDN layer's core between its projections and out_proj,
(u, z, b, a, conv_state, state, gather, weights) -> (o, k, g, delta), made of engine/fused.py's pure pieces (plain
or through torch.compile: `Pieces`) and, where it runs, a Triton kernel:

    torch         the one-step or the parallel tree form, the whole core one piece (fused.gdn_core): a CPU's form
                  and every other form's fallback
    triton-rule   the whole tree rule in two launches between the pieces gdn_prep (or its launch) and gated_norm, on
                  q and k at their key heads; trees of 2 .. MAX_T positions. CUDA's default
    triton-solve  the parallel part a piece (fused.gdn_tree_parts), the solve and output product in one launch; trees
                  of 2 .. MAX_T positions

A Triton form that cannot compile or differs from the torch form here leaves the torch form, and says why; the
one-node core and the tree's prep each fall back alone. This module sits above the kernels (it imports them, never
the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, ClassVar

import torch

from .fused import GDNWeights, Pieces, gated_norm, gdn_core, gdn_prep, gdn_tree_parts
from .kernels.device import device_error
from .kernels.gdn_step import dispatch as step_dispatch
from .kernels.gdn_step.dispatch import prep_keywords as d_prep
from .kernels.gdn_tree import dispatch as tree_dispatch
from .kernels.gdn_tree.parallel import TreeMasks, solve_steps

# -- the cores: a GDN layer between its projections and out_proj --------------------------------------------------


def torch_core(pieces: Pieces, masks: TreeMasks | None, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """The torch forms, the whole core one piece: one step (masks None: T = 1) or the parallel tree form. u [T, C],
    z [T, H*V], b, a [T, H]; conv_state [C, kernel]; state [H, K, V] fp32; gather [T, kernel]. Returns (o [T, H*V],
    k [T, H, K], g [T, H], delta [T, H, V])."""
    anc, off = (masks.anc_float, masks.off_path) if masks is not None else (None, None)
    return pieces(gdn_core)(u, z, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias, state, w.norm_weight,
                            anc, off, **w.dims)


def step_core(kernel, u, z, b, a, conv_state, state, gather, w: GDNWeights):
    """The one-node core in one launch (gdn_step_triton). Shapes as torch_core at T = 1; k is returned at its Hk key
    heads [1, Hk, K]."""
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
        return tree_dispatch.rule_of(self.name)(q, k, v, g, beta, state, ancestors)


@dataclass(frozen=True)
class LevelsForm(TorchForm):
    """The level-by-level solve of kernels/gdn_tree/triton_solve.py (a form of `steps`: the tree's depth - 1, counted
    on the device) for trees of 2 .. max_t positions; the torch forms for one node and for larger trees."""

    max_t: int = 0

    def at(self, anc: torch.Tensor, pieces: Pieces) -> Callable:
        if not tree_dispatch.takes(self.max_t, anc.shape[0]):
            return TorchForm.at(self, anc, pieces)
        masks = _masks(anc, pieces)
        return self.core(pieces, masks, solve_steps(masks.anc_float))


class RuleForm(LevelsForm):
    """triton-rule: the whole rule in two launches."""

    takes_prep = True

    def core(self, pieces, masks, steps):
        return partial(grouped_core, pieces, partial(self.kernel, anc_float=masks.anc_float, steps=steps), self.prep)


class SolveForm(LevelsForm):
    """triton-solve: the parallel part in torch, the solve and output product in Triton."""

    def core(self, pieces, masks, steps):
        return partial(solve_core, pieces, self.kernel, masks, steps)


def _levels(cls, name: str) -> LevelsForm:
    kernel, max_t = tree_dispatch.triton_kernel(name)
    return cls(name, kernel, max_t=max_t)


FORMS: dict[str, Callable[[], TorchForm]] = {  # a resolved option (never "auto") -> its form, kernels imported here
    "torch": TorchForm,
    "triton-rule": partial(_levels, RuleForm, "triton-rule"),
    "triton-solve": partial(_levels, SolveForm, "triton-solve"),
}


def check(form: TorchForm, device: torch.device, gdn) -> None:
    """The form's rule against the torch form on this device at this GDN layer's head dims (kernels/gdn_tree's
    check: the kernel compiles here); raises if it cannot run or differs."""
    tree_dispatch.check(form.rule, device, gdn.head_k_dim, gdn.head_v_dim)


def check_one_node(kernel, device: torch.device, gdn) -> None:
    """The one-node core `kernel` against its torch reference on this GDN layer's own weights (kernels/gdn_step's
    check_step); raises if it cannot run or differs."""
    step_dispatch.check_step(kernel, device, GDNWeights.of(gdn))


def check_prep(kernel, device: torch.device, gdn) -> None:
    """A tree's prep `kernel` against the piece gdn_prep on this GDN layer's weights (kernels/gdn_step's
    check_prep); raises if it cannot run or differs."""
    step_dispatch.check_prep(kernel, device, GDNWeights.of(gdn))


def choose(option: str, device: torch.device, gdn, step: str = "torch",
           prep: str = "torch") -> tuple[TorchForm, str | None]:
    """The form of resolved options (kernels' resolve_option, resolve_step) for a runner on `device` whose GDN layers
    are like `gdn`: (form, None), or (the torch forms, why) where a Triton form cannot run here (it must not stop the
    runner): the tree's form, the one-node core and the tree's prep each fall back alone."""
    why = []
    try:
        form = FORMS[option]()
        if form.kernel is not None:
            check(form, device, gdn)
    except Exception as exc:
        if device_error(exc):  # the device's failure, not a form that cannot run here: raised
            raise
        form = TorchForm()
        why.append(f"{type(exc).__name__}: {str(exc)[:500]}")
    weights = GDNWeights.of(gdn)
    one_node, why_step = step_dispatch.choose_step(step, device, weights)
    tree_prep, why_prep = step_dispatch.choose_prep(prep if form.takes_prep else "torch", device, weights)
    form = replace(form, one_node=one_node, prep=tree_prep)
    why += [w for w in (why_step, why_prep) if w]
    return form, "; ".join(why) or None

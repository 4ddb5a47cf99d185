"""Records as the commands print them, shared by run, replay and bench: token texts, how the reference is named,
a session's acceptance analysis, and two configurations compared."""

from __future__ import annotations

from ..options import CHAINS
from ..trace import is_sampled
from ..words import plural


def texts(trace, ids) -> str:
    """The recorded text of token `ids` (<id> for a token the trace has no text for)."""
    return "".join(trace.token_texts.get(str(i), f"<{i}>") for i in ids)


def reference_words(settings: dict) -> tuple[str, str, str]:
    """How the CLI names the reference: (what the output is compared with, its short name, its margin)."""
    if not is_sampled(settings):
        return "greedy", "greedy", "greedy top-2 logit margin"
    return ("the target's own sampling (same seed)", "sampling",
            "sampling decision margin (top-2 gap of logits/T + noise)")


def print_session_analysis(steps, block_size, method: str) -> None:
    """The session's acceptance by depth and the budget that would have done (ddtree_viz.analysis)."""
    from .. import analysis
    from ..render.budget_view import budget_line, rates_line

    if not steps:
        return
    hist = analysis.acceptance_histogram(steps, block_size)
    print("acceptance histogram (rounds with 0, 1, 2, ... accepted drafts kept; a cut round at what it kept): " + " ".join(map(str, hist)))
    print("per-depth acceptance P(accepted >= d | accepted >= d-1, tree depth >= d): "
          + rates_line(analysis.per_depth_acceptance(steps, block_size)))
    unit = "chain length" if method in CHAINS else "budget"
    exact = "" if all(analysis.curve_is_exact(s) for s in steps) else " [naive verify: the same choices only]"
    print(f"session {unit} curve ({unit}:tokens gained, where it steps up){exact}: "
          + budget_line(analysis.session_budget_curve(steps)))
    print("  " + analysis.curve_caveat(method))


def print_compare(a, b) -> None:
    """Two traces of one prompt (A, B): where their outputs part, and each one's verdict against its reference."""
    from ..analysis import compare_outputs, config_label

    c = compare_outputs(a, b)
    print(f"compare: A = {config_label(a.settings)}; B = {config_label(b.settings)}")
    if c["part_at"] is None:
        print(f"outputs identical for {plural(c['agree_upto'], 'token')}")
    else:
        i = c["part_at"]
        print(f"outputs part at generated token {i}: A {texts(a, [c['a_token_id']])!r} ({c['a_token_id']}) vs "
              f"B {texts(b, [c['b_token_id']])!r} ({c['b_token_id']})")
    for name, side in (("A", c["a"]), ("B", c["b"])):
        verdict = ("reference not recorded" if side["identical"] is None else "identical to its reference"
                   if side["identical"] else f"comparison with its reference INVALID: {side['invalid']}"
                   if side.get("invalid") else f"DIVERGES from its reference at token {side['first_divergence']}")
        mean = "-" if side["mean_acceptance"] is None else f"{side['mean_acceptance']:.2f}"
        print(f"  {name}: {plural(side['rounds'], 'round')}, {plural(side['tokens'], 'token')}, mean acceptance "
              f"{mean}: {verdict}")

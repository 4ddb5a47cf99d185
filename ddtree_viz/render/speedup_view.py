"""Does the tree pay here? A session's predicted speed-up over greedy by budget (speedup.SessionSpeedup: its own
rounds x this machine's measured costs), drawn, and the same figures in words beside it.

- `pays_spec(study)`: S(b) at the measured budgets the rounds reach, greedy's S = 1, the DFlash chain's point at its
  drafted length, the session's budget and the break-even budget marked. Plain data (figure.FigureSpec).
- `pays_html(study, ...)`: the numbers, how many rounds they rest on, and that they are a prediction.
- `pays_missing_html(...)`: what stands in where there is nothing to predict from, or no costs measured (the command
  that measures them).
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from .figure import FigureSpec, title_axis_px
from .scheme import PAGE_SCHEME, Scheme
from ..words import plural
from .text import esc

TICK_OCTAVES = 0.4  # the budget axis labels the session's budget and the chain's length this far from other ticks
NOT_PREDICTED = "#999999"  # greedy's line and the session's budget: references, not predictions
CAVEAT = ("A prediction, not a measurement: each round's tokens under a smaller budget are exact from the state that "
          "round started in, but a session run at that budget would have started its later rounds elsewhere, and "
          "the costs were timed from one prompt (docs/SPEEDUP.md). <code>analyze</code> checks such a prediction by "
          "real runs.")



def command_html(command: str) -> str:
    """A command to copy, wrapped inside the panel's width (a model path makes it longer than the window)."""
    return f'<pre style="white-space:pre-wrap;overflow-wrap:anywhere"><code>{esc(command)}</code></pre>'

def pays_figure(study, **options) -> go.Figure:
    """pays_spec(study, **options) as a checked plotly go.Figure."""
    return pays_spec(study, **options).figure()


def pays_spec(study, *, scheme: Scheme = PAGE_SCHEME) -> FigureSpec:
    """S(b) = tau(b) x greedy step / round cost(b) at the measured budgets the session's rounds reach
    (`study.prediction`); greedy's S = 1; the chain's point at its drafted length (block size - 1), hollow where
    its tokens per round are a lower bound; the session's budget (a vertical line) and the break-even budget (a
    ring on the curve). Every figure drawn is `study`'s own: nothing here computes a speed-up."""
    p = study.prediction
    xs = sorted(p.budgets)
    ys = [p.budgets[b].speedup for b in xs]
    chain = p.chain
    top = max([*ys, chain.speedup if chain else 0.0, 1.0]) * 1.15
    spread = [*xs, study.budget, *([study.chain_nodes] if chain else [])]
    lo, hi = math.log2(min(spread)), math.log2(max(spread))
    pad = max(hi - lo, 1.0) * 0.06
    data = [
        dict(type="scatter", x=[2 ** (lo - pad), 2 ** (hi + pad)], y=[1.0, 1.0], mode="lines", name="greedy (S = 1)",
             line=dict(color=NOT_PREDICTED, width=1, dash="dash"), hoverinfo="skip"),
        dict(type="scatter", x=[study.budget, study.budget], y=[0.0, top], mode="lines",
             name=f"this session's budget ({study.budget})", line=dict(color=NOT_PREDICTED, width=2, dash="dot"),
             hoverinfo="skip"),
        dict(type="scatter", x=xs, y=ys, mode="lines+markers", name="predicted S(b), DDTree",
             line=dict(color=scheme.path, width=2), marker=dict(size=7),
             customdata=[[p.budgets[b].tau, p.budgets[b].round_ms] for b in xs],
             hovertemplate="budget %{x}: S = %{y:.2f}× (%{customdata[0]:.2f} tokens/round, "
                           "%{customdata[1]:.2f} ms/round)<extra>predicted</extra>"),
    ]
    if chain is not None:
        bound = study.chain_at_least > 0
        data.append(dict(type="scatter", x=[study.chain_nodes], y=[chain.speedup], mode="markers",
                         name="DFlash chain" + (" (at least)" if bound else ""),
                         marker=dict(symbol="diamond-open" if bound else "diamond", size=12, color=scheme.bar,
                                     line=dict(width=2, color=scheme.bar)),
                         hovertemplate=f"DFlash chain, {study.chain_nodes} drafted tokens: S = "
                                       f"{'at least ' if bound else ''}%{{y:.2f}}× ({chain.tau:.2f} tokens/round, "
                                       f"{chain.round_ms:.2f} ms/round)<extra>predicted</extra>"))
    if study.pays_up_to is not None:
        even = p.budgets[study.pays_up_to]
        data.append(dict(type="scatter", x=[study.pays_up_to], y=[even.speedup], mode="markers",
                         name=f"break-even budget ({study.pays_up_to})",
                         marker=dict(symbol="circle-open", size=17, color=scheme.rejected, line=dict(width=2)),
                         hovertemplate="break-even: budget %{x}, S = %{y:.2f}×<extra></extra>"))
    ticks = list(xs)
    for extra in (study.budget, *([study.chain_nodes] if chain else [])):  # where no tick label is too close
        if all(abs(math.log2(extra / t)) > TICK_OCTAVES for t in ticks):
            ticks = sorted([*ticks, extra])
    layout = dict(
        title=dict(text=f"Predicted from {plural(p.rounds, 'round')}", font=dict(size=14)),
        xaxis=dict(type="log", title=dict(text="budget (tree nodes; the chain: its drafted tokens)"),
                   range=[(lo - pad) * math.log10(2), (hi + pad) * math.log10(2)], tickvals=ticks,
                   ticktext=[str(b) for b in ticks]),
        yaxis=dict(title=dict(text="speed-up over greedy"), range=[0, top], ticksuffix="×", tickformat=".1f"),
        # the legend under the axis title: beside the curve it sat on the markers in a half-width panel
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.3, yanchor="top", font=dict(size=11)),
        height=380, plot_bgcolor="white", showlegend=True,
        margin=dict(l=title_axis_px(["0.0×"]), r=20, t=50, b=120),
    )
    return FigureSpec(data, layout)


def _x(value: float) -> str:
    return f"{value:.2f}×"


def pays_html(study, *, first: int, last: int, device: str, compare: bool = False, sampled: bool = False,
              command: str | None = None) -> str:
    """The study in words: what it rests on (rounds `first`..`last`, the machine `device` and its costs), the
    session's budget, the best and break-even budgets, the chain's point, and that it is a prediction; `command`
    (the one that measures the costs) where the session's budget has none. Escaped."""
    p, costs = study.prediction, study.costs
    rests = (f"this session's {plural(p.rounds, 'exact DDTree round')} (rounds {first}–{last}"
             + (", configuration A's: B is not estimated here" if compare else "") + ") × this machine's measured "
             f"round costs ({esc(device)}, {esc(costs.engine)} engine, block size {costs.block_size}, greedy "
             f"{costs.greedy_ms:.2f} ms a token, measured {esc(costs.measured_at[:10])})")
    items = [_own_budget(study), _best_and_even(study), _chain(study)]
    if study.unreached:
        items.append(f"Measured budgets {', '.join(map(str, study.unreached))}: past this session's largest tree "
                     f"({plural(study.reach, 'node')}), so not estimated (no round tried them).")
    if p.new_tokens:
        items.append(f"A round's cost counts this decode's first round (it drafts over the prompt's rows too) spread "
                     f"over the {plural(round(p.new_tokens), 'token')} made so far: a longer decode's rounds cost "
                     "less.")
    if sampled:
        items.append("The costs were timed greedy; sampling adds its filtering to every round.")
    measure = (command_html(command) if command and study.budget not in study.costs.rounds
               else "")
    return (f'<div class="ddv-pays"><p><b>Predicted</b> from {rests}:</p><ul>'
            + "".join(f"<li>{item}</li>" for item in items)
            + f'</ul>{measure}<p style="color:#666;font-size:90%">{CAVEAT}</p></div>')


def _own_budget(study) -> str:
    point = study.prediction.budgets.get(study.budget)
    if point is None and study.budget in study.costs.rounds:  # measured, but the candidates ran out first
        return (f"This session's budget {study.budget}: its trees had at most {study.reach} nodes, so S there is not "
                "estimated.")
    if point is None:
        measured = ", ".join(map(str, sorted(study.costs.rounds)))
        return (f"This session's budget {study.budget}: no cost measured there (measured at {measured}); the command "
                "under this list measures it.")
    return (f"This session's budget {study.budget}: <b>S = {_x(point.speedup)}</b> ({point.tau:.2f} tokens a round, "
            f"{point.round_ms:.2f} ms a round).")


def _best_and_even(study) -> str:
    p = study.prediction
    if not p.budgets:
        return f"No measured budget is within this session's trees ({study.reach} nodes): nothing to draw."
    best = p.budgets[p.best_budget]
    text = f"Best measured budget: {p.best_budget}, S = {_x(best.speedup)}. "
    pays = [b for b, point in sorted(p.budgets.items()) if point.speedup >= 1.0]
    if study.pays_up_to is None:
        return text + "<b>The tree does not pay here</b>: S &lt; 1 at every measured budget these rounds reach."
    text += f"S ≥ 1 at {_budgets(pays)}. "
    if study.pays_up_to == max(p.budgets):
        return (text + f"Break-even budget: at least <b>{study.pays_up_to}</b>, the largest measured budget these "
                "rounds reach (past it: not estimated).")
    return (text + f"Break-even budget: <b>{study.pays_up_to}</b> (at the next measured budget, "
            f"{min(b for b in p.budgets if b > study.pays_up_to)}, S falls below 1).")


def _budgets(budgets: list[int]) -> str:
    return ("budget " if len(budgets) == 1 else "budgets ") + ", ".join(map(str, budgets))


def _chain(study) -> str:
    p = study.prediction
    if p.chain is None:
        return f"No DFlash chain point: {esc(study.chain_why)}."
    bound = study.chain_at_least
    at_least = "at least " if bound else ""
    text = (f"DFlash chain (the drafter's top-1 at each of its {study.chain_nodes} drafted depths): S = {at_least}"
            f"{_x(p.chain.speedup)} ({at_least}{p.chain.tau:.2f} tokens a round, {p.chain.round_ms:.2f} ms a round), "
            "its tokens from the same rounds: the top-1 path checked against the target's tokens they verified")
    text += (f"; in {plural(bound, 'round')} the tree's path ended where the chain's had not, so those count at "
             "least what was verified." if bound else ".")
    if not p.budgets:
        return text
    beats = [b for b, point in sorted(p.budgets.items()) if point.speedup >= p.chain.speedup]
    if not beats:
        return text + " <b>The tree beats the chain at no measured budget</b> (the chain's S is above them all)."
    return text + (f" The tree is at least as fast as the chain at <b>{_budgets(beats)}</b>"
                   + (" (perhaps fewer: the chain's S is a lower bound)." if bound else "."))


def pays_missing_html(why: str, command: str | None = None) -> str:
    """What the panel says where it draws nothing: `why` (escaped), and `command`, the one that measures this
    machine's costs, where that is what is missing."""
    text = f'<div class="ddv-pays"><p>{esc(why)}</p>'
    if command:
        text += (command_html(command) + f"<p style=\"color:#666;font-size:90%\">The costs are cached in "
                 "~/.cache/ddtree-viz/costs.json ($DDTREE_VIZ_CACHE/costs.json when that is set), by model pair, "
                 "dtype, device, engine and block size (docs/SPEEDUP.md); the next Step, Back or Forward reads "
                 "them.</p>")
    return text + "</div>"

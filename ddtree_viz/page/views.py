"""What the page shows, by view name: VIEWS maps each view's name to the function that builds it from the round on
screen. The page's widgets carry the same names (page/web/step_tab.py), so a view, its widget and its renderer are
paired by name; `render_views` builds them all (a `Views`), `render_check` the few a check changes.

Adding a view: its renderer (render/), one VIEWS entry here, its widget under the same name in the Step tab's layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property

from ..analysis import config_label
from ..render.budget_view import budget_spec, depth_spec
from ..render.cache_view import cache_spec, cache_table, cache_table_html
from ..render.compare_view import compare_html
from ..render.diff_view import output_vs_greedy_html
from ..render.divergence_view import divergence_html, divergence_rows
from ..render.figure import FigureSpec
from ..render.grid_view import grid_data, grid_spec
from ..render.inspect_view import inspector_html, node_choices, stop_html
from ..render.layout import tree_layout
from ..render.mask_plot import mask_spec
from ..render.prompt_view import prompt_html
from ..render.speedup_view import pays_html, pays_missing_html, pays_spec
from ..render.stats_view import acceptance_spec, stats_markdown, stats_summary
from ..speedup import session_speedup, tree_rounds
from ..render.text import esc
from ..render.tree_plot import tree_spec
from ..trace import Trace, is_sampled, sampling_flags, sampling_label
from ..words import plural
from .host import ModelHost
from ..errors import InputError
from .progress import shown_check, status_line
from .state import TabState, read_settings, rounds_shown, shown_step

MARKUP_CHARS = set("<>&\"'\\`*_[]#|~!")  # written as character references in a Markdown view
DIVERGENCE_ROUNDS = 20  # the page's divergence table shows the last this many rounds up to the one on screen
ROUND_VIEW_CACHE = 64  # per tab: the views of this many (round, phase) pairs are kept (a round's never change)
# the tree's panel in px, alone and in compare mode (half), in the 1280- to 1500-px windows the page is laid out for
# (gradio's column stops growing there): its node labels are thinned to what fits that (tree_plot.labelled)
TREE_PX, TREE_PX_COMPARE = 1214, 598


class Views(dict):
    """Everything the page shows, by view name (VIEWS); also as attributes (`views.status`). A view named X_spec is
    a figure as plain plotly JSON (a FigureSpec: what the page sends); `views.X` gives it as a checked go.Figure
    (scripts, tests)."""

    def __getattr__(self, name: str):
        if name in self:
            return self[name]
        if f"{name}_spec" in self:
            spec = self[f"{name}_spec"]
            return spec.figure() if isinstance(spec, FigureSpec) else spec
        raise AttributeError(name)


@dataclass
class RoundViews:
    """What one round shows (it never changes once recorded, so a tab keeps it: scrubbing redraws nothing)."""

    tree: FigureSpec
    mask: FigureSpec
    cache_chart: FigureSpec
    cache_rows: list[dict]
    cache_html: str


class Shown:
    """The round on screen, as every view reads it: a consistent copy of the tab, its trace and round `k`, the
    token texts, and what several views share (the round's cached views, the inspector), each made once."""

    def __init__(self, host: ModelHost, tab: TabState, phase: str = "verified"):
        self.started = time.perf_counter()
        self.host, self.phase, self.tab = host, phase, tab.snapshot()
        self.trace = trace = self.tab.trace
        self.empty = trace is None or not trace.steps
        if self.empty:
            return
        self.view = max(0, min(self.tab.view, rounds_shown(self.tab) - 1))
        self.step = shown_step(trace, self.view)
        self.k = self.step.index
        self.text = self.tab.token_text()
        self.compare = self.tab.other_trace is not None and bool(self.tab.other_trace.steps)

    @cached_property
    def cache(self):
        """The tab's view cache, for this session's (or trace's) records."""
        tab = self.tab
        return tab.views.for_source(tab.session if tab.session is not None and not tab.replay else self.trace)

    @cached_property
    def round(self) -> RoundViews:
        return _round_views(self)

    @cached_property
    def pays(self) -> tuple[FigureSpec | None, str]:
        return _pays(self)

    @cached_property
    def inspector(self) -> tuple[str, list, int | None]:
        return inspector_view(self.tab)

    @property
    def steps(self) -> list:
        """The rounds up to the one on screen."""
        return self.trace.steps[: self.k + 1]


@dataclass(frozen=True)
class View:
    """One view: its value for the round on screen (`build`), and when there is no round to show (`blank`)."""

    build: Callable[[Shown], object]
    blank: Callable[[Shown], object] = lambda s: None


def _no_text(s: Shown) -> str:
    return ""


# The views in the order the page's Step outputs list their widgets (the served API's order). "stats" is built
# last (it says what building the others cost).
VIEWS: dict[str, View] = {
    "status": View(lambda s: _notice(s.tab) + _status(s.host, s.tab, s.k), lambda s: _notice(s.tab) + _blank_status(s)),
    "tree_spec": View(lambda s: s.round.tree),
    "mask_spec": View(lambda s: s.round.mask),
    "cache_html": View(lambda s: s.round.cache_html, _no_text),  # the round's per-layer cache (compact table)
    "cache_chart_spec": View(lambda s: s.round.cache_chart),
    "diff_html": View(lambda s: output_vs_greedy_html(s.trace, s.text, upto_step=s.k, stopped=_check_stopped(s.tab)),
                      _no_text),
    "acceptance_spec": View(lambda s: acceptance_spec(s.steps)),
    "stats": View(lambda s: _stats(s.tab), _no_text),
    "divergence": View(lambda s: _divergence(s.trace, s.k, s.text), _no_text),
    "view": View(lambda s: s.view, lambda s: 0),  # the round shown (0-based), of `rounds`
    "tree_b_spec": View(lambda s: _tree_b(s)),  # compare mode: configuration B's tree of the round
    # compare mode: both outputs token by token, where they part, verdicts (B's tokens named by B's texts)
    "compare": View(lambda s: _headed(COMPARE_HEADING, compare_html(
        s.trace, s.tab.other_trace, s.text, view=s.tab.view, token_text_b=s.tab.other_token_text()))
        if s.compare else "", _no_text),
    "grid_spec": View(lambda s: _grid(s)),  # the drafter's grid of the round (None: not recorded)
    "budget_spec": View(lambda s: budget_spec(s.steps)),  # the budget that would have done
    "depth_spec": View(lambda s: depth_spec(s.steps, s.trace.settings.get("block_size"))),  # acceptance by depth
    "stop": View(lambda s: _headed(STOP_HEADING, stop_html(s.step, s.text)) if s.step.nodes else "",
                 _no_text),  # where and why it stopped
    "inspector": View(lambda s: s.inspector[0], _no_text),  # the node inspector
    "inspect": View(lambda s: s.inspector[2]),  # the node it shows
    "prompt": View(lambda s: prompt_html(s.trace), _no_text),  # the prompt as prefilled (templated, specials marked)
    # does the tree pay here: S(b) from the session's rounds and this machine's costs, in a figure and in words
    "pays_spec": View(lambda s: s.pays[0]),
    "pays_html": View(lambda s: s.pays[1], lambda s: pays_missing_html(PAYS_BLANK)),
    # not a widget of their own: read with the ones above
    "cache_rows": View(lambda s: s.round.cache_rows, lambda s: s.host.layout),  # the per-layer cache, as rows
    "rounds": View(lambda s: rounds_shown(s.tab), lambda s: 0),  # rounds the round slider spans
    "node_choices": View(lambda s: s.inspector[1], lambda s: []),  # the inspector's selector: (label, position)
    "layout_html": View(lambda s: s.host.layout_html(), lambda s: s.host.layout_html()),  # the layout at load
}
TIMED = "stats"  # built after the others: it reports their time
CHECKED = ("status", "diff_html", "stats")  # what a check against the reference changes


def render_views(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    """Everything the page shows for the round on screen. A round's tree, mask, cache views and grid are built once
    per tab (RoundViews); the rest is bounded (the disagreement table: the last DIVERGENCE_ROUNDS rounds)."""
    s = Shown(host, tab, phase)
    if s.empty:
        return Views((name, view.blank(s)) for name, view in VIEWS.items())
    views = _build(s, (name for name in VIEWS if name != TIMED))
    s.tab.timing["views"] = (time.perf_counter() - s.started) * 1e3  # the tab's own timing (a snapshot shares it)
    views.update(_build(s, (TIMED,)))
    return views


def render_check(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    """The views a reference check changes (CHECKED), without redrawing the figures."""
    s = Shown(host, tab, phase)
    if s.empty:
        return Views(status=VIEWS["status"].blank(s), diff_html="", stats="")
    return _build(s, CHECKED)


NEW_SESSION = ("*Settings changed: the next **Step** starts a new session with them (the rounds on screen are the "
               "current session's).*")


def status_after_change(host: ModelHost, tab: TabState, values: dict) -> str:
    """The status line once a setting (or the prompt) changed: says so when the next Step starts a new session, so
    that Step does not silently replace what is shown. A replay goes on with Step (actions.step): no note."""
    return render_check(host, tab)["status"] + change_note(host, tab, values)


def change_note(host: ModelHost, tab: TabState, values: dict) -> str:
    """NEW_SESSION as the status line's last paragraph when the page's settings (`values`) would start a new session
    at the next Step, else ''. Also what a round's check (which ends after the round is shown) keeps in the status: a
    setting changed while it ran must not lose its note."""
    if tab.session is None or tab.replay or tab.settings is None:
        return ""
    try:
        same = read_settings(host, values).same_session(tab.settings)
    except InputError:
        same = False  # Step will say what is wrong
    return "" if same else f"\n\n{NEW_SESSION}"


def _build(s: Shown, names: Iterable[str]) -> Views:
    return Views((name, VIEWS[name].build(s)) for name in names)


def inspector_view(tab: TabState) -> tuple[str, list, int | None]:
    """The node inspector for the round shown: (its HTML, the selector's choices, the node shown). With no node
    picked it shows the last accepted one, where the walk stopped."""
    step = shown_step(tab.trace, tab.view)
    if step is None or not step.nodes:
        return inspector_html(None, None), [], None
    node = tab.inspect if tab.inspect is not None and tab.inspect < len(step.nodes) else step.accepted[-1]
    text = tab.token_text()
    return inspector_html(step, node, text), node_choices(step, text), node


def _notice(tab: TabState) -> str:
    """The last action's error, first in the status line (Markdown: HTML and Markdown characters as character
    references, so the message shows as typed; its own paragraph)."""
    if not tab.notice:
        return ""
    text = "".join(f"&#{ord(ch)};" if ch in MARKUP_CHARS else ch for ch in tab.notice)
    return f"**⚠ {text}**\n\n"


def first_status() -> str:
    """What the status line says before anything is stepped: what to do."""
    return "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."


_empty_status = first_status


def _blank_status(s: Shown) -> str:
    tab = s.tab
    if s.trace is not None and tab.session is not None and not tab.replay:  # live, finished at the prefill
        return (f"The prefill's token is the whole output (**max new tokens {tab.session.max_new_tokens}**"
                f"{', or end of text' if tab.session.max_new_tokens > 1 else ''}): "
                f"{plural(len(s.trace.output_ids), 'token')}, no round to show. Raise Max new tokens (or change the "
                "prompt) and press **Step**.")
    if s.trace is not None and s.tab.replay:
        return ("This trace has **no rounds**: its session was prefilled but never stepped, so there is no tree to "
                f"show. Its output so far: {plural(len(s.trace.output_ids), 'token')}. Load another trace, or type a "
                "prompt.")
    return _empty_status()


def _status(host: ModelHost, tab: TabState, k: int) -> str:
    trace = tab.trace
    step = trace.steps[k]
    mode = "replay of a saved trace (no model)" if tab.replay else "live"
    naive = " — **naive verification: the known-wrong flattened-tree behaviour**" if step.verify == "naive" else ""
    status = (f"Round {k + 1} of {len(trace.steps)} ({mode}){naive}: accepted {plural(step.acceptance - 1, 'drafted token')} "
              f"+ bonus{_kept_note(step)}, {plural(len(step.nodes), 'tree position')}, committed length "
              f"{step.committed_len}.")
    if is_sampled(trace.settings):
        status += (f" Target's choice: {esc(sampling_label(trace.settings))}, noise "
                   f"{esc(trace.settings.get('noise'))} (reproduce: `run {esc(sampling_flags(trace.settings))}`).")
    if tab.replay:
        status += " **Step** shows the next round of the replay; **Reset**, then Step, decodes the prompt live."
    if tab.session is not None and not tab.replay and tab.session.done:
        status += " Finished."
    if trace.reference_pending or tab.checking is not None:  # the check to come, under way, or stopped
        check = shown_check(host, tab)
        status += f" {status_line(check)}" if check is not None else ""
    if tab.other_trace is not None and tab.other_trace.steps:
        status += f" Compare mode: A = {esc(config_label(trace.settings))}, B = {esc(config_label(tab.other_trace.settings))}."
    return status


def _check_stopped(tab: TabState) -> bool:
    """The session's check was stopped short of the output (its tokens past the reference: unknown)."""
    return tab.checking is not None and tab.checking.stopped and not tab.checking.independent


def _kept_note(step) -> str:
    """A round the session stopped inside: how many of its walk's tokens it kept."""
    return f" ({step.kept} kept: the session stopped there)" if step.cut else ""


STATS_HEADING = "**The session in numbers** (each time says what it measures)\n\n"
# the HTML panels' headings, what each shows in words (gr.HTML draws no label; issue #65 item 7)
STOP_HEADING = "Why did this round stop there?"
COMPARE_HEADING = "Configurations A and B side by side: where their outputs part, and the verdict on each"


def _headed(heading: str, html: str) -> str:
    """An HTML panel under its heading (a bold line of its own)."""
    return f'<p class="ddv-panel-heading"><b>{esc(heading)}</b></p>{html}'


def _stats(tab: TabState) -> str:
    trace = tab.trace
    greedy_tok_s = ddtree_tok_s = None
    if tab.session is not None and not tab.replay:
        # the same clock for both: model time only, prefill included, none of the page's own work
        round_s = sum(sum(s.timings_ms.values()) for s in trace.steps) / 1e3 + trace.prefill_ms / 1e3
        ddtree_tok_s = len(trace.output_ids) / round_s if round_s > 0 else None
        if tab.greedy_s > 0 and not trace.reference_pending:  # pending: the check is still to come
            # a reference on the session's engine starts from a copy of the session's prefilled state (no prefill
            # of its own): the prefill is counted on its side too, as greedy decoding alone would have paid it
            shared = tab.session.reference_shares_prefill
            greedy_tok_s = len(trace.greedy_ids or ()) / (tab.greedy_s + (trace.prefill_ms / 1e3 if shared else 0.0))
    summary = stats_summary(trace, greedy_tok_s=greedy_tok_s, ddtree_tok_s=ddtree_tok_s)
    return (STATS_HEADING + stats_markdown(summary, extra=_page_timing(tab, trace))
            + (f"\n{tab.independent}\n" if tab.independent else ""))


def _page_timing(tab: TabState, trace: Trace) -> list[tuple[str, str]]:
    """Rows for the stats table saying what each time measures."""
    rows = []
    t = tab.timing
    if "step" in t and tab.session is not None and not tab.replay:
        n = t.get("n_rounds", 1)
        what = "round" if n == 1 else plural(n, "round")
        rows.append(("last Step on the server, wall time (not the browser's drawing)",
                     f"{t['step'] + t.get('views', 0):.0f} ms: {what} {t['rounds']:.0f} ms engine time + reference "
                     f"{t['reference']:.0f} ms + bookkeeping {max(t['step'] - t['rounds'] - t['reference'], 0):.0f} ms "
                     f"+ building the views {t.get('views', 0):.0f} ms"))
    engine = trace.settings.get("engine")
    if engine:
        rows.insert(0, ("engine", esc(engine)))
    return rows


def _divergence(trace: Trace, k: int, text) -> str:
    """The divergence table for rounds 1..k+1: the last DIVERGENCE_ROUNDS of them (what the browser gets stays
    bounded however long the session), saying so when earlier ones are left out."""
    first = max(0, k + 1 - DIVERGENCE_ROUNDS)
    table = divergence_html(divergence_rows(trace.steps[first: k + 1], text))
    if first:
        table = (f'<div style="color:#777;font-size:85%">rounds {first + 1}–{k + 1} of {len(trace.steps)} (the '
                 f"{DIVERGENCE_ROUNDS} up to the round shown; scrub back for earlier ones, or export the trace)</div>"
                 + table)
    return table


def _tree_of(trace: Trace, k: int, phase: str, text, title: str | None = None, lo: float | None = None,
             tree_filter: tuple = (None, None), width: int = TREE_PX) -> FigureSpec:
    step = shown_step(trace, k)
    max_depth, min_logprob = tree_filter
    layout = tree_layout(step, phase=phase, token_text=text, max_depth=max_depth, min_logprob=min_logprob)
    if lo is None:
        lo = (min(n.logprob for s in trace.steps for n in s.nodes[1:])
              if any(len(s.nodes) > 1 for s in trace.steps) else -1.0)
    return tree_spec(layout, phase=phase, token_text=text, cmin=lo, cmax=0.0, title=title, width=width)


def _tree_b(s: Shown) -> FigureSpec | None:
    """Compare mode: B's tree at the round on screen (its last one when B finished first)."""
    if not s.compare:
        return None
    other = s.tab.other_trace
    kb = max(0, min(s.tab.view, len(other.steps) - 1))
    return _tree_of(other, kb, s.phase, s.tab.other_token_text(), _side_title("B", other, kb),
                    tree_filter=s.tab.tree_filter, width=TREE_PX_COMPARE)


def _side_title(side: str, trace: Trace, k: int) -> str:
    step = shown_step(trace, k)
    note = "" if step.index == k else " (finished)"
    # two lines: in the half-width panel of compare mode one line ran past the figure's right edge
    return (f"{side}: {config_label(trace.settings)}\nround {step.index + 1}{note} · {plural(step.kept, 'token')}"
            + (" · NAIVE (known-wrong)" if step.verify == "naive" else ""))


def _color_floor(s: Shown) -> float:
    """The lowest drafter log-prob over the session's rounds (the tree's colour range, the same for every round),
    kept per round as rounds arrive."""
    cache, steps = s.cache, s.trace.steps
    with cache.lock:
        for step in steps[len(cache.step_min):]:
            cache.step_min.append(min((n.logprob for n in step.nodes[1:]), default=float("inf")))
        lo = min(cache.step_min, default=float("inf"))
    return lo if lo != float("inf") else -1.0


def _round_views(s: Shown) -> RoundViews:
    """Round k's tree, mask and cache views, built once per tab (the ROUND_VIEW_CACHE most recent are kept)."""
    lo = _color_floor(s)
    title = _side_title("A", s.trace, s.view) if s.compare else None
    cache, key = s.cache, (s.k, s.phase, lo, title, s.tab.tree_filter)
    with cache.lock:
        got = cache.rounds.pop(key, None)
        if got is None:
            step = s.trace.steps[s.k]
            rows = cache_table(step)
            tree = _tree_of(s.trace, s.k, s.phase, s.text, title, lo=lo, tree_filter=s.tab.tree_filter,
                            width=TREE_PX_COMPARE if s.compare else TREE_PX)
            got = RoundViews(tree=tree, mask=mask_spec(step), cache_chart=cache_spec(step, rows=rows),
                             cache_rows=rows, cache_html=cache_table_html(rows))
        _keep(cache.rounds, key, got)
    return got


PAYS_BLANK = ("After the first Step: the speed-up over greedy this session's rounds predict at each budget, from "
              "this machine's measured round costs.")


def _pays(s: Shown) -> tuple[FigureSpec | None, str]:
    """Does the tree pay here (render/speedup_view.py): the session's rounds up to the one on screen (configuration
    A's in compare mode) x this machine's measured costs for the loaded pair (ModelHost.costs), as a figure and
    words; or, where nothing can be predicted, why, and where the costs are missing, the command that measures
    them. No figure without a measured budget to draw."""
    settings = s.trace.settings
    if s.tab.replay or s.host.pair is None:
        return None, pays_missing_html("Not estimated for a replayed trace: the speed-up needs the round costs of "
                                       "the machine and models that decoded it (run analyze there: "
                                       "docs/SPEEDUP.md).")
    if settings.get("method") != "ddtree":
        return None, pays_missing_html("This session runs the DFlash chain: a tree's speed-up by budget needs DDTree "
                                       "rounds (Method: ddtree).")
    if not tree_rounds(s.steps):
        return None, pays_missing_html("Naive verification has no budget counterfactual (its target logits depend "
                                       "on the whole flattened tree): verify exactly to see the speed-up by budget.")
    block, budget = settings.get("block_size") or 0, settings.get("budget") or 0
    command = s.host.costs_command(block, budget)
    costs = s.host.costs(block)
    if costs is None:
        return None, pays_missing_html(
            f"No speed-up estimate yet: this machine's round costs for this model pair ({s.host.exact_engine} engine, "
            f"block size {block}) are not measured, and a speed-up needs them. Measure them once (about a minute on "
            "the embedded pair), then Step, Back or Forward:", command)
    session = s.tab.session
    final = session is not None and session.done and s.k == len(s.trace.steps) - 1
    study = session_speedup(s.steps, costs, budget, final)
    html = pays_html(study, first=1, last=s.k + 1, device=costs.device_name, compare=s.compare,
                     sampled=is_sampled(settings), command=command)
    return (pays_spec(study) if study.prediction.budgets else None), html


def _grid(s: Shown) -> FigureSpec | None:
    """The drafter's grid of the round (a round's grid never changes: built once per tab)."""
    cache, index = s.cache, s.step.index
    with cache.lock:
        grid = cache.grids.get(index)
    if grid is None and s.step.draft_top_ids:
        grid = grid_spec(grid_data(s.step, s.text))
        with cache.lock:
            _keep(cache.grids, index, grid)
    return grid


def _keep(kept: dict, key, value) -> None:
    """`value` as the most recent entry of `kept`, the oldest dropped past ROUND_VIEW_CACHE (held: its lock)."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > ROUND_VIEW_CACHE:
        kept.pop(next(iter(kept)))

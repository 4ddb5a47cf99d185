"""The `analyze` report: one self-contained HTML page (no network: figures inline as SVG, a Content-Security-Policy
that forbids any fetch, every token text escaped) and its figures as SVG and PDF files. Pure: a summary
(ddtree_viz/promptset/summary.py's summarize) and the prompt set in, files out. The web page's Analyze tab shows the
same body (report_body: headline, figures, top misses, misses by prompt, prompts) with its round links opening the step
view."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from ..analysis import acceptance_warning, config_label
from .text import esc, shorten, visible
from ..words import plural

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
       "connect-src 'none'; base-uri 'none'; form-action 'none'")
FIGURES = ("acceptance_histogram", "per_depth_acceptance", "budget_curve", "stop_rank", "acceptance_by_position")
BLUE, ORANGE, GREEN, GREY = "#0072B2", "#E69F00", "#009E73", "#999999"
DFLASH = "dflash"  # summary["dflash"]: the DFlash chain's figures on the same prompts (analyze --method both)
PRECISION_B = "b"  # summary["b"]: configuration B of a precision audit (options.PRECISION_B; render sits below it)


# ------------------------------------------------------------------------------------------------------------
# Figures (matplotlib): each from the summary alone
# ------------------------------------------------------------------------------------------------------------


def _bars(labels: list[str], values: list[float], title: str, xlabel: str, ylabel: str, color: str = BLUE,
          fmts: tuple[str, ...] = ("svg",), ylim: tuple[float, float] | None = None) -> dict[str, bytes]:
    from matplotlib.ticker import MaxNLocator  # matplotlib: only when a figure is drawn

    from .mpl import Page, _figure, _finish, rendering, save

    page = Page(width=5.0, height=2.8, dpi=150, title=title, caption=None)
    with rendering():
        fig, host = _figure(page)
        ax = host.add_subplot(1, 1, 1)
        xs = list(range(len(labels)))
        ax.bar(xs, [0 if v is None else v for v in values], color=color, width=0.75)
        ax.set_xticks(xs, labels, fontsize=7)
        if all(isinstance(v, int) for v in values if v is not None):  # counts: no 0.25-round ticks
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.spines[["top", "right"]].set_visible(False)
        _finish(ax, page)
        _fit_ticks(fig, ax)
        return {fmt: save(fig, fmt, page, title, embed_fonts=False) for fmt in fmts}


def _fit_ticks(fig, ax, gap: float = 2.0) -> None:
    """The bars' labels as they fit under them, measured on the figure as laid out: level, else turned upright,
    else every n-th of them upright and the last. Level up to 16 labels whatever their length, the stop-rank
    chart's "not drafted" ran into the ranks beside it (issue #65)."""
    import math

    from .mpl import measuring

    labels = [t for t in ax.get_xticklabels() if t.get_text()]

    def boxes():
        with measuring(fig) as renderer:  # the layout settled (a turned label takes more room under the axes)
            return sorted((t.get_window_extent(renderer) for t in labels if t.get_visible()), key=lambda b: b.x0)

    def clash(bs) -> bool:
        return any(a.x1 + gap > b.x0 for a, b in zip(bs, bs[1:]))

    if len(labels) < 2 or not clash(boxes()):
        return
    for t in labels:
        t.set_rotation(90)
    bs = boxes()
    if not clash(bs):
        return
    pitch = (bs[-1].x0 - bs[0].x0) / max(len(bs) - 1, 1)
    every = math.ceil((max(b.width for b in bs) + gap) / max(pitch, 1e-6))
    last = len(labels) - 1  # kept: "not drafted" / "block end", the word after the ranks
    for i, t in enumerate(labels):
        t.set_visible(i == last or (i % every == 0 and i <= last - every))
    boxes()


def _lines(series: list[tuple[str, list[float], list[float | None], str]], title: str, xlabel: str, ylabel: str,
           fmts: tuple[str, ...] = ("svg",), ylim: tuple[float, float] | None = None) -> dict[str, bytes]:
    from matplotlib.ticker import MaxNLocator

    from .mpl import Page, _figure, _finish, rendering, save

    page = Page(width=5.0, height=2.8, dpi=150, title=title, caption=None)
    with rendering():
        fig, host = _figure(page)
        ax = host.add_subplot(1, 1, 1)
        for k, (label, xs, ys, color) in enumerate(series):
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            # gid: the SVG group of each series is <g id="series-K">, with one marker per point
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=color, label=label,
                    gid=f"series-{k}")
        if all(isinstance(x, int) for _, xs, _, _ in series for x in xs):  # depths, budgets: whole numbers
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if len(series) > 1:
            ax.legend(fontsize=7, frameon=False)
        _finish(ax, page)
        return {fmt: save(fig, fmt, page, title, embed_fonts=False) for fmt in fmts}


def figure(summary: dict[str, Any], name: str, fmt: str = "svg") -> bytes:
    """One of FIGURES as SVG (its fonts embedded) or PDF bytes."""
    data = drawn(summary, name, (fmt,))[fmt]
    if fmt != "svg":
        return data
    from .mpl import embed_svg_fonts

    return embed_svg_fonts(data)


def drawn(summary: dict[str, Any], name: str, fmts: tuple[str, ...]) -> dict[str, bytes]:
    """One of FIGURES drawn once and saved in each of `fmts` (SVG without its fonts: the callers embed them)."""
    if name == "acceptance_histogram":
        h = summary["acceptance_histogram"]
        return _bars(list(h), list(h.values()), "Tokens gained per round", "tokens gained (accepted drafts + bonus)",
                     "rounds", fmts=fmts)
    if name == "per_depth_acceptance":  # with --method both, the DFlash chain's curve on the same axes
        series = []
        for side, color in ((summary, BLUE), (summary.get(DFLASH), ORANGE), (summary.get(PRECISION_B), GREY)):
            if side is not None and side.get("rounds"):
                p = side["per_depth_acceptance"]
                series.append((_label(summary, side), list(range(1, len(p) + 1)), p, color))
        return _lines(series, "Acceptance by depth", "depth d",
                      "P(accepted >= d | >= d-1, tree >= d)", ylim=(0, 1.05), fmts=fmts)
    if name == "budget_curve":  # with a precision audit, B's curve beside
        series = [(_label(summary, side, "budget curve"), [int(b) for b in side["budget_curve"]],
                   list(side["budget_curve"].values()), color)
                  for side, color in ((summary, GREEN), (summary.get(PRECISION_B), GREY))
                  if side is not None and side.get("budget_curve")]
        return _lines(series, "Budget curve (exact per-round counterfactual)", "budget (tree nodes)",
                      "mean tokens gained per round", fmts=fmts)
    if name == "stop_rank":
        h = summary["stop_rank_histogram"]
        return _bars(list(h), list(h.values()), "The target's token among the drafter's candidates at the stop depth",
                     "drafter rank of the target's token", "rounds", color=ORANGE, fmts=fmts)
    if name == "acceptance_by_position":
        rows = summary["acceptance_by_position"]
        return _bars([f"{r['from']}-{r['to']}" for r in rows], [r["mean_acceptance"] for r in rows],
                     "Acceptance by position in the generation", "output tokens (the round's start)",
                     "mean tokens gained per round", color=GREEN, fmts=fmts)
    raise ValueError(f"unknown figure {name!r}; choose one of {', '.join(FIGURES)}")


def figures(summary: dict[str, Any], fmt: str = "svg") -> dict[str, bytes]:
    """Every figure of FIGURES in one format (none when the summary has no rounds)."""
    return {name: files[fmt] for name, files in figure_files(summary, (fmt,)).items()}


def figure_files(summary: dict[str, Any], fmts: tuple[str, ...] = ("svg", "pdf")) -> dict[str, dict[str, bytes]]:
    """Every figure of FIGURES, each drawn once and saved in each of `fmts` (none when the summary has no rounds);
    the SVGs' fonts cut once for all of them (mpl.embed_svg_fonts_together)."""
    if not summary.get("rounds"):
        return {}
    out = {name: drawn(summary, name, fmts) for name in FIGURES}
    if "svg" in fmts:
        from .mpl import embed_svg_fonts_together

        for files, svg in zip(out.values(), embed_svg_fonts_together([files["svg"] for files in out.values()])):
            files["svg"] = svg
    return out


def _label(summary: dict[str, Any], side: dict[str, Any], plain: str | None = None) -> str:
    """A figure's series name: with a precision audit "A: <target precision>" / "B: ...", else side_label (or
    `plain`)."""
    audit = summary.get("precision_audit")
    if isinstance(audit, dict):
        who = "b" if side is summary.get(PRECISION_B) else "a"
        return f"{who.upper()}: target {audit[who]['target_precision']}, drafter {audit[who]['draft_precision']}"
    return plain or side_label(side)


def side_label(side: dict[str, Any]) -> str:
    """A side of the summary in a few words: 'DDTree budget 32' or 'DFlash chain' (its settings' method and budget)."""
    settings = side.get("settings") or {}
    return config_label(settings).split(",")[0] if settings else "-"


# ------------------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------------------


def _tok(text: str | None) -> str:
    return "<code class=tok>" + esc(visible(text)) + "</code>" if text is not None else "<i>-</i>"


def round_link(file: str, k: int, text: str | None = None, title: str | None = None) -> str:
    """A link to round k (0-based) of a trace file; the page shows rounds from 1. report.html links the file; the
    web page's Analyze tab opens the round in its step view instead (page_round_link). `text`: what the link says
    (default "FILE round N"); `title`: its tooltip (plain text: both escaped here)."""
    return (f"<a class=round href=\"{esc(file)}#round={int(k) + 1}\" data-file=\"{esc(file)}\" "
            f"data-round=\"{int(k)}\"{_title(title)}>{_link_text(file, k, text)}</a>")


def page_round_link(file: str, k: int, text: str | None = None, title: str | None = None) -> str:
    """round_link for the web page: a click opens the round in the step view (the page's script reads data-file and
    data-round; the href goes nowhere)."""
    return (f"<a class=\"round ddv-open-round\" href=\"#\" role=button data-file=\"{esc(file)}\" "
            f"data-round=\"{int(k)}\"{_title(title)}>{_link_text(file, k, text)}</a>")


def session_round_link(session: str, file: str, k: int, text: str | None = None, title: str | None = None) -> str:
    """A link to round k (0-based) of a trace in its prompt's session file (analyze --supplements: `session`,
    "supplements/0000.html"), which opens at `#round=N` (render/supplement.py)."""
    return (f"<a class=\"round session-round\" href=\"{esc(session)}#round={int(k) + 1}\" data-file=\"{esc(file)}\" "
            f"data-round=\"{int(k)}\"{_title(title)}>{esc(text) if text is not None else 'session'}</a>")


def _link_text(file: str, k: int, text: str | None) -> str:
    return esc(text) if text is not None else f"{esc(file)} round {int(k) + 1}"


def _title(title: str | None) -> str:
    return f" title=\"{esc(title)}\"" if title else ""


def _num(x, digits: int = 2) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


# Sorting the per-prompt table: one listener for the document (report.html runs it inline; the web page runs it
# once from its own script, for the tables it draws later)
SCRIPT = """
document.addEventListener('click', function (ev) {
  var th = ev.target && ev.target.closest ? ev.target.closest('table.sortable th') : null;
  if (!th) return;
  var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
  var asc = th.dataset.dir !== 'asc'; th.dataset.dir = asc ? 'asc' : 'desc';
  var rows = Array.prototype.slice.call(body.rows);
  rows.sort(function (a, b) {
    var x = a.cells[col].dataset.v || a.cells[col].textContent, y = b.cells[col].dataset.v || b.cells[col].textContent;
    var nx = parseFloat(x), ny = parseFloat(y);
    var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
    return asc ? c : -c;
  });
  rows.forEach(function (r) { body.appendChild(r); });
});
"""

CSS = ("table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
       "th{background:#f3f3f3;cursor:pointer}code.tok{background:#f6f6f6;padding:0 .2em;white-space:pre}"
       ".ctx{font-family:monospace;white-space:pre-wrap;overflow-wrap:anywhere;color:#555}"
       ".figs{display:flex;flex-wrap:wrap;gap:1em}"
       ".figs figure{margin:0}.figs svg{max-width:34em;height:auto}.meta{color:#666;font-size:.85em}"
       ".warning{background:#fde8e8;border:2px solid #c00;color:#900;padding:.5em .8em;font-size:1.1em}")


def scoped_css(scope: str) -> str:
    """CSS with every rule's selectors under `scope` (the web page styles its copy of the report with it, leaving
    the page's own tables alone)."""
    rules = []
    for rule in CSS.split("}"):
        if "{" in rule:
            selectors, body = rule.split("{", 1)
            rules.append(",".join(f"{scope} {sel.strip()}" for sel in selectors.split(",")) + "{" + body + "}")
    return "".join(rules)


def _sides(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's sides: its run's method, then (--method both) the DFlash chain's."""
    return [summary] + ([summary[DFLASH]] if isinstance(summary.get(DFLASH), dict) else [])


def _walls(metas: dict[str, dict[int, dict]] | None, side: str) -> list[float]:
    return [m["wall_s"] for m in ((metas or {}).get(side) or {}).values() if isinstance(m.get("wall_s"), (int, float))]


def meta_html(summary: dict[str, Any]) -> str:
    """The line under the title: models and settings (with --method both, both methods)."""
    e = html.escape
    model, settings = summary.get("model") or {}, summary.get("settings") or {}
    method = " + ".join(side_label(side) for side in _sides(summary))
    return (f"<p class=meta>target {e(visible(str(model.get('target', '?'))))} · draft "
            f"{e(visible(str(model.get('draft', '?'))))} · method {e(method)} · budget {e(str(settings.get('budget', '?')))}"
            f" · block {e(str(settings.get('block_size', '?')))} · max new tokens "
            f"{e(str(settings.get('max_new_tokens', '?')))} · verify {e(str(settings.get('verify', '?')))} · device "
            f"{e(str(settings.get('device', '?')))}</p>\n")


def headline_html(summary: dict[str, Any], metas: dict[str, dict[int, dict]] | None = None) -> str:
    """The headline numbers: one column, or (--method both) DDTree's and the DFlash chain's side by side."""
    e = html.escape
    sides = _sides(summary)
    rows = [("prompts", [f"{_num(s['prompts'])} of {_num(s['prompts_total'])}" for s in sides]),
            ("rounds", [_num(s["rounds"]) for s in sides]),
            ("generated tokens", [_num(s["generated_tokens"]) for s in sides]),
            ("mean acceptance (tokens per round, bonus included)", [_num(s["mean_acceptance"]) for s in sides]),
            ("identical to greedy", [f"{_num(s['identical_prompts'])}/{_num(s['prompts'])}" for s in sides]),
            ("failed prompts", [str(len(s["failed"])) for s in sides])]
    walls = [_walls(metas, side) for side in ("", DFLASH)[:len(sides)]]
    if any(walls):
        rows.append(("wall time per prompt (mean)", [f"{sum(w) / len(w):.1f} s" if w else "-" for w in walls]))
    head = ""
    if len(sides) > 1:
        head = "<tr><th></th>" + "".join(f"<th>{e(side_label(s))}</th>" for s in sides) + "</tr>"
    return ("<table id=headline>" + head + "".join(
        f"<tr><th>{e(k)}</th>" + "".join(f"<td>{e(v)}</td>" for v in vals) + "</tr>" for k, vals in rows)
        + "</table>\n")


def figures_html(svgs: dict[str, bytes], files: bool = True) -> str:
    """The figures inline (SVG made by figure(); never an SVG read from elsewhere). files: name each figure's files."""
    parts = ["<div class=figs>"]
    for name in FIGURES:
        if name in svgs:
            svg = svgs[name].decode("utf-8")
            svg = svg[svg.find("<svg"):]  # the XML prolog and doctype cannot stand inside HTML
            caption = (f"<figcaption class=meta>figures/{name}.svg · figures/{name}.pdf</figcaption>" if files else "")
            parts.append(f"<figure id=\"fig-{name}\">{svg}{caption}</figure>")
    parts.append("</div>\n")
    return "".join(parts)


def misses_html(summary: dict[str, Any], link=round_link, supplements: dict[str, str | None] | None = None) -> str:
    """The top misses, each example a link to its round (`link`), and with `supplements` (report.html with analyze
    --supplements) a second to that round in its prompt's session file."""
    e = html.escape
    sessions = supplements or {}
    parts = ["<table id=misses><thead><tr><th>count</th><th>drafter's top</th><th>target's token</th>"
             "<th>examples</th></tr></thead><tbody>"]
    for m in summary["top_misses"]:
        ex = "<br>".join(
            f"{link(x['file'], x['round'])}{_session(sessions, x['file'], x['round'])} depth {_num(x['depth'])} "
            f"({e(str(x['reason']))}): "
            f"<span class=ctx>{esc(visible(x['before']))}</span>[{_tok(m['target_token'])}]"
            f"<span class=ctx>{esc(visible(x['after']))}</span>" for x in m["examples"])
        same = ("<br><small>the same token: the drafter's top choice, but the tree had no branch for it under the "
                "last accepted node (tree ended)</small>" if m.get("drafter_token_id") == m.get("target_token_id")
                and m.get("drafter_token_id") is not None else "")
        parts.append(f"<tr><td>{_num(m['count'])}</td><td>{_tok(m['drafter_token'])}</td>"
                     f"<td>{_tok(m['target_token'])}{same}</td><td>{ex}</td></tr>")
    parts.append("</tbody></table>\n")
    return "".join(parts)


def _session(sessions: dict[str, str | None], file: str, k: int) -> str:
    """' (session)': round k of `file` in its prompt's session file, where analyze wrote one; else nothing."""
    session = sessions.get(file)
    return f" ({session_round_link(session, file, k)})" if session else ""


MAX_MISS_LINKS = 4000  # round links in the misses-by-prompt table (report.html's size); past it, the counts alone


def miss_rounds_html(misses: list[dict[str, Any]], link=round_link,
                     supplements: dict[str, str | None] | None = None) -> str:
    """Misses by prompt: every trace of the report (promptset/misses.py's report_misses: the rows of misses.jsonl by
    trace), how many of its rounds left the target, and each such round as a link to it: `link` (the page's Step
    tab; report.html's trace file), or that round in the prompt's session file where analyze --supplements wrote
    one (`supplements`: trace name -> its file). A link's tooltip gives the depth, the target's token and the
    drafter's first choice there. At most MAX_MISS_LINKS links in all (misses.jsonl has every row)."""
    sessions = supplements or {}
    methods = len({t["side"] for t in misses}) > 1
    parts = ["<table id=miss-rounds class=sortable><thead><tr><th>#</th>" + ("<th>method</th>" if methods else "")
             + "<th>rounds</th><th>misses</th><th>rounds where the walk left the target (a click opens it)</th>"
             "</tr></thead><tbody>"]
    left = MAX_MISS_LINKS
    for t in misses:
        rows, file = t["misses"], t["trace"]
        session = sessions.get(file)
        shown = rows[:max(left, 0)]
        left -= len(shown)
        links = " ".join(session_round_link(session, file, m["round"] - 1, str(m["round"]), _miss_title(m))
                         if session else link(file, m["round"] - 1, str(m["round"]), _miss_title(m)) for m in shown)
        more = (f" <span class=meta>… {len(rows) - len(shown):,} more in misses.jsonl</span>"
                if len(shown) < len(rows) else "")
        parts.append(f"<tr data-file=\"{esc(file)}\"><td data-v=\"{_num(t['index'])}\">{_num(t['index'])}</td>"
                     + (f"<td>{esc(str(t['side']))}</td>" if methods else "")
                     + f"<td>{_num(t['rounds'])}</td><td>{_num(len(rows))}</td><td class=miss-links>{links}{more}</td>"
                     "</tr>")
    parts.append("</tbody></table>\n")
    return "".join(parts)


def _miss_title(m: dict[str, Any]) -> str:
    """A miss's tooltip, plain text (escaped by the link): where the path left the target and the two tokens there."""
    prob = m["target_prob"]
    rank = m["target_draft_rank"]
    drafter = "-" if m["drafter_token"] is None else visible(m["drafter_token"])
    return (f"round {m['round']}: depth {m['depth']} ({m['reason']}); the target's {visible(m['target_token'])}"
            + (f" (p {prob:.2f})" if isinstance(prob, float) else "") + f", the drafter's first choice {drafter}"
            + (f"; the target's token at the drafter's rank {rank}" if isinstance(rank, int) else ""))


def session_link(file: str | None) -> str:
    """A prompt's session file (analyze --supplements), opened at its first round; 'over 5 MB' where it was past the
    file's bound (not written)."""
    if file is None:
        return "<span class=meta title=\"past the file's 5 MB bound: export --session --rounds A-B\">over 5 MB</span>"
    return f"<a class=session href=\"{esc(file)}#round=1\">{esc(file)}</a>"


def prompts_html(summary: dict[str, Any], items: list[dict] | None = None,
                 metas: dict[str, dict[int, dict]] | None = None, link=round_link,
                 supplements: dict[str, str | None] | None = None) -> str:
    """The per-prompt table (sortable); with --method both, the DFlash chain's mean acceptance and trace beside;
    with `supplements` (trace name -> its session file, analyze --supplements), a link to each session's file."""
    e = html.escape
    chain = summary.get(DFLASH) if isinstance(summary.get(DFLASH), dict) else None
    by_index = {p["index"]: p for p in chain["per_prompt"]} if chain else {}
    extra = "<th>session (HTML)</th>" if supplements is not None else ""
    extra += "<th>DFlash mean acceptance</th><th>DFlash trace</th>" if chain else ""
    parts = ["<table id=prompts class=sortable><thead><tr><th>#</th><th>source</th><th>prompt</th><th>rounds</th>"
             f"<th>tokens</th><th>mean acceptance</th><th>first divergence</th><th>wall s</th><th>trace</th>{extra}"
             "</tr></thead><tbody>"]
    for p in summary["per_prompt"]:
        i = p["index"]
        prompt = (items or [])[i].get("prompt", "") if items and 0 <= i < len(items) else ""
        wall = ((metas or {}).get("") or {}).get(i, {}).get("wall_s")
        fd = p["first_divergence"]
        row = (f"<tr><td data-v=\"{_num(i)}\">{_num(i)}</td><td>{e(str(p.get('source') or ''))}</td>"
               f"<td class=ctx>{esc(visible(shorten(prompt, 60)))}</td><td>{_num(p['rounds'])}</td>"
               f"<td>{_num(p['tokens'])}</td><td data-v=\"{_num(p['mean_acceptance'], 4)}\">{_num(p['mean_acceptance'])}</td>"
               f"<td data-v=\"{-1 if fd is None else _num(fd)}\">{'identical' if fd is None else _num(fd)}</td>"
               f"<td>{_num(wall, 1)}</td><td>{link(p['file'], 0)}</td>")
        if supplements is not None:
            row += f"<td>{session_link(supplements[p['file']])}</td>" if p["file"] in supplements else "<td>-</td>"
        if chain:
            c = by_index.get(i)
            row += (f"<td data-v=\"{_num(c['mean_acceptance'], 4)}\">{_num(c['mean_acceptance'])}</td>"
                    f"<td>{link(c['file'], 0)}</td>" if c else "<td>-</td><td>-</td>")
        parts.append(row + "</tr>")
    parts.append("</tbody></table>\n")
    return "".join(parts)


def failed_html(summary: dict[str, Any]) -> str:
    e = html.escape
    sides = [(side_label(s), s) for s in _sides(summary)]
    if isinstance(summary.get(PRECISION_B), dict):  # a precision audit: A's and B's
        sides = [("A", summary), ("B", summary[PRECISION_B])]
    rows = [(label if len(sides) > 1 else None, f) for label, s in sides for f in s["failed"]]
    if not rows:
        return ""
    parts = ["<table id=failed><tr><th>#</th><th>source</th>" + ("<th>method</th>" if len(sides) > 1 else "")
             + "<th>error</th></tr>"]
    for label, f in rows:
        parts.append(f"<tr><td>{_num(f['index'])}</td><td>{e(str(f.get('source') or ''))}</td>"
                     + (f"<td>{e(label)}</td>" if label is not None else "")
                     + f"<td>{esc(visible(str(f['error'])))}</td></tr>")
    parts.append("</table>\n")
    return "".join(parts)


def warnings_html(summary: dict[str, Any]) -> str:
    """The loud warning, first in the report, for each side whose mean acceptance is about 1.0."""
    audit = isinstance(summary.get("precision_audit"), dict)
    parts = []
    for side, who in ((summary, "A" if audit else ""), (summary.get(DFLASH), "DFlash chain"), (summary.get(PRECISION_B), "B")):
        if isinstance(side, dict):
            warning = acceptance_warning(side.get("mean_acceptance"), side.get("rounds") or 0, who)
            if warning:
                parts.append(f"<p class=warning role=alert><b>Warning:</b> {html.escape(warning)}</p>\n")
    return "".join(parts)


def audit_html(summary: dict[str, Any], link=round_link) -> str:
    """A precision audit (summary["precision_audit"]): A and B side by side (precisions, mean acceptance, decode
    tokens/s, acceptance by depth, the budget curve) and where the two targets' greedy decodings part, per prompt."""
    audit = summary.get("precision_audit")
    if not isinstance(audit, dict):
        return ""
    e = html.escape
    a, b = audit["a"], audit["b"]
    depths = max(len(a["per_depth_acceptance"]), len(b["per_depth_acceptance"]))
    budgets = sorted(set(a["budget_curve"]) | set(b["budget_curve"]), key=int)
    rows = [("target", [visible(str(x["target"])) for x in (a, b)]),
            ("target precision", [str(x["target_precision"]) for x in (a, b)]),
            ("drafter", [visible(str(x["draft"])) for x in (a, b)]),
            ("drafter precision", [str(x["draft_precision"]) for x in (a, b)]),
            ("mean acceptance (tokens per round, bonus included)", [_num(x["mean_acceptance"]) for x in (a, b)]),
            ("decode tokens/s (engine time: prefill + rounds)", [_num(x["decode_tok_s"], 1) for x in (a, b)])]
    rows += [(f"acceptance at depth {d + 1}", [_num(_at(x["per_depth_acceptance"], d), 3) for x in (a, b)])
             for d in range(depths)]
    rows += [(f"budget {k}: tokens per round", [_num(x["budget_curve"].get(k)) for x in (a, b)]) for k in budgets]
    parts = ["<h2>Precision audit</h2>\n<p class=meta>The same prompts decoded by configuration A and by B. Where "
             "the two targets' greedy decodings part: the first output token they differ at, each target's token "
             "and its top-1 minus top-2 logit margin there (a small margin: a near-tie the precision tipped).</p>\n",
             "<table id=audit><tr><th></th><th>A</th><th>B</th></tr>"]
    parts += [f"<tr><th>{e(k)}</th>" + "".join(f"<td>{e(v)}</td>" for v in vals) + "</tr>" for k, vals in rows]
    parts.append(f"</table>\n<p>The greedy decodings part in {_num(audit['prompts_parted'])} of "
                 f"{plural(audit['prompts_compared'], 'prompt')}.</p>\n")
    parts.append("<table id=parts class=sortable><thead><tr><th>#</th><th>part at</th><th>A's token</th><th>A's margin"
                 "</th><th>B's token</th><th>B's margin</th><th>traces</th></tr></thead><tbody>")
    for p in audit["per_prompt"]:
        at = p["part_at"]
        parts.append(f"<tr><td>{_num(p['index'])}</td><td data-v=\"{-1 if at is None else _num(at)}\">"
                     f"{'identical' if at is None else _num(at)}</td><td>{_tok(p.get('a_token'))}</td>"
                     f"<td>{_num(p['a_margin'], 3)}</td><td>{_tok(p.get('b_token'))}</td><td>{_num(p['b_margin'], 3)}</td>"
                     f"<td>{link(p['file_a'], 0)}<br>{link(p['file_b'], 0)}</td></tr>")
    parts.append("</tbody></table>\n")
    return "".join(parts)


def _at(values: list, d: int):
    return values[d] if d < len(values) else None


SPEEDUP_BIAS = ("Predicted: tokens per round from each round's exact budget counterfactual (from the state that round "
                "really started in) over this machine's measured round cost. The real run at a smaller budget starts "
                "its later rounds elsewhere (it accepts less, so it visits other states, more of them early in the "
                "output) and at other context lengths: the error below is that bias plus timing noise.")


def speedup_html(study: Any) -> str:
    """The speed-up study (summary['speedup'], from speedup.json): S(b) per measured budget, the chain's point, the
    best and break-even budgets, predicted vs measured, degenerate outputs. Every value checked: a report is
    untrusted input."""
    if not isinstance(study, dict) or not isinstance(study.get("budgets"), dict):
        return ""
    e = html.escape
    best, even = study.get("best_budget"), study.get("break_even_budget")
    parts = [f"<p class=meta>{e(str(study.get('engine', '?')))} engine on {e(str(study.get('device_name', '?')))}; "
             f"greedy step {_num(study.get('greedy_ms'), 3)} ms; best budget <b>{e(str(best))}</b>, break-even budget "
             f"{e(str(even))} (the largest budget still at least as fast as the chain).</p>\n",
             "<table class=sortable><thead><tr><th>budget</th><th>tokens/round</th><th>round ms</th>"
             "<th>predicted tok/s</th><th>predicted speed-up</th></tr></thead><tbody>\n"]
    rows = [(b, p) for b, p in study["budgets"].items() if isinstance(p, dict)]
    chain = study.get("chain")
    if isinstance(chain, dict):
        rows.append(("chain", chain))
    for b, p in rows:
        mark = " <b>best</b>" if str(b) == str(best) else ""
        parts.append(f"<tr><td>{e(str(b))}{mark}</td><td>{_num(p.get('tau'))}</td><td>{_num(p.get('round_ms'), 3)}"
                     f"</td><td>{_num(p.get('predicted_tokens_per_s'), 1)}</td><td>{_num(p.get('predicted_speedup'))}"
                     "</td></tr>\n")
    parts.append("</tbody></table>\n")
    checks = [r for r in study.get("validation") or () if isinstance(r, dict)]
    if checks:
        parts.append("<table><tr><th>budget</th><th>predicted tok/s</th><th>measured tok/s</th><th>error</th>"
                     "<th>tokens/round predicted / measured</th><th>ms/round predicted / measured</th>"
                     "<th>identical to greedy</th></tr>\n")
        for r in checks:
            err = r.get("error")
            parts.append(f"<tr><td>{e(str(r.get('budget')))}</td><td>{_num(r.get('predicted_tokens_per_s'), 1)}</td>"
                         f"<td>{_num(r.get('measured_tokens_per_s'), 1)}</td><td>"
                         f"{f'{err:+.1%}' if isinstance(err, float) else '-'}</td><td>{_num(r.get('predicted_tau'))}"
                         f" / {_num(r.get('measured_tau'))}</td><td>{_num(r.get('predicted_round_ms'))} / "
                         f"{_num(r.get('measured_round_ms'))}</td><td>{e(str(r.get('identical_to_greedy', '-')))}"
                         "</td></tr>\n")
        parts.append("</table>\n")
    parts.append(f"<p class=meta>{e(SPEEDUP_BIAS)}</p>\n")
    parts.append(_categories_html(study.get("categories")))
    bad = study.get("degenerate")
    if isinstance(bad, dict) and isinstance(bad.get("flagged"), int) and bad["flagged"]:
        parts.append(f"<p><b>Warning</b>: {bad['flagged']} of {e(str(bad.get('outputs')))} outputs look degenerate "
                     f"({esc(visible(str(bad.get('example'))))}): a loop drafts easily and decodes fast; its speed-up "
                     "is no speed-up.</p>\n")
    return "".join(parts)


def _categories_html(categories: Any) -> str:
    """Per category of the prompts (their own 'category'): rounds, best and break-even budgets, S at the best."""
    if not isinstance(categories, dict) or not categories:
        return ""
    e = html.escape
    rows = ["<table><tr><th>category</th><th>rounds</th><th>best budget</th><th>predicted speed-up there</th>"
            "<th>break-even budget</th></tr>\n"]
    for name, c in categories.items():
        if not isinstance(c, dict):
            continue
        best = c.get("best_budget")
        point = (c.get("budgets") or {}).get(str(best)) if isinstance(c.get("budgets"), dict) else None
        rows.append(f"<tr><td>{esc(visible(str(name)))}</td><td>{_num(c.get('rounds'))}</td><td>{e(str(best))}</td>"
                    f"<td>{_num(point.get('predicted_speedup') if isinstance(point, dict) else None)}</td>"
                    f"<td>{e(str(c.get('break_even_budget')))}</td></tr>\n")
    return "".join(rows) + "</table>\n"


def report_body(summary: dict[str, Any], svgs: dict[str, bytes], items: list[dict] | None = None,
                metas: dict[str, dict[int, dict]] | None = None, link=round_link, files: bool = True,
                supplements: dict[str, str | None] | None = None, misses: list[dict[str, Any]] | None = None) -> str:
    """The report's content (everything inside <body> but the title and the script): headline numbers, the figures
    (inline SVG), top misses with context, every miss by prompt (`misses`: promptset/misses.py's report_misses),
    the per-prompt table, failed prompts. Every link names a trace file and a round (`link`: round_link for
    report.html, page_round_link for the web page); with `supplements` a miss links its round in the prompt's
    session file too."""
    e = html.escape
    both = (f"<p class=meta>The figures are {e(side_label(summary))}'s; acceptance by depth draws the DFlash chain's "
            "on the same prompts beside it.</p>\n" if DFLASH in summary and svgs else "")
    parts = [warnings_html(summary), meta_html(summary), headline_html(summary, metas), audit_html(summary, link),
             "<h2>Figures</h2>\n", both, figures_html(svgs, files),
             f"<p class=meta>Budget curve: {e(str(summary.get('budget_curve_caveat', '')))}</p>\n"]
    top = f" ({e(side_label(summary))})" if DFLASH in summary else ""
    parts.append(f"<h2>Top misses{top}</h2>\n<p class=meta>At the depth where the walk stopped: the drafter's first "
                 "choice there and the target's token, the most frequent pairs over all rounds (rounds that accepted "
                 "every drafted depth left out), with the output around them.</p>\n")
    parts.append(misses_html(summary, link, supplements))
    if misses is not None:
        where = (" in the prompt's session file (analyze --supplements), else in its trace" if supplements is not None
                 else "")
        parts.append("<h2>Misses by prompt</h2>\n<p class=meta>Every round whose walk left the target before the end "
                     "of the drafted block, by prompt: the rows of misses.jsonl (analyze --misses, the Analyze tab's "
                     f"download; docs/MISSES.md). A round number opens that round{where}; its tooltip gives the depth, "
                     "the target's token and the drafter's first choice there.</p>\n")
        parts.append(miss_rounds_html(misses, link, supplements))
    speed = speedup_html(summary.get("speedup"))
    if speed:
        parts.append("<h2>Speed-up by budget</h2>\n" + speed)
    parts.append("<h2>Prompts</h2>\n<p class=meta>Click a header to sort.</p>\n")
    parts.append(prompts_html(summary, items, metas, link, supplements))
    failed = failed_html(summary)
    if failed:
        parts.append("<h2>Failed prompts</h2>\n" + failed)
    return "".join(parts)


def report_html(summary: dict[str, Any], svgs: dict[str, bytes], items: list[dict] | None = None,
                metas: dict[str, dict[int, dict]] | None = None,
                supplements: dict[str, str | None] | None = None, misses: list[dict[str, Any]] | None = None) -> str:
    """The report as one HTML document (report_body with its title, style and sorting script)."""
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<title>ddtree-viz analyze report</title>\n<style>",
        "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}" + CSS,
        "</style>\n</head>\n<body>\n<h1>ddtree-viz analyze report</h1>\n",
        report_body(summary, svgs, items, metas, supplements=supplements, misses=misses),
        "<p class=meta>Links name a trace and a round: open the trace with <code>python -m ddtree_viz replay "
        "--print --round K FILE</code>, or load this directory in the web page's Analyze tab and click the link "
        "(no model needed).</p>\n",
        f"<script>{SCRIPT}</script>\n</body>\n</html>\n",
    ]
    return "".join(parts)


def write_report(out: str | Path, summary: dict[str, Any], items: list[dict] | None = None,
                 metas: dict[str, dict[int, dict]] | None = None,
                 supplements: dict[str, str | None] | None = None, misses: list[dict[str, Any]] | None = None) -> Path:
    """DIR/report.html and DIR/figures/<name>.svg|.pdf from the summary (metas: each side's meta records by prompt,
    for the wall times; supplements: each trace's session file, linked; misses: report_body's). Returns the
    report's path."""
    out = Path(out)
    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    files = figure_files(summary)
    for name, by_format in files.items():
        for fmt, data in by_format.items():
            (figs / f"{name}.{fmt}").write_bytes(data)
    svgs = {name: by_format["svg"] for name, by_format in files.items()}
    path = out / "report.html"
    path.write_text(report_html(summary, svgs, items, metas, supplements, misses), encoding="utf-8")
    return path

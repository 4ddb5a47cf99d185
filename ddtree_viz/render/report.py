"""The `analyze` report: one self-contained HTML page (no network: figures inline as SVG, a Content-Security-Policy
that forbids any fetch, every token text escaped) and its figures as SVG and PDF files. Pure: a summary
(ddtree_viz/analyze.py's summarize) and the traces in, files out."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .mpl import Page, _figure, _finish, rendering, save
from .text import esc, shorten, visible

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; font-src data:; "
       "connect-src 'none'; base-uri 'none'; form-action 'none'")
FIGURES = ("acceptance_histogram", "per_depth_acceptance", "budget_curve", "stop_rank", "acceptance_by_position")
BLUE, ORANGE, GREEN, GREY = "#0072B2", "#E69F00", "#009E73", "#999999"


# ------------------------------------------------------------------------------------------------------------
# Figures (matplotlib): each from the summary alone
# ------------------------------------------------------------------------------------------------------------


def _bars(labels: list[str], values: list[float], title: str, xlabel: str, ylabel: str, color: str = BLUE,
          fmt: str = "svg", ylim: tuple[float, float] | None = None) -> bytes:
    page = Page(width=5.0, height=2.8, dpi=150, title=title, caption=None)
    with rendering():
        fig, host = _figure(page)
        ax = host.add_subplot(1, 1, 1)
        xs = list(range(len(labels)))
        ax.bar(xs, [0 if v is None else v for v in values], color=color, width=0.75)
        ax.set_xticks(xs, labels, rotation=0 if len(labels) <= 16 else 90, fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.spines[["top", "right"]].set_visible(False)
        _finish(ax, page)
        return save(fig, fmt, page, title)


def _lines(series: list[tuple[str, list[float], list[float | None], str]], title: str, xlabel: str, ylabel: str,
           fmt: str = "svg", ylim: tuple[float, float] | None = None) -> bytes:
    page = Page(width=5.0, height=2.8, dpi=150, title=title, caption=None)
    with rendering():
        fig, host = _figure(page)
        ax = host.add_subplot(1, 1, 1)
        for label, xs, ys, color in series:
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=color, label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if len(series) > 1:
            ax.legend(fontsize=7, frameon=False)
        _finish(ax, page)
        return save(fig, fmt, page, title)


def figure(summary: dict[str, Any], name: str, fmt: str = "svg") -> bytes:
    """One of FIGURES as SVG or PDF bytes."""
    if name == "acceptance_histogram":
        h = summary["acceptance_histogram"]
        return _bars(list(h), list(h.values()), "Tokens gained per round", "tokens gained (accepted drafts + bonus)",
                     "rounds", fmt=fmt)
    if name == "per_depth_acceptance":
        p = summary["per_depth_acceptance"]
        series = [(summary.get("settings", {}).get("method", "ddtree"), list(range(1, len(p) + 1)), p, BLUE)]
        return _lines(series, "Acceptance by depth", "depth d",
                      "P(accepted >= d | >= d-1, tree >= d)", fmt=fmt, ylim=(0, 1.05))
    if name == "budget_curve":
        c = summary["budget_curve"]
        return _lines([("budget curve", [int(b) for b in c], list(c.values()), GREEN)],
                      "Budget curve (exact per-round counterfactual)", "budget (tree nodes)",
                      "mean tokens gained per round", fmt=fmt)
    if name == "stop_rank":
        h = summary["stop_rank_histogram"]
        return _bars(list(h), list(h.values()), "The target's token among the drafter's candidates at the stop depth",
                     "drafter rank of the target's token", "rounds", color=ORANGE, fmt=fmt)
    if name == "acceptance_by_position":
        rows = summary["acceptance_by_position"]
        return _bars([f"{r['from']}-{r['to']}" for r in rows], [r["mean_acceptance"] for r in rows],
                     "Acceptance by position in the generation", "output tokens (the round's start)",
                     "mean tokens gained per round", color=GREEN, fmt=fmt)
    raise ValueError(f"unknown figure {name!r}; choose one of {', '.join(FIGURES)}")


# ------------------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------------------


def _tok(text: str | None) -> str:
    return "<code class=tok>" + esc(visible(text)) + "</code>" if text is not None else "<i>-</i>"


def _round_link(file: str, k: int) -> str:
    """A link to round k (0-based) of a trace file; the page shows rounds from 1."""
    return f"<a class=round href=\"{esc(file)}#round={k + 1}\" data-file=\"{esc(file)}\" data-round=\"{k}\">{esc(file)} round {k + 1}</a>"


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function (th, col) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0];
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
});
"""


def report_html(summary: dict[str, Any], svgs: dict[str, bytes], items: list[dict] | None = None,
                metas: dict[int, dict] | None = None) -> str:
    """The report as one HTML document: headline numbers, the figures (inline SVG), top misses with context, the
    per-prompt table (sortable), failed prompts. Every link names a trace file and a round."""
    e = html.escape
    s = summary
    model = s.get("model", {})
    settings = s.get("settings", {})
    walls = [m["wall_s"] for m in (metas or {}).values() if "wall_s" in m]
    head = [
        ("prompts", f"{s['prompts']} of {s['prompts_total']}"), ("rounds", s["rounds"]),
        ("generated tokens", s["generated_tokens"]),
        ("mean acceptance (tokens per round, bonus included)", _num(s["mean_acceptance"])),
        ("identical to greedy", f"{s['identical_prompts']}/{s['prompts']}"),
        ("failed prompts", len(s["failed"])),
    ]
    if walls:
        head.append(("wall time per prompt (mean)", f"{sum(walls) / len(walls):.1f} s"))
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<title>ddtree-viz analyze report</title>\n<style>",
        "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
        "th{background:#f3f3f3;cursor:pointer}code.tok{background:#f6f6f6;padding:0 .2em;white-space:pre}"
        ".ctx{font-family:monospace;white-space:pre-wrap;color:#555}.figs{display:flex;flex-wrap:wrap;gap:1em}"
        ".figs figure{margin:0}.figs svg{max-width:34em;height:auto}.meta{color:#666;font-size:.85em}",
        "</style>\n</head>\n<body>\n<h1>ddtree-viz analyze report</h1>\n",
        f"<p class=meta>target {e(visible(str(model.get('target', '?'))))} · draft {e(visible(str(model.get('draft', '?'))))}"
        f" · method {e(str(settings.get('method', '?')))} · budget {e(str(settings.get('budget', '?')))} · block "
        f"{e(str(settings.get('block_size', '?')))} · max new tokens {e(str(settings.get('max_new_tokens', '?')))}"
        f" · verify {e(str(settings.get('verify', '?')))} · device {e(str(settings.get('device', '?')))}</p>\n",
        "<table id=headline>" + "".join(f"<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>" for k, v in head) + "</table>\n",
        "<h2>Figures</h2>\n<div class=figs>",
    ]
    for name in FIGURES:
        if name in svgs:
            svg = svgs[name].decode("utf-8")
            svg = svg[svg.find("<svg"):]  # the XML prolog and doctype cannot stand inside HTML
            parts.append(f"<figure id=\"fig-{name}\">{svg}<figcaption class=meta>figures/{name}.svg · "
                         f"figures/{name}.pdf</figcaption></figure>")
    parts.append("</div>\n")
    parts.append(f"<p class=meta>Budget curve: {e(s.get('budget_curve_caveat', ''))}</p>\n")

    parts.append("<h2>Top misses</h2>\n<p class=meta>At the depth where the walk stopped: the drafter's first "
                 "choice there and the target's token, the most frequent pairs over all rounds (rounds that accepted "
                 "every drafted depth left out), with the output around them.</p>\n")
    parts.append("<table id=misses><thead><tr><th>count</th><th>drafter's top</th><th>target's token</th>"
                 "<th>examples</th></tr></thead><tbody>")
    for m in s["top_misses"]:
        ex = "<br>".join(
            f"{_round_link(x['file'], x['round'])} depth {x['depth']} ({e(x['reason'])}): "
            f"<span class=ctx>{esc(visible(x['before']))}</span>[{_tok(m['target_token'])}]"
            f"<span class=ctx>{esc(visible(x['after']))}</span>" for x in m["examples"])
        parts.append(f"<tr><td>{m['count']}</td><td>{_tok(m['drafter_token'])}</td><td>{_tok(m['target_token'])}</td>"
                     f"<td>{ex}</td></tr>")
    parts.append("</tbody></table>\n")

    parts.append("<h2>Prompts</h2>\n<p class=meta>Click a header to sort.</p>\n<table id=prompts class=sortable>"
                 "<thead><tr><th>#</th><th>source</th><th>prompt</th><th>rounds</th><th>tokens</th>"
                 "<th>mean acceptance</th><th>first divergence</th><th>wall s</th><th>trace</th></tr></thead><tbody>")
    for p in s["per_prompt"]:
        i = p["index"]
        prompt = (items or [])[i].get("prompt", "") if items and i < len(items) else ""
        wall = (metas or {}).get(i, {}).get("wall_s")
        fd = p["first_divergence"]
        parts.append(
            f"<tr><td data-v=\"{i}\">{i}</td><td>{e(str(p.get('source') or ''))}</td>"
            f"<td class=ctx>{esc(visible(shorten(prompt, 60)))}</td><td>{p['rounds']}</td><td>{p['tokens']}</td>"
            f"<td data-v=\"{_num(p['mean_acceptance'], 4)}\">{_num(p['mean_acceptance'])}</td>"
            f"<td data-v=\"{-1 if fd is None else fd}\">{'identical' if fd is None else fd}</td>"
            f"<td>{_num(wall, 1)}</td><td>{_round_link(p['file'], 0)}</td></tr>")
    parts.append("</tbody></table>\n")
    if s["failed"]:
        parts.append("<h2>Failed prompts</h2>\n<table id=failed><tr><th>#</th><th>source</th><th>error</th></tr>")
        for f in s["failed"]:
            parts.append(f"<tr><td>{f['index']}</td><td>{e(str(f.get('source') or ''))}</td>"
                         f"<td>{esc(visible(str(f['error'])))}</td></tr>")
        parts.append("</table>\n")
    parts.append("<p class=meta>Links name a trace and a round: open the trace with <code>python -m ddtree_viz replay "
                 "--print --round K FILE</code> or in the page's Analyze tab (no model needed).</p>\n")
    parts.append(f"<script>{SCRIPT}</script>\n</body>\n</html>\n")
    return "".join(parts)


def write_report(out: str | Path, summary: dict[str, Any], items: list[dict] | None = None, traces=None,
                 metas: dict[int, dict] | None = None) -> Path:
    """DIR/report.html and DIR/figures/<name>.svg|.pdf from the summary. Returns the report's path."""
    out = Path(out)
    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    svgs = {}
    if summary["rounds"]:
        for name in FIGURES:
            svgs[name] = figure(summary, name, "svg")
            (figs / f"{name}.svg").write_bytes(svgs[name])
            (figs / f"{name}.pdf").write_bytes(figure(summary, name, "pdf"))
    path = out / "report.html"
    path.write_text(report_html(summary, svgs, items, metas), encoding="utf-8")
    return path


def summary_json(summary: dict[str, Any]) -> str:
    return json.dumps(summary, indent=1, ensure_ascii=False)

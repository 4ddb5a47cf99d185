"""A whole session as one self-contained HTML file: a paper's supplement (issue #68 item 1).

    from ddtree_viz.render.supplement import supplement_html
    text = supplement_html(trace)                  # the document (str); InputError past MAX_BYTES, giving its size
    text = supplement_html(trace, rounds="1-20")   # rounds 1..20 only, as the page numbers them

A reader opens the file from disk with no Python, no server and no network and steps through the session round by
round (the arrow keys; `#round=7` in the address opens round 7 and follows the stepping): the draft tree with the
accepted path, the verify pass's attention mask, the per-layer cache strip, why the walk stopped, the output so far
against the reference (greedy) with its first divergence, and the tokens kept per round. plotly.js and the page's
own script (supplement.js, beside this module) are inlined once; the session is one JSON document (FORMAT, in a
`<script type="application/json">`) that the script reads, drawing the round on screen from it: no figure per
round. Its layout: docs/EXPORT.md, "A session as one HTML file".

The JSON is compact so that a session fits the bound beside plotly.js (4.8 MB of the 5): integer columns of a round
(parents, ranks, token indices, log-probs) are packed (pack_ints: 5 bits a character, URL-safe), token texts are one
table (indices by frequency), the drafter's candidates one table per depth (in DDTree's trees a depth and a rank name
one candidate, whatever the parent). The tree's rows (layout.tree_layout's tidy rows) and the mask (the ancestor
matrix) are computed by the script from the parents; tests/test_supplement.py holds both to the Python ones round by
round in Chromium.

Token text is untrusted: every token is made visible (text.visible) here; the JSON is written so that nothing in it
ends or comments out its script element (script_json: `<`, `>`, `&`, U+2028 and U+2029 as JSON escapes); the header
is escaped HTML (text.esc); the script puts text in the page through textContent and attributes only, and into plotly
through its three entities (text.plotly_text's rule)."""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from .. import __version__, analysis
from ..errors import InputError
from ..trace import StepRecord, Trace, is_sampled, sampling_label
from . import style
from .diff_view import EXACT_NOTE, NAIVE_NOTE, SAMPLED_NOTE, compare_with_greedy, reference_name
from .export import CSP, page_color_range
from .figure import FigureSpec
from .layout import DRAW_ORDER, EDGE_KINDS, EDGE_NAME, ROLES, tree_layout
from .mask_plot import KEY_TICKS, MAX_POSITIONS, ROW_TICK_PX, mask_spec
from .scheme import PAGE_SCHEME
from .stats_view import acceptance_spec
from .text import esc, lookup, token_texts_from_steps, visible
from ..words import numbered, plural
from .tree_plot import BOTTOM_PX, EDGE_GROUP, EDGE_LINE, LABEL_ROOM, MAX_HEIGHT, ROW_PX, TOP_PX, tree_spec

FORMAT = "ddtree-viz session supplement"  # the JSON's "format"
VERSION = 1  # the JSON's "version": a change an older script would misread needs a new one
MAX_BYTES = 5_000_000  # the bound (5 MB, SI): a session past it is refused (or thinned with rounds=)
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"  # pack_ints' digits
SCRIPT = Path(__file__).with_name("supplement.js")
REASONS = (analysis.STOP_BLOCK_END, analysis.STOP_TREE_ENDED, analysis.STOP_NOT_TAKEN, analysis.STOP_NOT_DRAFTED)
KINDS = ("GDN", "attention")  # cache layer kinds by style.layer_type_name; others follow in order of appearance
_ROUNDS = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+|last)\s*)?", re.IGNORECASE)


# ------------------------------------------------------------------------------------------------------------
# Packing and escaping
# ------------------------------------------------------------------------------------------------------------


def pack_ints(values) -> str:
    """Whole numbers >= 0 as text: each in 5-bit groups, least significant first, a group a character of ALPHABET
    (its index: the group, + 32 where more groups follow). 0..31 take one character, up to 1023 two."""
    out = []
    for v in values:
        v = int(v)
        if v < 0:
            raise ValueError(f"pack_ints packs whole numbers >= 0, not {v}")
        while v >= 32:
            out.append(ALPHABET[32 + (v & 31)])
            v >>= 5
        out.append(ALPHABET[v])
    return "".join(out)


def zigzag(v: int) -> int:
    """A whole number of either sign as one >= 0 (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...), for pack_ints."""
    return 2 * v if v >= 0 else -2 * v - 1


def unpack_ints(text: str) -> list[int]:
    """pack_ints' inverse (supplement.js's unpack, in Python: for tests and readers of the data)."""
    out, value, shift = [], 0, 0
    for ch in text:
        d = ALPHABET.index(ch)
        value |= (d & 31) << shift
        if d >= 32:
            shift += 5
        else:
            out.append(value)
            value, shift = 0, 0
    if shift:
        raise ValueError("packed numbers end inside a number")
    return out


def script_json(data: Any) -> str:
    """JSON for inside a <script> element: `<`, `>` and `&` as \\u escapes (no `</script>` or `<!--` can end or
    comment out the element), and U+2028 / U+2029 too (line ends in older JavaScript). JSON.parse reads it as is."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, code)
    return text


def shown_raw(text: str) -> str:
    """Text shown as typed (spaces, newlines and tabs kept) with every other invisible or control character written
    as text.visible writes it (`\\u202e`): a right-to-left override in a prompt shows as its name, and reorders
    nothing."""
    return "".join(ch if ch in " \n\t" else visible(ch) for ch in text)


# ------------------------------------------------------------------------------------------------------------
# Which rounds
# ------------------------------------------------------------------------------------------------------------


def parse_rounds(text: str | range | None, n: int) -> range:
    """The rounds a supplement keeps, as indices into trace.steps: None (all), a range, or text 'A-B' (1-based and
    inclusive, as the page numbers rounds; B may be 'last') or 'N'. InputError naming the trace's rounds otherwise."""
    if n == 0:
        raise InputError("the trace has no rounds to show (the session was prefilled but never stepped)")
    valid = f"this trace has {plural(n, 'round')}: use A-B within 1-{n}"
    if text is None:
        return range(n)
    if isinstance(text, range):
        first, last = text.start + 1, text.stop
    else:
        m = _ROUNDS.fullmatch(str(text))
        if not m:
            raise InputError(f"--rounds must be A-B (e.g. 1-20), A-last or one round N, not {text!r} ({valid})")
        first = int(m.group(1))
        last = first if m.group(2) is None else (n if m.group(2).lower() == "last" else int(m.group(2)))
    if first > last:
        raise InputError(f"--rounds {first}-{last} runs backwards: the first round must not come after the last")
    if first < 1 or last > n:
        hint = " (rounds are numbered from 1, as on the page)" if first < 1 else ""
        raise InputError(f"--rounds {first}-{last} is out of range{hint}: {valid}")
    return range(first - 1, last)


# ------------------------------------------------------------------------------------------------------------
# The session as data
# ------------------------------------------------------------------------------------------------------------


def _output_end(trace: Trace, rounds: range) -> int:
    """Output tokens through the last round kept: the prefill's token and every round's, up to it."""
    return min(len(trace.output_ids), 1 + sum(s.kept for s in trace.steps[: rounds.stop]))


def _tokens(trace: Trace, steps: list[StepRecord], end: int) -> tuple[list[str], list[int], dict[int, int]]:
    """The token table: visible texts and ids, the most frequent first (short indices), and id -> index."""
    count: Counter = Counter()
    for s in steps:
        count.update(n.token_id for n in s.nodes)
        count[s.bonus_token_id] += 1
        top = analysis.stop_info(s)["drafter_top_id"]
        if top is not None:
            count[top] += 1
    count.update(trace.output_ids[:end])
    count.update((trace.greedy_ids or ())[:end])
    ids = sorted(count, key=lambda i: (-count[i], i))
    text = lookup(lambda i: trace.token_texts.get(str(i)), lambda: token_texts_from_steps(steps))
    return [visible(text(i)) for i in ids], ids, {i: k for k, i in enumerate(ids)}


def _lp(value: float) -> int:
    """A log-prob as hundredths below 0 (what the packed columns hold)."""
    return max(0, -round(value * 100))


def _tree_columns(step: StepRecord, index: dict[int, int]) -> dict:
    """A round's tree: each node's parent as the change from the previous node's (zigzag; the first node's from
    the root, 0) (`p`); ranks + 1 (`r`), only where a rank is not the count of the node's earlier siblings; and the
    nodes' tokens and log-probs as one table per depth (`g`: per depth its candidate count, then per rank its token
    index + 1 and how far its log-prob falls below the rank before's, or 0 for a rank the tree did not take), or per
    node (`t`, `l`) where a depth and rank do not name one candidate (_candidates)."""
    nodes = step.nodes[1:]
    parents = [0] + [n.parent for n in nodes]  # (the root's stands at 0: the first node's parent is the root)
    out = {"n": len(step.nodes), "o": index[step.root_token_id],
           "p": pack_ints(zigzag(parents[i] - parents[i - 1]) for i in range(1, len(parents)))}
    if not _ranks_follow_siblings(nodes):
        out["r"] = pack_ints(n.rank + 1 for n in step.nodes)
    table = _candidates(nodes, index)
    if table is None:
        out.update(t=pack_ints(index[n.token_id] for n in nodes), l=pack_ints(_lp(n.logprob) for n in nodes))
        return out
    values = []
    for d in range(1, max((n.depth for n in nodes), default=0) + 1):
        width = max((r for dd, r in table if dd == d), default=-1) + 1
        values.append(width)
        above = 0  # the log-prob of the rank before (in hundredths below 0): a rank's is written as the step down
        for r in range(width):
            cell = table.get((d, r))
            values.extend((cell[0] + 1, cell[1] - above) if cell else (0,))
            above = cell[1] if cell else above
    out["g"] = pack_ints(values)
    return out


def _ranks_follow_siblings(nodes) -> bool:
    """Whether each node's rank is the count of its earlier siblings (a node's children are its ranks 0, 1, ... in
    order), as in every tree DDTree builds: then the ranks need not be written."""
    seen: dict[int, int] = {}
    for n in nodes:
        if n.rank != seen.get(n.parent, 0):
            return False
        seen[n.parent] = n.rank + 1
    return True


def _candidates(nodes, index: dict[int, int]) -> dict[tuple[int, int], tuple[int, int]] | None:
    """(depth, rank) -> (token index, log-prob in hundredths below 0) of a round's drafted nodes, where each depth and
    rank name one candidate and a depth's log-probs fall with the rank (a DDTree tree's marginal candidates); None
    otherwise."""
    table: dict[tuple[int, int], tuple[int, int]] = {}
    for n in nodes:
        cell = (index[n.token_id], _lp(n.logprob))
        if table.setdefault((n.depth, n.rank), cell) != cell:
            return None
    last: dict[int, int] = {}
    for (d, r), cell in sorted(table.items()):
        if cell[1] < last.get(d, 0):
            return None
        last[d] = cell[1]
    return table


def _stop(step: StepRecord, index: dict[int, int], block_size: int | None) -> list:
    """Why the walk stopped (analysis.stop_info): [reason, the target's probability of its token, its drafter rank
    (-1: not drafted; null: past the block), the drafter's top candidate there and its log-prob, the token's rank in
    the drafter's whole distribution]."""
    s = analysis.stop_info(step, block_size)
    rank = s["target_draft_rank"]
    top = s["drafter_top_id"]
    return [REASONS.index(s["reason"]), None if s["target_prob"] is None else round(s["target_prob"], 4),
            rank if isinstance(rank, int) else (None if rank is None else -1),
            None if top is None else index[top],
            None if s["drafter_top_logprob"] is None else round(s["drafter_top_logprob"], 3), s["target_vocab_rank"]]


def _by_kind(values: list[int | None], kinds: list[int], n_kinds: int) -> list:
    """Per layer kind: the one value its layers share, or their values in layer order."""
    out = []
    for k in range(n_kinds):
        mine = [v for v, kind in zip(values, kinds) if kind == k]
        out.append(mine[0] if len(set(mine)) == 1 else mine)
    return out


def _cache(step: StepRecord, kinds: list[int], n_kinds: int) -> dict:
    """The round's cache per kind of layer: bytes after the commit (`m`), after the verify pass (`v`), and the
    attention layers' KV length after the commit (`kv`)."""
    if not step.cache:
        return {}
    out = {"m": _by_kind([c.bytes for c in step.cache], kinds, n_kinds),
           "kv": _by_kind([c.kv_length for c in step.cache], kinds, n_kinds)}
    if len(step.cache_before_commit) == len(step.cache):
        out["v"] = _by_kind([c.bytes for c in step.cache_before_commit], kinds, n_kinds)
    return out


def _layers(trace: Trace, steps: list[StepRecord]) -> tuple[list[str], list[list], list[int]]:
    """The layer kinds' names, each layer as [number, kind, cache class], and each layer's kind."""
    first = steps[0].cache if steps and steps[0].cache else trace.prefill_cache
    names = list(KINDS) + [k for k in dict.fromkeys(style.layer_type_name(c.type) for c in first) if k not in KINDS]
    kinds = [names.index(style.layer_type_name(c.type)) for c in first]
    return names, [[c.layer, k, c.cache_class] for c, k in zip(first, kinds)], kinds


def _round(step: StepRecord, index: dict[int, int], kinds: list[int], n_kinds: int, block_size) -> dict:
    out = _tree_columns(step, index)
    out.update(i=step.index, c=step.committed_len, a=list(step.accepted), b=index[step.bonus_token_id],
               s=_stop(step, index, block_size))
    if step.verify != "exact":
        out["x"] = step.verify
    if len(step.cache) == len(kinds):
        out.update(_cache(step, kinds, n_kinds))
    return out


def _meta(trace: Trace) -> dict:
    """The session's own words: what the output is compared with, the comparison over the whole session."""
    cmp = compare_with_greedy(trace)
    s = trace.settings
    return {"target": visible(trace.target), "draft": visible(trace.draft), "method": str(s.get("method", "?")),
            "verify": str(s.get("verify", "?")), "budget": s.get("budget"), "reference": reference_name(trace),
            "summary": cmp.summary, "verdict": cmp.verdict, "margin": cmp.margin, "invalid": trace.invalid,
            "pending": trace.reference_pending}


def session_data(trace: Trace, rounds: range | None = None) -> dict:
    """Everything the supplement's script draws, as JSON-ready data (the format: docs/EXPORT.md)."""
    rounds = parse_rounds(rounds, len(trace.steps))
    steps = list(trace.steps[rounds.start: rounds.stop])
    end = _output_end(trace, rounds)
    texts, ids, index = _tokens(trace, steps, end)
    kind_names, layers, kinds = _layers(trace, steps)
    block = trace.settings.get("block_size")
    block = block if isinstance(block, int) and not isinstance(block, bool) else None
    greedy = trace.greedy_ids
    return {
        "format": FORMAT, "version": VERSION, "alphabet": ALPHABET, "meta": _meta(trace),
        "rounds_total": len(trace.steps), "first": rounds.start, "kept": [s.kept for s in trace.steps],
        "tokens": texts, "ids": pack_ints(ids),
        "out": pack_ints(index[i] for i in trace.output_ids[:end]),
        "ref": None if greedy is None else pack_ints(index[i] for i in greedy[:end]),
        "first_divergence": trace.first_divergence, "reasons": list(REASONS),
        "kinds": kind_names, "layers": layers, "color_range": list(page_color_range(trace)),
        "style": _style(), "figures": _figures(trace, steps[0]),
        "steps": [_round(s, index, kinds, len(kind_names), block) for s in steps],
    }


def _style() -> dict:
    """The page's look (render/style.py, scheme.PAGE_SCHEME, tree_plot's and mask_plot's sizes) for the script."""
    sc = PAGE_SCHEME
    return {
        "role_symbol": style.ROLE_SYMBOL, "role_name": style.ROLE_NAME, "roles": list(ROLES),
        "draw_order": list(DRAW_ORDER), "edge_kinds": list(EDGE_KINDS), "edge_name": EDGE_NAME,
        "edge_group": EDGE_GROUP, "edge_line": {k: list(v) for k, v in EDGE_LINE.items()},
        "node_size": style.NODE_SIZE, "outline_width": style.PATH_OUTLINE_WIDTH,
        "colors": {"path": sc.path, "edge": sc.edge, "rejected": sc.rejected, "outline": sc.outline,
                   "neutral": sc.neutral, "bonus": sc.bonus, "mask_on": sc.mask_on, "mask_off": sc.mask_off,
                   "GDN": style.GDN_COLOR, "attention": style.ATTENTION_COLOR, "diverge": style.DIVERGE_COLOR},
        "row_px": ROW_PX, "top_px": TOP_PX, "bottom_px": BOTTOM_PX, "max_height": MAX_HEIGHT,
        "label_room": LABEL_ROOM, "label_chars": 12, "mask_chars": style.MASK_LABEL_CHARS,
        "mask_positions": MAX_POSITIONS, "mask_ticks": style.MASK_MAX_TICKS, "key_ticks": KEY_TICKS,
        "row_tick_px": ROW_TICK_PX,
    }


def _figures(trace: Trace, step: StepRecord) -> dict:
    """The page's figures as the script starts from them: the tree's and the mask's layouts (render/tree_plot.py's
    and mask_plot.py's, whose per-round parts the script sets), the whole session's tokens per round
    (stats_view.acceptance_spec: its bars' rounds and heights are "kept", their hover short), and plotly.py's
    template, once."""
    cmin, cmax = page_color_range(trace)
    tree = tree_spec(tree_layout(step), cmin=cmin, cmax=cmax).layout
    mask = mask_spec(step)
    heat = {k: v for k, v in mask.data[0].items() if k not in ("z", "x", "y")}
    acc = acceptance_spec(trace.steps)
    bars = acc.data[0]
    for key in ("hovertext", "hoverinfo", "x", "y"):  # the script fills x, y and the hover's words from "kept"
        bars.pop(key, None)
    return {"tree": _without(tree, "title", "height", "xaxis.range", "yaxis.range"),
            "mask": {"heat": heat, "layout": _without(mask.layout, "title.text", "height", "shapes")},
            "acceptance": {"data": acc.data, "layout": acc.layout},
            "template": _template()}


def _template() -> dict | None:
    """plotly.py's template as the page's figures carry it (figure.FigureSpec), for the kinds drawn here only."""
    template = FigureSpec().to_dict()["layout"].get("template")
    if template is None:
        return None
    data = {k: v for k, v in template.get("data", {}).items() if k in ("scatter", "heatmap", "bar")}
    return {**template, "data": data}


def _without(layout: dict, *paths: str) -> dict:
    """A copy of a layout dict without the dotted paths the script sets per round."""
    out = json.loads(json.dumps(layout))
    for path in paths:
        *parents, key = path.split(".")
        node = out
        for p in parents:
            node = node.get(p, {})
        node.pop(key, None)
    return out


# ------------------------------------------------------------------------------------------------------------
# The document
# ------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as plotly.py ships it (the page's own figures are drawn by it)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # inlined as is: it must not end its own element
        raise RuntimeError("plotly.js contains '</script': it cannot be inlined")
    return js


def page_script() -> str:
    return SCRIPT.read_text(encoding="utf-8")


CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em auto;max-width:80em;padding:0 1em;color:#222}
h1{font-size:1.35em;margin:.2em 0}h2{font-size:1.05em;margin:1.2em 0 .3em}
.meta,.note{color:#555;font-size:.88em}.warn{color:#C0392B;font-weight:bold}
pre.raw{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;border:1px solid #ddd;padding:.4em;
  max-height:14em;overflow-y:auto;unicode-bidi:isolate}
#ddt-nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.4em 0;z-index:10;
  display:flex;gap:.6em;align-items:center;flex-wrap:wrap}
#ddt-nav input[type=range]{flex:1 1 12em}
#ddt-where{font-weight:bold;min-width:11em}
.row{display:flex;flex-wrap:wrap;gap:1em}.row>div{flex:1 1 30em;min-width:0}
.ddt-tok{border-radius:3px;padding:0 2px;margin:1px;font-family:monospace;white-space:pre-wrap;display:inline-block;
  max-width:100%;overflow-wrap:anywhere;border:1px solid #bbb;unicode-bidi:isolate}
.ddt-prefill{background:#e8e8e8}.ddt-draft{background:#d9f0e3}.ddt-bonus{background:#fdf3c4}.ddt-earlier{background:#fff}
.ddt-differs{border:2px solid #C0392B;color:#C0392B}
.ddt-first{color:#fff;background:#C0392B;font-size:80%;padding:0 3px}
.ddt-greedy{color:#C0392B;font-size:80%;unicode-bidi:isolate}
.ddt-sep{color:#bbb}
#ddt-tokens{line-height:2;overflow-wrap:anywhere}
.ddt-strip{display:flex;gap:2px;width:100%}
.ddt-layer{flex:1 1 0;min-width:0;max-width:44px;color:#fff;font-size:10px;line-height:16px;text-align:center;
  border-radius:2px;overflow:hidden}
code.tok{background:#f6f6f6;padding:0 .2em;white-space:pre;unicode-bidi:isolate}
@media print{
  #ddt-nav,.noprint,.modebar-container{display:none!important}
  body{max-width:none;margin:0}
  .fig,.row>div{break-inside:avoid}
  pre.raw{max-height:none;overflow:visible}
}
"""


def _header(trace: Trace, rounds: range) -> str:
    """The session's own header (escaped HTML): models, settings, prompt, the comparison over the whole session."""
    s = trace.settings
    cmp = compare_with_greedy(trace)
    n = len(trace.steps)
    naive = cmp.naive
    note = NAIVE_NOTE if naive else (EXACT_NOTE if not is_sampled(s) else SAMPLED_NOTE.format(label=sampling_label(s)))
    kept = [st.kept for st in trace.steps]
    which = (("the one round" if n == 1 else f"all {n:,} rounds") if len(rounds) == n else
             f"{numbered('round', rounds.start + 1, rounds.stop)} of {n:,} (thinned: the tree, mask and cache of the "
             "others are "
             "left out; their tokens are in the output)")
    settings = " · ".join(f"{k} {esc(s[k])}" for k in ("method", "verify", "budget", "block_size", "max_new_tokens",
                                                        "tree_scoring", "dtype", "device", "engine") if k in s)
    return (
        f"<h1>DDTree session: {esc(visible(trace.target))} drafted by {esc(visible(trace.draft))}</h1>\n"
        f"<p class=meta>{settings} · {esc(sampling_label(s))}</p>\n"
        f"<p class=meta>{plural(len(trace.output_ids), 'token')} in {plural(n, 'round')}, "
        f"{sum(kept) / max(n, 1):.2f} kept per round on "
        f"average · this file: {esc(which)}</p>\n"
        f"<p class=\"{'warn' if naive else 'note'}\">{'⚠ ' if naive else ''}{esc(note)}</p>\n"
        f"<p class=meta>Over the whole session: <b>{esc(cmp.summary)}</b></p>\n"
        "<details class=noprint open><summary>Prompt</summary>"
        f"<pre class=raw id=ddt-prompt>\n{esc(shown_raw(trace.prompt))}</pre></details>\n"
    )


BODY = """<noscript><p class=warn>This file draws its figures with JavaScript: allow scripts for it (it loads
nothing from anywhere).</p></noscript>
<nav id=ddt-nav aria-label="rounds">
<button id=ddt-prev type=button title="previous round (←)">← Previous</button>
<span id=ddt-where aria-live=polite></span>
<button id=ddt-next type=button title="next round (→)">Next →</button>
<input id=ddt-slider type=range min=1 max=1 value=1 aria-label=round>
<span class=meta>← / → step · Home / End · a link to a round: <code>#round=N</code></span>
</nav>
<p id=ddt-note class=warn></p>
<p id=ddt-round-head></p>
<div class=fig id=ddt-tree></div>
<h2>Why the walk stopped</h2><p id=ddt-stop></p>
<div class=row><div class=fig id=ddt-mask></div>
<div><h2>Per-layer cache after this round's commit</h2><div id=ddt-cache></div></div></div>
<h2>Output so far vs the reference</h2><p id=ddt-summary></p><div id=ddt-tokens></div>
<p class=meta>P = prefill token · d<i>n</i> = accepted draft at depth <i>n</i> · ★ = bonus token (the target's own)
· red = differs from the reference · │ = round boundary</p>
<div class=fig id=ddt-acceptance></div>
"""


def _document(trace: Trace, rounds: range, data: dict) -> str:
    title = f"ddtree-viz session: {visible(trace.target)}, rounds {rounds.start + 1}-{rounds.stop} of {len(trace.steps)}"
    return "".join((
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        _header(trace, rounds), BODY,
        "<details><summary>The whole output as plain text</summary>"
        f"<pre class=raw id=ddt-plain>\n{esc(shown_raw(trace.output_text))}</pre></details>\n",
        f"<p class=meta>Made by ddtree-viz {esc(__version__)} (<code>python -m ddtree_viz export --session</code>) from a "
        "trace; the trace itself replays in its web page (<code>python -m ddtree_viz replay TRACE.json</code>). This "
        "file loads nothing: plotly.js is inside it.</p>\n",
        f"<script type=\"application/json\" id=\"ddt-data\">{script_json(data)}</script>\n",
        f"<script>{plotly_js()}</script>\n",
        f"<script>{page_script()}</script>\n</body>\n</html>\n",
    ))


def _too_large(size: int, limit: int, rounds: range, data: dict) -> str:
    """The refusal: the size it would have, and the longest stretch of rounds from the first asked for that fits."""
    per_round = [len(script_json(r).encode("utf-8")) + 1 for r in data["steps"]]
    fixed = size - sum(per_round)
    fits, total = 0, fixed
    for cost in per_round:
        if total + cost > limit:
            break
        total, fits = total + cost, fits + 1
    first = rounds.start + 1
    hint = (f"the {plural(fits, 'round')} from round {first} {'fits' if fits == 1 else 'fit'}: "
            f"--rounds {first}-{first + fits - 1}"
            if fits else "not even one round fits")
    return (f"the session supplement would be {plural(size, 'byte')} ({size / 1e6:.2f} MB), over the "
            f"{limit / 1e6:g} MB bound "
            f"(plotly.js alone is {len(plotly_js().encode('utf-8')):,} bytes): thin it to fewer rounds with --rounds "
            f"A-B ({hint})")


def supplement_html(trace: Trace, rounds: str | range | None = None, *, limit: int | None = MAX_BYTES) -> str:
    """The whole session (or `rounds`, parse_rounds' forms) as one self-contained HTML document. InputError for bad
    rounds, or when the document would pass `limit` bytes (None: no bound), giving its size and what would fit."""
    rounds = parse_rounds(rounds, len(trace.steps))
    data = session_data(trace, rounds)
    text = _document(trace, rounds, data)
    size = len(text.encode("utf-8"))
    if limit is not None and size > limit:
        raise InputError(_too_large(size, limit, rounds, data))
    return text


def supplement_name(trace: Trace, rounds: range | None = None) -> str:
    """A file name for a download: ddtree-session-<N>-rounds.html (or ddtree-session-rounds-A-B.html)."""
    n = len(trace.steps)
    if rounds is None or len(rounds) == n:
        return f"ddtree-session-{n}-rounds.html"
    return f"ddtree-session-rounds-{rounds.start + 1}-{rounds.stop}.html"


def write_supplement(trace: Trace, out: str | Path, rounds: str | range | None = None, *,
                     limit: int | None = MAX_BYTES) -> tuple[Path, int]:
    """supplement_html written to `out` (UTF-8): the path and its size in bytes. InputError if it cannot be written."""
    data = supplement_html(trace, rounds, limit=limit).encode("utf-8")
    path = Path(out)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path, len(data)

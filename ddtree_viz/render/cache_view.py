"""The target's per-layer cache: what each layer holds, and what this round's commit did to it."""

from __future__ import annotations

import plotly.graph_objects as go

from ..trace import LayerCache, StepRecord
from . import style
from .figure import FigureSpec, bottom_legend, title_axis_px
from .style import layer_type_name
from .text import plotly_text as esc
from ..words import plural


def tensors_text(layer: LayerCache) -> str:
    """'name shape dtype' per tensor, '; '-joined, e.g. 'keys (1, 2, 11, 16) float32; values ...'."""
    return "; ".join(f"{t.name} ({', '.join(map(str, t.shape))}) {t.dtype}" for t in layer.tensors) or "(empty)"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def cache_layout_table(layers: tuple[LayerCache, ...]) -> list[dict]:
    """Rows describing a cache at one point in time (e.g. after prefill, before the first round)."""
    return [
        {"layer": c.layer, "type": layer_type_name(c.type), "cache class": c.cache_class, "tensors": tensors_text(c),
         "bytes": c.bytes, "KV length": c.kv_length}
        for c in layers
    ]


def _what_changed(step: StepRecord, layer: LayerCache) -> str:
    t, a = len(step.nodes), len(step.accepted)
    if layer_type_name(layer.type) == "GDN":
        if step.verify == "naive":
            return (f"state after the whole flattened tree ({plural(t, 'position')}, rejected branches included) kept "
                    "(naive, known-wrong)")
        return f"conv/recurrent state replaced by the accepted path's ({plural(a, 'token')})"
    if layer.kv_length is None:
        return "–"
    return f"+{plural(t, 'row')} appended, compacted to +{a}"


def cache_table(step: StepRecord) -> list[dict]:
    """One row per layer: layer, type (GDN / attention), cache class, tensors, bytes before/after the
    commit, KV length ("before the round → after verify → after commit", and the three as ints; None for
    GDN layers), what changed, and in naive mode
    the max |committed recurrent state - exact state| per GDN layer."""
    before = {c.layer: c for c in step.cache_before_commit}
    naive = step.naive_state_error if len(step.naive_state_error) == len(step.cache) else ()
    rows = []
    for i, c in enumerate(step.cache):
        b = before.get(c.layer)
        kv, kv_before, kv_mid = None, None, None
        if c.kv_length is not None:
            kv_before = step.committed_len
            kv_mid = b.kv_length if b is not None and b.kv_length is not None else step.committed_len + len(step.nodes)
            kv = f"{kv_before} → {kv_mid} → {c.kv_length}"
        rows.append({
            "layer": c.layer, "type": layer_type_name(c.type), "cache class": c.cache_class, "tensors": tensors_text(c),
            "bytes before commit": b.bytes if b is not None else None, "bytes after commit": c.bytes,
            "KV length": kv, "KV before": kv_before, "KV after verify": kv_mid, "KV after commit": c.kv_length,
            "what changed": _what_changed(step, c),
            "naive state error": naive[i] if naive else None,
        })
    return rows


BAR_WIDTH = 0.8  # of one layer: every bar is this wide and centred on its layer, whatever the type


def layer_ticks(layers: list[int]) -> dict:
    """x-axis ticks at existing layers only: every layer up to 16 of them, else every k-th (at most 16 labels)."""
    if not layers:
        return {}
    step = max(1, -(-len(layers) // 16))
    return dict(tickmode="array", tickvals=layers[::step], ticktext=[str(v) for v in layers[::step]])


def cache_figure(step: StepRecord, **options) -> go.Figure:
    """cache_spec(step, **options) as a checked plotly go.Figure."""
    return cache_spec(step, **options).figure()


def cache_spec(step: StepRecord, *, title: str | None = None, rows: list[dict] | None = None) -> FigureSpec:
    """Bytes per layer after the commit (bars coloured by layer type) over ghost bars for the bytes right
    after the verify pass (before compaction); in naive mode, the GDN state error on a second axis. Plain data
    (figure.FigureSpec).

    Every bar is BAR_WIDTH of a layer wide and centred on its layer: plotly would otherwise infer a trace's bar
    width from the gaps between its own x values (attention every 4th layer gives 4-layer-wide bars that cover
    the GDN bars). The x axis spans the existing layers only, ticks on layer numbers. `rows`: cache_table(step),
    where the caller has it already (the page's round views)."""
    rows = cache_table(step) if rows is None else rows
    layers = [r["layer"] for r in rows]
    data = []
    if step.cache_before_commit:
        data.append(dict(type="bar", x=layers, y=[r["bytes before commit"] for r in rows], width=BAR_WIDTH,
                         name="after verify (before commit)", hoverinfo="skip",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="#777777", width=1))))
    for kind in dict.fromkeys(r["type"] for r in rows):
        sel = [r for r in rows if r["type"] == kind]
        data.append(dict(
            type="bar", x=[r["layer"] for r in sel], y=[r["bytes after commit"] for r in sel], width=BAR_WIDTH,
            name=f"{kind} (after commit)", marker=dict(color=style.GDN_COLOR if kind == "GDN" else style.ATTENTION_COLOR),
            hovertext=[_hover(r) for r in sel], hoverinfo="text",
        ))
    errors = [(r["layer"], r["naive state error"]) for r in rows if r["naive state error"] is not None]
    layout = dict(
        title=dict(text=esc(title) if title is not None else f"Cache per layer, round {step.index + 1}",
                   font=dict(size=14)),
        barmode="overlay",
        xaxis=dict(title=dict(text="layer"), range=[min(layers, default=0) - 0.5, max(layers, default=0) + 0.5],
                   **layer_ticks(layers)),
        yaxis=dict(title=dict(text="bytes")), height=420,
        # the left margin holds the bytes' tick labels ("150k", "1.5M") and title: drawn once (figure.title_axis_px)
        margin=dict(l=title_axis_px(["150.5k"], 4), r=20, t=50, b=110), legend=bottom_legend(),
        plot_bgcolor="white",
    )
    if errors:
        data.append(dict(type="scatter", x=[e[0] for e in errors], y=[e[1] for e in errors], yaxis="y2",
                         mode="markers", marker=dict(symbol="x", size=11, color=style.DIVERGE_COLOR),
                         name="naive: max |state − exact state|"))
        layout["yaxis2"] = dict(title=dict(text="state error"), overlaying="y", side="right", type="log",
                                showgrid=False)
    return FigureSpec(data, layout)


def _hover(row: dict) -> str:
    parts = [f"layer {row['layer']} · {esc(row['type'])} · {esc(row['cache class'])}", esc(row["tensors"]),
             f"bytes: {human_bytes(row['bytes after commit'])}"]
    if row["bytes before commit"] is not None:
        parts[-1] += f" (after verify {human_bytes(row['bytes before commit'])})"
    if row["KV length"]:
        parts.append(f"KV length {row['KV length']}")
    parts.append(esc(row["what changed"]))
    if row["naive state error"] is not None:
        parts.append(f"naive state error {row['naive state error']:.3g}")
    return "<br>".join(parts)


# ------------------------------------------------------------------------------------------------------------
# The per-layer tables as compact HTML (the page's): a strip of layers (details on hover) + a table that fits
# the page width, one row per layer up to GROUP_ABOVE layers, one row per group of identical layers beyond.
# ------------------------------------------------------------------------------------------------------------

GROUP_ABOVE = 16  # more layers than this: identical layers share a row (Qwen3.6-27B's 64 layers: two rows)

# (row key, header, nowrap): the columns shown, in this order, where the rows have them
TABLE_COLUMNS = (
    ("type", "type", True),
    ("cache class", "cache class", True),
    ("tensors", "tensors (shape, dtype)", False),
    ("KV length", "KV length", True),
    ("bytes", "bytes", True),
    ("bytes after commit", "bytes after commit", True),
    ("what changed", "what changed this round", False),
    ("naive state error", "naive: max |state − exact|", True),
)
_KV_HEADER = "KV length<br><small>before → verify → commit</small>"
_CELL = "padding:2px 6px;border-bottom:1px solid #e3e3e3;vertical-align:top;text-align:left"


def layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 4, 5, 6, 8] -> '0–2, 4–6, 8'."""
    out, start, prev = [], None, None
    for v in sorted(layers):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}–{prev}" if prev > start else str(start))
            start = prev = v
    if start is not None:
        out.append(f"{start}–{prev}" if prev > start else str(start))
    return ", ".join(out)


def _type_color(kind: str) -> str:
    return style.GDN_COLOR if kind == "GDN" else style.ATTENTION_COLOR


def _cell(key: str, row: dict) -> str:
    v = row.get(key)
    if v is None or v == "":
        return "–"
    if key == "type":
        return f'<span style="color:{_type_color(v)}">■</span> {esc(v)}'
    if key == "bytes after commit" and row.get("bytes before commit") is not None:
        return f'{human_bytes(v)} <small style="color:#777">(after verify {human_bytes(row["bytes before commit"])})</small>'
    if key in ("bytes", "bytes after commit"):
        return human_bytes(v)
    if key == "naive state error":
        return esc(v) if isinstance(v, str) else f"{v:.3g}"
    if key == "tensors":  # one tensor per line
        return "<br>".join(esc(t) for t in str(v).split("; "))
    return esc(str(v))


def _details(row: dict) -> str:
    """One layer's whole row as plain text (the strip's hover)."""
    parts = [f"layer {row['layer']} · {row['type']} · {row.get('cache class', '')}", str(row.get("tensors", ""))]
    for key in ("KV length", "bytes", "bytes after commit", "what changed"):
        v = row.get(key)
        if v not in (None, ""):
            parts.append(f"{key}: {human_bytes(v) if key.startswith('bytes') else v}")
    if row.get("naive state error") is not None:
        parts.append(f"naive state error: {row['naive state error']:.3g}")
    return "\n".join(parts)


def layer_strip_html(rows: list[dict]) -> str:
    """One cell per layer, coloured by type, its number inside; hovering a cell shows that layer's details."""
    cells = "".join(
        f'<span class="ddv-layer" data-layer="{r["layer"]}" data-type="{esc(r["type"])}" title="{esc(_details(r))}" '
        f'style="flex:1 1 0;min-width:0;max-width:44px;background:{_type_color(r["type"])};color:#fff;'
        f'font-size:10px;line-height:16px;text-align:center;border-radius:2px;overflow:hidden">{r["layer"]}</span>'
        for r in rows)
    legend = (f'<span style="color:{style.GDN_COLOR}">■</span> GDN · <span style="color:{style.ATTENTION_COLOR}">■'
              '</span> attention · hover a layer for its details')
    return (f'<div class="ddv-strip" style="display:flex;gap:2px;width:100%">{cells}</div>'
            f'<div style="color:#777;font-size:11px;margin:2px 0 4px">{legend}</div>')


def _groups(rows: list[dict], keys: list[str]) -> list[tuple[list[int], dict]]:
    """Rows with the same values (all but layer and naive state error) as one: (layers, merged row)."""
    groups: dict[tuple, tuple[list[int], dict, list[float]]] = {}
    for r in rows:
        key = tuple(str(r.get(k)) for k in keys if k != "naive state error")
        layers, first, errors = groups.setdefault(key, ([], dict(r), []))
        layers.append(r["layer"])
        if r.get("naive state error") is not None:
            errors.append(r["naive state error"])
    out = []
    for layers, row, errors in groups.values():
        if errors:
            lo, hi = min(errors), max(errors)
            row["naive state error"] = f"{lo:.3g}" if lo == hi else f"{lo:.3g} – {hi:.3g}"
        out.append((layers, row))
    return out


def cache_table_html(rows: list[dict], *, group_above: int = GROUP_ABOVE, strip: bool = True) -> str:
    """The per-layer cache (cache_table rows of a round, or cache_layout_table rows) as a compact HTML table that
    fits the page: short columns never wrap, shapes one tensor per line, the layer strip above it. Up to
    `group_above` layers one row per layer; beyond, identical layers share a row ('48 layers: 0–2, 4–6, …'; in
    naive mode the state error as a range), each layer's own figures in the strip's hover. Text escaped."""
    if not rows:
        return ""
    keys = [k for k, _, _ in TABLE_COLUMNS if k in rows[0] and (k != "naive state error"
                                                                 or any(r.get(k) is not None for r in rows))]
    grouped = len(rows) > group_above
    body_rows = _groups(rows, keys) if grouped else [([r["layer"]], r) for r in rows]
    nowrap = {k: nw for k, _, nw in TABLE_COLUMNS}
    head_cells = ["layers" if grouped else "layer"] + [
        _KV_HEADER if k == "KV length" and "KV after commit" in rows[0] else dict((a, b) for a, b, _ in TABLE_COLUMNS)[k]
        for k in keys]
    th = f'{_CELL};white-space:nowrap;border-bottom:2px solid #bbb;font-weight:600'
    head = "".join(f'<th style="{th}">{h}</th>' for h in head_cells)
    body = []
    for layers, r in body_rows:
        first = (f'{plural(len(layers), "layer")}: {esc(layer_ranges(layers))}' if grouped and len(layers) > 1
                 else esc(layer_ranges(layers)))
        wrap = "max-width:16em" if grouped else "white-space:nowrap"  # a group's layer list wraps
        tds = [f'<td style="{_CELL};{wrap}">{first}</td>']
        tds += [f'<td style="{_CELL}{";white-space:nowrap" if nowrap[k] else ""}">{_cell(k, r)}</td>' for k in keys]
        body.append(f'<tr class="ddv-layer-row" data-type="{esc(r["type"])}">{"".join(tds)}</tr>')
    note = (f'<div style="color:#777;font-size:11px">{plural(len(rows), "layer")} in '
            f'{plural(len(body_rows), "row")} of identical '
            "layers</div>" if grouped else "")
    table = (f'<table class="ddv-cache-table" style="border-collapse:collapse;font-size:12px;width:100%">'
             f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    return f'<div class="ddv-cache-html">{layer_strip_html(rows) if strip else ""}{table}{note}</div>'

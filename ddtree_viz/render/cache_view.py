"""The target's per-layer cache: what each layer holds, and what this round's commit did to it."""

from __future__ import annotations

import plotly.graph_objects as go

from ..trace import LayerCache, StepRecord
from . import style
from .fastfig import figure
from .style import layer_type_name
from .text import plotly_text as esc


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
            return (f"state after the whole flattened tree ({t} positions, rejected branches included) kept "
                    "(naive, known-wrong)")
        return f"conv/recurrent state replaced by the accepted path's ({a} token{'s' * (a != 1)})"
    if layer.kv_length is None:
        return "–"
    return f"+{t} rows appended, compacted to +{a}"


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


def cache_figure(step: StepRecord, *, title: str | None = None) -> go.Figure:
    """Bytes per layer after the commit (bars coloured by layer type) over ghost bars for the bytes right
    after the verify pass (before compaction); in naive mode, the GDN state error on a second axis."""
    rows = cache_table(step)
    data = []
    if step.cache_before_commit:
        data.append(dict(type="bar", x=[r["layer"] for r in rows], y=[r["bytes before commit"] for r in rows],
                         name="after verify (before commit)",
                         marker=dict(color="rgba(0,0,0,0)", line=dict(color="#777777", width=1)), hoverinfo="skip"))
    for kind in dict.fromkeys(r["type"] for r in rows):
        sel = [r for r in rows if r["type"] == kind]
        data.append(dict(
            type="bar", x=[r["layer"] for r in sel], y=[r["bytes after commit"] for r in sel],
            name=f"{kind} (after commit)", marker=dict(color=style.GDN_COLOR if kind == "GDN" else style.ATTENTION_COLOR),
            hovertext=[_hover(r) for r in sel], hoverinfo="text",
        ))
    errors = [(r["layer"], r["naive state error"]) for r in rows if r["naive state error"] is not None]
    extra = {}
    if errors:
        data.append(dict(type="scatter", x=[e[0] for e in errors], y=[e[1] for e in errors], yaxis="y2", mode="markers",
                         marker=dict(symbol="x", size=11, color=style.DIVERGE_COLOR),
                         name="naive: max |state − exact state|"))
        extra["yaxis2"] = dict(title="state error", overlaying="y", side="right", type="log", showgrid=False)
    fig = figure(data, dict(
        title=dict(text=esc(title) if title is not None else f"Cache per layer, round {step.index + 1}",
                   font=dict(size=14)),
        barmode="overlay", xaxis=dict(title="layer", dtick=1), yaxis=dict(title="bytes"), height=360,
        margin=dict(l=20, r=20, t=50, b=40), legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
        plot_bgcolor="white", **extra,
    ))
    return fig


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

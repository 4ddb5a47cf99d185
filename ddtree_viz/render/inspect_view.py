"""The node inspector: one tree node's story (analysis.node_info) as escaped HTML for the page, and the choices of
the page's 'Inspect node' selector. The short form of the same is in the tree's hover (tree_plot.parent_line)."""

from __future__ import annotations

from .. import analysis
from ..trace import StepRecord
from .text import TokenText, esc, lookup, shorten, token_texts_from_steps, visible

NO_NODE = "Click a node in the tree (or pick one here) to inspect it."


def node_choices(step: StepRecord | None, token_text: TokenText | None = None) -> list[tuple[str, int]]:
    """(label, tree position) for every node of the round: '3 · d2 r1 · token' (visible text, not escaped: the
    selector shows it as text)."""
    if step is None:
        return []
    text = lookup(token_text, token_texts_from_steps([step]))
    return [(f"{n.id} · d{n.depth} r{n.rank if n.rank >= 0 else '-'} · {shorten(visible(text(n.token_id)), 16)}"
             + (" ✓" if n.id in step.accepted[1:] else ""), n.id) for n in step.nodes]


def _tok(text, token_id: int) -> str:
    return f'<code>{esc(visible(text(token_id)))}</code> <small style="color:#777">{token_id}</small>'


def _rank(value) -> str:
    return esc(value) if isinstance(value, str) else f"rank {value}"


def _top_table(rows: list[tuple[int, float]], text, mark: set[int], head: str, fmt) -> str:
    if not rows:
        return f"<p><i>{esc(head)}: not recorded</i></p>"
    body = "".join(
        f'<tr style="{"font-weight:bold" if tid in mark else ""}"><td>{i}</td><td>{_tok(text, tid)}</td>'
        f"<td>{fmt(v)}</td></tr>" for i, (tid, v) in enumerate(rows))
    return (f'<table class="ddv-top" style="border-collapse:collapse;font-size:90%;margin-right:1.5em">'
            f"<caption style=\"text-align:left\">{esc(head)}</caption><tbody>{body}</tbody></table>")


def inspector_html(step: StepRecord | None, position: int | None, token_text: TokenText | None = None) -> str:
    """The inspector panel for tree position `position` of `step` (all token text escaped)."""
    if step is None or position is None:
        return f'<div class="ddv-inspector"><i>{NO_NODE}</i></div>'
    if not 0 <= position < len(step.nodes):
        return f'<div class="ddv-inspector"><i>node {esc(position)} is not in round {step.index + 1}\'s tree</i></div>'
    text = lookup(token_text, token_texts_from_steps([step]))
    info = analysis.node_info(step, position)
    path = " → ".join(_tok(text, t) for t in info["path_token_ids"])
    head = (f"<b>Node {position}</b> (round {step.index + 1}) · {_tok(text, info['token_id'])} · depth {info['depth']}"
            + (f" · drafter rank {info['draft_rank']}, log-prob {info['draft_logprob']:.3f}" if info["depth"] else " · the root")
            + (f" · selector: unary {info['selector_unary']:.3f}, pair {info['selector_pair']:.3f} after its parent"
               if info["depth"] and info["selector_pair"] is not None else "")
            + (" · <b>on the accepted path</b>" if info["accepted"] and position else ""))
    parts = [f'<div class="ddv-inspector" data-node="{position}"><p>{head}</p>',
             f"<p>path (positions {esc(' → '.join(map(str, info['path'])))}): {path}</p>"]
    if info["depth"]:
        want = info["target_choice_at_parent"]
        p = info["target_prob_of_node"]
        k = len(info["target_top"])
        verdict = ("yes: this is the target's choice here" if info["node_is_choice"]
                   else f"no: it chose {_tok(text, want)}")
        prob = (f"p {p:.4f}" if p is not None else f"outside its top-{k}") if k else "not recorded"
        if info["target_margin_at_parent"] is not None:
            prob += f" (its top-1 − top-2 logit margin there {info['target_margin_at_parent']:.3f})"
        sib = info["choice_sibling_rank"]
        sib_text = (f"among this node's siblings at sibling rank {sib} (drafter {_rank(info['choice_draft_rank'])})"
                    if sib is not None else
                    f"not among the siblings (drafter: {_rank(info['choice_draft_rank'])} at this depth)")
        parts.append(f"<p>Did the target want this token? {verdict} · its probability at the parent: {prob} · the "
                     f"target's choice was {sib_text}.</p>")
    tables = []
    if info["depth"]:
        rank_mark = {info["token_id"]}
        tables.append(_top_table(info["draft_top"], text, rank_mark, f"drafter's top-{len(info['draft_top'])} at "
                                 f"depth {info['depth']} (log-prob)", lambda v: f"{v:.3f}"))
        if info["selector_siblings"]:
            tables.append(_top_table(info["selector_siblings"], text, rank_mark, "selector's pair scores from the "
                                     "parent (this node and its siblings in the tree)", lambda v: f"{v:.3f}"))
        tables.append(_top_table(info["target_top"], text, {info["target_choice_at_parent"]},
                                 f"target's top-{len(info['target_top'])} at the parent (probability)",
                                 lambda v: f"{v:.4f}"))
    tables.append(_top_table(info["target_top_here"], text, {info["target_choice_here"]},
                             f"target's top-{len(info['target_top_here'])} after this node (probability)",
                             lambda v: f"{v:.4f}"))
    parts.append('<div style="display:flex;flex-wrap:wrap;align-items:flex-start">' + "".join(tables) + "</div>")
    return "".join(parts) + "</div>"


def stop_html(step: StepRecord, token_text: TokenText | None = None) -> str:
    """One line: where and why the round's walk stopped (analysis.stop_info), escaped."""
    text = lookup(token_text, token_texts_from_steps([step]))
    s = analysis.stop_info(step)
    top = (f"drafter's top candidate there {_tok(text, s['drafter_top_id'])} ({s['drafter_top_logprob']:.3f})"
           if s["drafter_top_id"] is not None else "no drafter candidate recorded there")
    rank, vocab = s["target_draft_rank"], s["target_vocab_rank"]
    rank_text = (f", drafter rank {rank}" if isinstance(rank, int)
                 else f", drafter rank {vocab} in its whole distribution" if vocab is not None else "")
    prob = f" (p {s['target_prob']:.4f})" if s["target_prob"] is not None else ""
    return (f'<p class="ddv-stop">Round {step.index + 1} stopped at depth {s["depth"]} after node {s["last_accepted"]}: '
            f"target's token {_tok(text, s['target_token_id'])}{prob}{rank_text}; {top}; "
            f"<b>{esc(s['reason'])}</b>.</p>")

"""Where the drafter and the target disagree, round by round."""

from __future__ import annotations

from collections.abc import Sequence

from .. import analysis
from ..trace import StepRecord
from . import style
from .text import TokenText, esc, lookup, token_texts_from_steps, visible


def divergence_rows(steps: Sequence[StepRecord], token_text: TokenText | None = None, *, top_k: int = 5) -> list[dict]:
    """One row per round: where the acceptance walk stopped and why.

    round; depth (of the first mismatch = len(accepted)); last_accepted (tree position); candidates: the
    drafter's candidates there (children of the last accepted node, by rank, at most top_k) as dicts
    {token_id, token (visible text), rank, logprob}; n_candidates (all of them); target_token_id /
    target_token (the target's choice = the bonus token: its argmax, or its sample at T > 0); target_margin
    (target's top-1 - top-2 logit there, when recorded); target_prob (sampling: the probability of the sampled
    token under the filtered tempered distribution, else None); mismatch (False when the last accepted node is a leaf: the tree simply ended);
    target_in_candidates (always False for an exact walk: the walk would have gone on); target_in_tree_at_depth:
    rank of the target's token at that depth anywhere in the tree (the drafter proposed it under another
    parent), or None; reason (analysis.stop_info's)."""
    text = lookup(token_text, lambda: token_texts_from_steps(steps))
    rows = []
    for step in steps:
        stop = analysis.stop_info(step)
        last, depth, target = stop["last_accepted"], stop["depth"], stop["target_token_id"]
        kids = [step.nodes[k] for k in stop["siblings"]]
        elsewhere = stop["elsewhere"]
        margin = step.target_margin[last] if len(step.target_margin) == len(step.nodes) else None
        prob = step.target_prob[last] if len(step.target_prob) == len(step.nodes) else None
        rows.append({
            "round": step.index + 1, "depth": depth, "last_accepted": last,
            "candidates": [{"token_id": n.token_id, "token": visible(n.token), "rank": n.rank, "logprob": n.logprob}
                           for n in kids[:top_k]],
            "n_candidates": len(kids), "target_token_id": target, "target_token": visible(text(target)),
            "target_margin": margin, "target_prob": prob, "mismatch": bool(kids),
            "target_in_candidates": stop["sibling_rank"] is not None,
            "target_in_tree_at_depth": step.nodes[elsewhere].rank if elsewhere is not None else None,
            "reason": stop["reason"],
        })
    return rows


def _candidates_html(row: dict) -> str:
    if not row["candidates"]:
        return '<i style="color:#777">none: the tree ends here</i>'
    items = [f'<code>{esc(c["token"])}</code> <small>r{c["rank"]} {c["logprob"]:.2f}</small>'
             for c in row["candidates"]]
    more = row["n_candidates"] - len(row["candidates"])
    return ", ".join(items) + (f" <small>(+{more} more)</small>" if more > 0 else "")


def _verdict(row: dict) -> str:
    if not row["mismatch"]:
        return analysis.STOP_TREE_ENDED  # one name for it everywhere (the grid, the stop line, analyze)
    if row["target_in_candidates"]:
        return "among the candidates"
    if row["target_in_tree_at_depth"] is not None:
        return f"not a child; drafted at this depth elsewhere (rank {row['target_in_tree_at_depth']})"
    return "not drafted at this depth"


def _prob(row: dict) -> str:
    return "" if row.get("target_prob") is None else f", sampled at p {row['target_prob']:.3f}"


def divergence_html(rows: Sequence[dict]) -> str:
    """An HTML table of divergence_rows (all text escaped)."""
    head = ("<tr><th>round</th><th>depth of first mismatch</th><th>drafter's candidates there (rank, log-prob)</th>"
            "<th>target's choice</th><th>target margin</th><th>verdict</th></tr>")
    body = []
    for r in rows:
        margin = "–" if r["target_margin"] is None else f"{r['target_margin']:.2f}"
        color = style.DIVERGE_COLOR if r["mismatch"] and r["target_in_tree_at_depth"] is None else "inherit"
        body.append(
            f"<tr><td>{r['round']}</td><td>{r['depth']}</td><td>{_candidates_html(r)}</td>"
            f'<td><code>{esc(r["target_token"])}</code> <small>id {r["target_token_id"]}{_prob(r)}</small></td>'
            f'<td>{margin}</td><td style="color:{color}">{esc(_verdict(r))}</td></tr>'
        )
    return ('<table class="ddv-divergence" style="border-collapse:collapse;font-size:90%">'
            f"<thead>{head}</thead><tbody>{''.join(body)}</tbody></table>")

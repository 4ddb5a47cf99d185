"""Two configurations side by side: their outputs token by token, where they part, and each one's verdict against
its reference (the target's own decoding: greedy, or sampled with the same seed). Escaped HTML; the figures of
each side are the ordinary tree / acceptance renderers."""

from __future__ import annotations

from .. import analysis
from ..trace import Trace
from . import style
from .diff_view import plain_text_html
from .text import TokenText, esc, lookup, visible
from ..words import plural


def _texts(trace: Trace, token_text: TokenText | None):
    return lookup(token_text, lambda: {int(k): v for k, v in trace.token_texts.items()})  # made where needed only


def _verdict(side: dict, sampled: bool) -> str:
    ref = "the target's own sampling" if sampled else "greedy"
    if side["identical"] is None:
        return f"{ref} not recorded"
    if side.get("pending") and side["identical"]:
        return f"identical to {ref} so far (checking tokens {side['checked']}-{side['tokens'] - 1})"
    if side["identical"]:
        return f"identical to {ref}"
    if side.get("invalid"):
        return f"comparison with {ref} INVALID: {side['invalid']}"
    return f"DIVERGES from {ref} at token {side['first_divergence']}"


def _row(trace: Trace, part: int | None, text, name: str) -> str:
    spans = []
    ref = trace.greedy_ids
    for i, t in enumerate(trace.output_ids):
        # past a reference still being decoded (the live page) a token is unchecked, not wrong (issue #64: A's
        # newest tokens were marked red until Back and Forward)
        wrong = ref is not None and (ref[i] != t if i < len(ref) else not trace.reference_pending)
        after = part is not None and i >= part
        style_ = ["padding:0 1px", "border-radius:2px", "display:inline-block", "white-space:pre-wrap",
                  "overflow-wrap:anywhere", "max-width:100%"]  # a break point between any two tokens
        if after:
            style_.append("background:#fde9d9")
        if wrong:
            style_.append(f"color:{style.DIVERGE_COLOR};text-decoration:underline")
        if part is not None and i == part:
            style_.append(f"outline:2px solid {style.PATH_COLOR}")
        spans.append(f'<span class="ddv-tok" data-i="{i}" style="{";".join(style_)}" title="token {i}, id {t}">'
                     f"{esc(visible(text(t)))}</span>")
    return (f'<div class="ddv-compare-row" data-side="{esc(name)}" style="overflow-wrap:anywhere"><b>{esc(name)}</b> '
            f'<span style="font-family:monospace">{"".join(spans)}</span>'
            f'{plain_text_html(trace.output_ids, text, f"{name} as plain text (select to copy)")}</div>')


def compare_html(a: Trace, b: Trace, token_text: TokenText | None = None, *, view: int | None = None,
                 token_text_b: TokenText | None = None) -> str:
    """Both outputs (tokens after the parting point shaded, the parting token outlined, tokens that differ from
    a side's own reference underlined in red), the parting point, each side's verdict, rounds and acceptance; each
    output also as plain text to copy."""
    c = analysis.compare_outputs(a, b)
    # each side's ids named by its own lookup, then its own trace's texts: in a replay A's texts do not name the
    # tokens only B produced (token_text_b: B's lookup; default A's, one tokenizer live)
    ta, tb = _texts(a, token_text), _texts(b, token_text if token_text_b is None else token_text_b)
    la, lb = analysis.config_label(a.settings), analysis.config_label(b.settings)
    if c["part_at"] is None:
        both = plural(c["agree_upto"], "token")
        part = (f"the two outputs are identical ({both})" if len(a.output_ids) == len(b.output_ids)
                else f"the two outputs agree on the {both} both have so far")
    else:
        i = c["part_at"]
        x = f"<code>{esc(visible(ta(c['a_token_id'])))}</code>"
        y = f"<code>{esc(visible(tb(c['b_token_id'])))}</code>"
        part = f"the outputs part at token {i}: A {x} vs B {y}"
    sampled = bool(a.settings.get("temperature"))
    rows = []
    for name, t, label, side in (("A", a, la, c["a"]), ("B", b, lb, c["b"])):
        mean = "–" if side["mean_acceptance"] is None else f"{side['mean_acceptance']:.2f}"
        color = style.DIVERGE_COLOR if side["identical"] is False else "inherit"
        rows.append(f"<tr><td><b>{name}</b></td><td>{esc(label)}</td><td>{side['rounds']}</td><td>{side['tokens']}</td>"
                    f"<td>{mean}</td><td style=\"color:{color}\">{esc(_verdict(side, sampled))}</td></tr>")
    shown = "" if view is None else f" · showing round {view + 1}" + "".join(
        f" ({name} finished at round {len(t.steps)}: its last is shown)"
        for name, t in (("A", a), ("B", b)) if len(t.steps) <= view)
    table = ("<table style=\"border-collapse:collapse;font-size:90%\"><thead><tr><th></th><th>configuration</th>"
             "<th>rounds</th><th>tokens</th><th>mean acceptance</th><th>verdict</th></tr></thead><tbody>"
             + "".join(rows) + "</tbody></table>")
    warn = "" if c["same_prompt"] else "<p><b>The two traces have different prompts.</b></p>"
    return (f'<div class="ddv-compare">{warn}<p>{part}{shown}</p>{table}'
            f"{_row(a, c['part_at'], ta, 'A')}{_row(b, c['part_at'], tb, 'B')}</div>")

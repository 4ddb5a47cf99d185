"""Output vs the target's own greedy output (or, at T > 0, its own position-keyed sampling with the same seed:
the "sampled reference"), token by token, as escaped HTML.

Live use (app): `output_vs_greedy_html(session.to_trace(), session.token_text, upto_step=k)` -- a Trace is
cheap to make at any time and carries everything needed: the steps (where each token came from), the
output ids, the greedy ids, the first divergence and greedy's logit margin there, and the verify mode.
Replay use: the same call on a loaded Trace, with a token-text map when no tokenizer is at hand
(`text.token_texts_from_steps(trace.steps)` names every id that appears in a tree).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from ..options import REFERENCE_NAMES
from ..trace import StepRecord, Trace, is_sampled, reference_of, sampling_label, verdict_text
from . import style
from .text import TokenText, esc, lookup, token_texts_from_steps, visible
from ..words import plural

NAIVE_NOTE = ("naive verification: the known-wrong flattened-tree behaviour (the Gated DeltaNet layers run the "
              "flattened tree as one sequence, so sibling branches leak into each other's state); a divergence "
              "from greedy is expected")
EXACT_NOTE = "exact verification (tree-exact Gated DeltaNet): the output must equal the target's greedy output"
# a token's box: its own line box (display:inline-block), so a line can break between any two tokens though their
# text has no spaces (visible whitespace: '·to·be'), and inside an over-long one (overflow-wrap)
TOKEN_BOX = ("border-radius:3px;padding:0 2px;margin:1px;font-family:monospace;white-space:pre-wrap;"
             "display:inline-block;max-width:100%;overflow-wrap:anywhere")
SAMPLED_NOTE = ("exact verification (tree-exact Gated DeltaNet), {label}: the output must equal the target's own "
                "sampling with the same seed, token for token (the noise depends only on seed and position)")


def reference_name(trace: Trace) -> str:
    """What the output is compared with: 'greedy', or 'sampled reference' when the trace was sampled (T > 0)."""
    return "sampled reference" if is_sampled(trace.settings) else "greedy"


@dataclass(frozen=True)
class TokenSource:
    """Where one generated token came from."""

    index: int  # into the generated tokens (output_ids)
    token_id: int
    kind: str  # "prefill" (the first token: the prefill pass's argmax) | "draft" (accepted draft) | "bonus"
    step: int | None  # round that produced it (None for the prefill token)
    depth: int | None  # tree depth of an accepted draft, or of the bonus position (last accepted depth + 1)


def token_sources(steps: Sequence[StepRecord], output_ids: Sequence[int]) -> list[TokenSource]:
    """Provenance of each generated token: output_ids[0] from prefill, then per round its accepted drafts
    (in path order) and its bonus token, clipped where the session stopped (end of text / max new tokens)."""
    out: list[TokenSource] = []
    if output_ids:
        out.append(TokenSource(0, int(output_ids[0]), "prefill", None, None))
    for step in steps:
        path = [step.nodes[a] for a in step.accepted[1:]]
        produced = [(n.token_id, "draft", n.depth) for n in path]
        produced.append((step.bonus_token_id, "bonus", step.nodes[step.accepted[-1]].depth + 1))
        count = len(step.new_token_ids) if step.new_token_ids else len(produced)
        for token_id, kind, depth in produced[:count]:
            i = len(out)
            if i >= len(output_ids):
                return out
            out.append(TokenSource(i, int(output_ids[i]), kind, step.index, depth))
    for i in range(len(out), len(output_ids)):  # should not happen with engine records; keep every token shown
        out.append(TokenSource(i, int(output_ids[i]), "unknown", None, None))
    return out


@dataclass(frozen=True)
class GreedyComparison:
    shown: int  # generated tokens compared
    has_greedy: bool
    first_divergence: int | None  # index into the generated tokens, within the shown ones
    margin: float | None  # the reference's decision margin at the first divergence, when known (greedy: top-1 - top-2 logit)
    naive: bool
    summary: str
    checked: int | None = None  # tokens the reference has reached (live page, check pending); None: all
    verdict: str | None = None  # the verdict on the first divergence in words (trace.verdict_text)


def compare_with_greedy(trace: Trace, upto_step: int | None = None, *, shown: int | None = None,
                        stopped: bool = False) -> GreedyComparison:
    """Compare the output (up to and including round `upto_step`, or all of it) with greedy. While the reference
    is still being decoded (trace.reference_pending), only the tokens it has reached are compared; `stopped`: its
    check was stopped there (the rest stays unknown, not 'checking'). `shown`: the count of tokens through
    `upto_step` where the caller has them (its _shown_sources)."""
    if shown is None:
        shown = len(_shown_sources(trace, upto_step))
    naive = trace.settings.get("verify") == "naive" or any(s.verify == "naive" for s in trace.steps)
    greedy, ref = trace.greedy_ids, reference_name(trace)
    if greedy is None:
        missing = "greedy reference" if ref == "greedy" else ref
        return GreedyComparison(shown, False, None, None, naive, f"{plural(shown, 'token')} (no {missing})")
    checked = min(shown, len(greedy)) if trace.reference_pending else None
    if trace.invalid is not None:  # never "identical": equal tokens chosen from NaN logits prove nothing
        fd = trace.first_divergence if trace.first_divergence is not None and trace.first_divergence < shown else None
        return GreedyComparison(shown, True, fd, None, naive,
                                f"comparison with {ref} INVALID: {trace.invalid}", checked, "invalid")
    compared = shown if checked is None else checked
    first = next((i for i in range(compared) if i >= len(greedy) or trace.output_ids[i] != greedy[i]), None)
    if first is None:
        if checked is not None and checked < shown:
            left = shown - checked
            rest = (f"the check was stopped: {'the other one is' if left == 1 else f'the other {left:,} are'} not "
                    f"checked, whether {'it is' if left == 1 else 'they are'} identical is unknown" if stopped
                    else f"checking the other {left:,}…")
            return GreedyComparison(shown, True, None, None, naive, f"identical to {ref} for the "
                                    f"{plural(checked, 'token')} checked so far; {rest}", checked)
        return GreedyComparison(shown, True, None, None, naive, f"identical to {ref} for {plural(shown, 'token')}",
                                checked)
    margin = trace.divergence_margin if trace.first_divergence == first else None
    verdict = verdict_text(trace) if trace.first_divergence == first else None
    m = f"{ref} margin {margin:.3f}" if margin is not None else f"{ref} margin unknown"
    return GreedyComparison(shown, True, first, margin, naive,
                            f"diverges at token {first} ({m})" + (f": {verdict}" if verdict else ""), checked, verdict)


def _shown_sources(trace: Trace, upto_step: int | None) -> list[TokenSource]:
    sources = token_sources(trace.steps, trace.output_ids)
    if upto_step is None:
        return sources
    return [s for s in sources if s.step is None or s.step <= upto_step]


@functools.lru_cache(maxsize=1 << 14)
def _span(src: TokenSource, text: str, greedy_text: str | None, first: bool, margin: float | None,
          ref: str = "greedy", unchecked: bool = False, verdict: str | None = None) -> str:
    """One token's box. Cached: a page redraws the whole output every Step, and every token but the newest
    round's (and where the reference check moved) comes out the same as at the Step before (its arguments are the
    whole of what it depends on)."""
    bg = {"prefill": "#e8e8e8", "draft": "#d9f0e3", "bonus": "#fdf3c4"}.get(src.kind, "#ffffff")
    choice = "argmax" if ref == "greedy" else "sample"
    what = {"prefill": f"prefill token (the prefill pass's {choice})", "draft": f"accepted draft, depth {src.depth}",
            "bonus": f"bonus token (target's {choice}), depth {src.depth}"}.get(src.kind, "unknown origin")
    where = f", round {src.step + 1}" if src.step is not None else ""
    title = f"#{src.index} id {src.token_id}: {what}{where}"
    border = "1px dotted #999" if unchecked else "1px solid #bbb"
    color = "inherit"
    extra = ""
    if unchecked:
        title += f"; not checked against the {ref} reference yet"
    if greedy_text is not None:
        title += f"; {ref} has {greedy_text}"
        border, color = f"2px solid {style.DIVERGE_COLOR}", style.DIVERGE_COLOR
        extra = (f'<span style="color:{style.DIVERGE_COLOR};font-size:80%" class="ddv-greedy">'
                 f"[{esc(ref)}: {esc(greedy_text)}]</span>")
        if first:
            m = f"{margin:.3f}" if margin is not None else "unknown"
            extra += (f'<span style="color:#fff;background:{style.DIVERGE_COLOR};font-size:80%;padding:0 3px" '
                      f'class="ddv-first">first divergence, {esc(ref)} margin {esc(m)}</span>')
            if verdict:
                extra += f'<span style="font-size:80%;padding:0 3px" class="ddv-verdict">{esc(verdict)}</span>'
    sub = {"draft": f"d{src.depth}", "bonus": "★", "prefill": "P"}.get(src.kind, "?")
    return (f'<span class="ddv-tok ddv-{src.kind}" title="{esc(title)}" style="background:{bg};border:{border};'
            f'color:{color};{TOKEN_BOX}">'
            f'{esc(text)}<sub style="color:#777">{sub}</sub></span>{extra}')


def output_vs_greedy_html(trace: Trace, token_text: TokenText | None = None, *, upto_step: int | None = None,
                          stopped: bool = False) -> str:
    """HTML comparing the generated tokens (through round `upto_step`, default all) with greedy.

    Each token is a span with visible whitespace, marked as prefill token (P), accepted draft (d<depth>) or
    bonus token (★); tokens that differ from greedy are red with greedy's token beside them; the first
    divergence carries greedy's logit margin. A summary line reads "identical to greedy for N tokens" or
    "diverges at token k (greedy margin m)" (k indexes the generated tokens from 0); naive mode is labelled
    as the known-wrong flattened-tree behaviour. All text is HTML-escaped (token text is untrusted).
    token_text: callable or mapping id -> text; ids it cannot name come from the trees, then '⟨id⟩'. `stopped`: the
    page's check of a pending reference was stopped (compare_with_greedy)."""
    text = lookup(token_text, lambda: token_texts_from_steps(trace.steps))
    sources = _shown_sources(trace, upto_step)
    cmp = compare_with_greedy(trace, upto_step, shown=len(sources), stopped=stopped)
    greedy, ref = trace.greedy_ids, reference_name(trace)
    spans = []
    last_step: int | None = -1
    for src in sources:
        g_text = None
        unchecked = cmp.checked is not None and src.index >= cmp.checked
        if cmp.has_greedy and not unchecked and (src.index >= len(greedy) or greedy[src.index] != src.token_id):
            g_text = visible(text(greedy[src.index])) if src.index < len(greedy) else f"({ref} ended)"
        if src.step != last_step and src.step is not None:
            spans.append(f'<span class="ddv-round" title="round {src.step}" style="color:#bbb">│</span>')
        last_step = src.step
        spans.append(_span(src, visible(text(src.token_id)), g_text, src.index == cmp.first_divergence, cmp.margin, ref,
                           unchecked, cmp.verdict))
    note = NAIVE_NOTE if cmp.naive else (EXACT_NOTE if ref == "greedy" else SAMPLED_NOTE.format(label=sampling_label(trace.settings)))
    note_style = f"color:{style.DIVERGE_COLOR};font-weight:bold" if cmp.naive else "color:#555"
    ok = cmp.has_greedy and cmp.first_divergence is None and cmp.verdict != "invalid"
    summary_style = "color:#1a7f37" if ok else (f"color:{style.DIVERGE_COLOR}" if cmp.has_greedy else "")
    return (
        '<div class="ddv-diff">'
        f'<div class="ddv-mode" style="{note_style}">{"⚠ " if cmp.naive else ""}{esc(note)}</div>'
        f'<div class="ddv-summary" style="font-weight:bold;{summary_style}">{esc(cmp.summary)}</div>'
        f'<div class="ddv-tokens" style="line-height:2;overflow-wrap:anywhere">{"".join(spans)}</div>'
        f'{plain_text_html([s.token_id for s in sources], text)}'
        f'{_evidence(trace) if cmp.has_greedy else ""}'
        '<div class="ddv-legend" style="color:#777;font-size:85%">P = prefill token · d<i>n</i> = accepted draft at '
        f'depth <i>n</i> · ★ = bonus token (the target\'s own) · red = differs from {esc(ref)} · │ = round boundary'
        f'{" · dotted = not checked yet" if cmp.checked is not None else ""}</div>'
        "</div>"
    )


def plain_text_html(ids: Sequence[int], text, label: str = "the output as plain text (select to copy)") -> str:
    """The tokens' own text, joined as the tokenizer wrote it (no visible-whitespace marks, no boxes), wrapped and
    escaped: what a person copies out of the page."""
    body = esc("".join(text(int(i)) for i in ids))
    return (f'<div class="ddv-plain" style="margin-top:4px"><div style="color:#777;font-size:85%">{esc(label)}</div>'
            '<div class="ddv-plain-text" style="white-space:pre-wrap;overflow-wrap:anywhere;font-family:monospace;'
            f'border:1px solid #ddd;border-radius:3px;padding:4px;max-height:12em;overflow-y:auto">{body}</div></div>')


def _evidence(trace: Trace) -> str:
    """Where the reference ran, and the numerical evidence a verdict rests on (docs/EXACTNESS.md)."""
    where = reference_of(trace.settings)
    parts = [f"reference: {REFERENCE_NAMES.get(where, where)}"]
    if trace.numerical_noise is not None:
        parts.append(f"its numerical noise {trace.numerical_noise:.3g} (max |multi-position - one-token margin| over "
                     f"{plural(trace.noise_positions, 'position')})")
    if trace.tree_drift is not None:
        parts.append(f"tree passes' drift from it {trace.tree_drift:.3g} over {plural(trace.drift_positions, 'position')}")
    return f'<div class="ddv-evidence" style="color:#555;font-size:85%">{esc("; ".join(parts))}</div>'

"""`replay`: a saved trace (or a compare trace) opened in the web UI with no model loaded, or (--print) its rounds
printed: the settings, each round, the verdict; --round K one round in full."""

from __future__ import annotations

from ..errors import InputError
from ..words import plural
from ..options import CHAINS, REFERENCE_NAMES, check_port
from ..page.web.args import add_server_args
from ..trace import is_sampled, reference_of, sampling_flags, sampling_label, verdict_text
from .common import printable
from .show import print_compare, print_session_analysis, reference_words, texts


def add_parser(sub) -> None:
    rp = sub.add_parser(
        "replay", help="open a saved trace in the web UI with no model loaded (or print its rounds)",
        description="Replay a saved trace: the web UI opens with the trace loaded and no model, to step and scrub "
                    "through it as if live. The file is checked first. --print lists the rounds instead (no server).")
    rp.add_argument("trace", metavar="FILE.json", help="a trace written by `run --trace` or the page's download button")
    rp.add_argument("--print", "--summary", dest="print_only", action="store_true",
                    help="print the rounds (tokens per round, text, identical to greedy) and exit; no server")
    rp.add_argument("--round", dest="round_detail", metavar="K|last",
                    help="with --print: also every node of round K (the target's top-k at the parent and after the "
                         "node, the drafter's rank), where and why its walk stopped, its budget curve and the "
                         "drafter's grid")
    add_server_args(rp)
    rp.set_defaults(handler=command)


def command(args) -> int:
    from ..trace import CompareTrace, load_any

    loaded = load_any(args.trace)  # TraceError (missing, corrupt, newer schema) -> `error: ...`, exit 2
    if args.round_detail is not None and not args.print_only:
        raise InputError("--round goes with --print")
    if args.print_only:
        sides = [("A", loaded.a), ("B", loaded.b)] if isinstance(loaded, CompareTrace) else [(None, loaded)]
        for name, trace in sides:
            if name is not None:
                print(f"== {name} ==")
            print_trace_summary(trace, args.trace)
            if args.round_detail is not None:
                from ..render.export import resolve_round

                print_round(trace, resolve_round(trace, args.round_detail))
            if name is not None:
                print()
        if isinstance(loaded, CompareTrace):
            print_compare(loaded.a, loaded.b)
        return 0
    check_port(args.host, args.port)  # before gradio loads: a port in use is a clear error, not a traceback
    from ..page.web import app as web  # imports gradio: only here, so the other commands start quickly

    argv = ["--replay", str(args.trace), "--host", args.host, "--port", str(args.port)] + (["--share"] if args.share else [])
    return web.main(argv)


def print_trace_summary(trace, path) -> None:
    """The rounds of a trace as text: the settings (sampling ones with the `run` options that reproduce them), per
    round the tokens gained, the tree, the text added; then the output and whether it equals the target's own
    decoding (greedy, or sampled with the same seed)."""
    from ..render.prompt_view import prompt_summary
    from ..render.stats_view import stats_summary

    s = trace.settings
    summary = stats_summary(trace)
    print(f"trace {path} (schema_version {trace.schema_version})")
    print(f"target {printable(trace.target)}, draft {printable(trace.draft)}")
    print("settings: " + ", ".join(f"{k.replace('_', ' ')} {s[k]}" for k in
                                   ("method", "verify", "budget", "block_size", "max_new_tokens", "dtype", "device") if k in s))
    if is_sampled(s):
        print(f"target's choice: {sampling_label(s)}, noise {s.get('noise')}; reproduce with "
              f"`run {sampling_flags(s)}` and the settings above")
    else:
        print("target's choice: greedy")
    if s.get("verify") == "naive":
        print("NAIVE verification: the known-wrong flattened-tree behaviour (shown to reproduce the bug)")
    print(f"prompt: {trace.prompt!r}")
    print(f"prompt given as: {prompt_summary(trace)}")
    mean = summary["mean_acceptance"]
    print(f"rounds: {len(trace.steps)}  generated tokens: {len(trace.output_ids)}  mean acceptance: "
          f"{'-' if mean is None else f'{mean:.2f}'} tokens kept per target forward (bonus included)")
    print(f"{'round':>5}  {'tokens':>6}  {'accepted':>8}  {'tree':>4}  {'committed':>9}  text added")
    for st in trace.steps:
        added = st.new_token_ids or tuple(st.nodes[i].token_id for i in st.accepted[1:]) + (st.bonus_token_id,)
        print(f"{st.index + 1:>5}  {st.kept:>6}  {f'{st.acceptance - 1}+bonus':>8}  {len(st.nodes):>4}  "
              f"{st.committed_len:>9}  {texts(trace, added)!r}")
    print_session_analysis(trace.steps, s.get("block_size"), s.get("method", "ddtree"))
    text = trace.output_text or texts(trace, trace.output_ids)
    print(f"output: {text!r}")
    what, who, gap = reference_words(s)
    if trace.greedy_ids is None:
        print(f"{who} reference not recorded (--no-greedy)")
    elif trace.invalid is not None:
        print(f"comparison with {what} INVALID: {trace.invalid}")
    elif trace.first_divergence is None:
        print(f"output identical to {what} for {plural(len(trace.output_ids), 'token')}")
    else:
        i = trace.first_divergence
        ours = trace.output_ids[i] if i < len(trace.output_ids) else None
        theirs = trace.greedy_ids[i] if i < len(trace.greedy_ids) else None
        a = "(ended)" if ours is None else f"{texts(trace, [ours])!r} ({ours})"
        b = "(ended)" if theirs is None else f"{texts(trace, [theirs])!r} ({theirs})"
        margin = f", {gap} {trace.divergence_margin:.4g}" if trace.divergence_margin is not None else ""
        print(f"DIVERGES from {what} at generated token {i}: {a} vs {who} {b}{margin}")
        print(f"verdict: {verdict_text(trace)}")
    if trace.greedy_ids is not None:
        print(f"reference: {REFERENCE_NAMES.get(reference_of(s), reference_of(s))}"
              + (f", {trace.reference_ms:.0f} ms" if trace.reference_ms else ""))


def print_round(trace, k: int) -> None:
    """One round in full: where and why the walk stopped, the budget curve, the drafter's grid and every node
    with the target's view (ddtree_viz.analysis: stop_info, node_info), as `replay --print --round K` shows it."""
    from .. import analysis
    from ..render.budget_view import budget_line

    st = trace.steps[k]
    print()
    print(f"round {k + 1} of {len(trace.steps)}: committed length {st.committed_len}, "
          f"{plural(len(st.nodes), 'tree position')}, accepted path {list(st.accepted)} = "
          f"{plural(st.acceptance - 1, 'draft')} + bonus")
    stop = analysis.stop_info(st)
    top = ("-" if stop["drafter_top_id"] is None
           else f"{_tok(trace, stop['drafter_top_id'])} {stop['drafter_top_logprob']:.3f}")
    prob = "" if stop["target_prob"] is None else f" p {stop['target_prob']:.4f}"
    rank = stop["target_draft_rank"]
    vocab = ("" if stop["target_vocab_rank"] is None or isinstance(rank, int)
             else f" (rank {stop['target_vocab_rank']} in its whole distribution)")
    print(f"stopped at depth {stop['depth']} after node {stop['last_accepted']}: target's token "
          f"{_tok(trace, stop['target_token_id'])}{prob}; drafter's rank for it: "
          f"{'-' if rank is None else rank}{vocab}; drafter's top there: {top}; reason: {stop['reason']}")
    unit = "chain length" if st.method in CHAINS else "budget"
    print(f"{unit} curve ({unit}:tokens gained, where it steps up): {budget_line(analysis.recorded_curve(st))}")
    if st.draft_top_ids:
        taken = {(n.depth, n.rank) for n in st.nodes[1:]}
        print(f"drafter's grid (top {len(st.draft_top_ids[0])} per depth, log-prob; * taken by the tree, "
              "> on the accepted path):")
        path = {(st.nodes[a].depth, st.nodes[a].rank) for a in st.accepted[1:]}
        for d, (ids, lps) in enumerate(zip(st.draft_top_ids, st.draft_top_logprobs), start=1):
            cells = [f"{'>' if (d, r) in path else '*' if (d, r) in taken else ' '}{_tok(trace, t)} {lp:.2f}"
                     for r, (t, lp) in enumerate(zip(ids, lps))]
            print(f"  d{d:<2} " + "  ".join(cells))
    print("nodes (p@parent: the target's probability of the node's token after its parent; choice@parent: what it "
          "chose there; top after: its top-k after the node):")
    print(f"  {'pos':>4} {'par':>4} {'d':>2} {'r':>3} {'token':<20} {'draft lp':>8} {'p@parent':>9}  choice@parent"
          "          top after")
    for n in st.nodes:
        info = analysis.node_info(st, n.id)
        p = info["target_prob_of_node"]
        pp = "-" if n.parent < 0 else (f"{p:.4f}" if p is not None else "<top-k")
        choice = "" if n.parent < 0 else ("= node" if info["node_is_choice"] else _tok(trace, info["target_choice_at_parent"]))
        after = " ".join(f"{_tok(trace, t)}:{q:.3f}" for t, q in info["target_top_here"])
        mark = "✓" if info["accepted"] and n.id else " "
        print(f" {mark}{n.id:>4} {n.parent:>4} {n.depth:>2} {n.rank:>3} {_tok(trace, n.token_id)[:20]:<20} "
              f"{n.logprob:>8.3f} {pp:>9}  {choice[:22]:<22} {after}")


def _tok(trace, token_id) -> str:
    return f"{texts(trace, [token_id])!r}({token_id})"

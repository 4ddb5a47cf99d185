"""`run`: decode one prompt, print the text, tokens per round, mean acceptance and the verdict against the target's
own decoding; `--compare` decodes it again with configuration B (ddtree_viz/compare.py) and prints both."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..compare import COMPARE_KEYS
from ..errors import InputError
from ..words import plural
from ..options import (DTYPES, ENGINE_CHOICES, METHODS, RECORD_LEVELS, REFERENCE_NAMES, REFERENCES, TREE_SCORINGS,
                       VERIFY_MODES, whole_number)
from ..trace import sampling_label, verdict_words
from .common import (add_chat_args, add_decode_args, add_model_args, add_sampling_args, add_scoring_arg,
                     check_output_path, decode_settings, load_models, printable, prompt_spec)
from .show import print_compare, print_session_analysis, reference_words


def compare_spec(text: str) -> dict:
    """'budget=16,method=dflash' -> {'budget': 16, 'method': 'dflash'} (keys as in COMPARE_KEYS; - or _ alike)."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in COMPARE_KEYS or not value.strip():
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected KEY=VALUE with KEY one of {', '.join(COMPARE_KEYS)}")
        value = value.strip()
        out[key] = whole_number(value) if key in ("budget", "block_size") else value
    if not out:
        raise argparse.ArgumentTypeError("give at least one KEY=VALUE")
    return out


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="decode one prompt and compare with the target's greedy output",
                         description="Decode one prompt with DDTree (or DFlash), print the text, tokens per round, "
                                     "mean acceptance and whether the output equals the target's own decoding "
                                     "(greedy, or sampled with the same seed).")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="text to continue (with --chat: the user's message)")
    source.add_argument("--prompt-file", metavar="FILE",
                        help="the prompt from a UTF-8 file: plain text, or a JSON list of messages "
                             "[{\"role\": \"user\", \"content\": \"...\"}, ...] (with --chat)")
    add_chat_args(run)
    add_model_args(run)
    add_decode_args(run)
    run.add_argument("--verify", default="exact", choices=VERIFY_MODES,
                     help="exact (tree-exact GDN) or naive (the known-wrong flattened-tree behaviour); default: exact")
    run.add_argument("--method", default="ddtree", choices=METHODS,
                     help="ddtree (draft tree), dflash (the drafter's top-1 chain) or dflash2 (a DFlash2 drafter's "
                          "candidate-selector chain); default: ddtree")
    add_scoring_arg(run)
    run.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                     help="auto (default: the fastest exact engine that applies: runner for exact rounds on a Qwen3.5 "
                          "hybrid target on one device, else transformers), transformers (the target's own forward with "
                          "the tree-exact GDN swapped in: the reference path) or runner (the static runner: "
                          "preallocated state, CUDA graphs on a GPU; exact only)")
    run.add_argument("--reference", default="engine", choices=REFERENCES,
                     help="where the reference decodes: engine (default: the session's engine; the runner decodes "
                          "one-node trees on a second static runner) or transformers (transformers' own forward, one "
                          "token at a time: the independent check, slow at real sizes)")
    run.add_argument("--trace", metavar="FILE.json", help="write the whole session as a trace JSON file")
    run.add_argument("--no-greedy", action="store_true",
                     help="skip the reference decoding (greedy, or sampled with the same seed) and the comparison")
    run.add_argument("--compare", metavar="KEY=VALUE[,...]", type=compare_spec,
                     help="also decode the prompt with a second configuration B, the first one's settings changed as "
                          "given (keys: " + ", ".join(COMPARE_KEYS) + "; e.g. verify=naive, method=dflash, "
                          "budget=16); print both outputs, where they part and each verdict; --trace writes both")
    run.add_argument("--target-top-k", type=whole_number, default=5, metavar="K",
                     help="the target's top-K tokens recorded at every tree node (default: 5; 0: none)")
    run.add_argument("--draft-top-k", type=whole_number, default=16, metavar="K",
                     help="the drafter's candidates recorded per depth, at most the budget (default: 16; 0: none)")
    run.add_argument("--record", default="full", choices=RECORD_LEVELS,
                     help="what each round's record keeps: full (default: the tree's nodes with their texts, the "
                          "target's top tokens and margins, the drafter's grid, the cache snapshots, the phase times: "
                          "what the page, export and replay show) or light (the tree's shape and tokens, the accepted "
                          "path and the bonus: decoding at the engine's speed, nothing read back that decoding does "
                          "not need; no --trace or --compare, which need the trees)")
    run.add_argument("--launch-ahead", action=argparse.BooleanOptionalAction, default=None,
                     help="DDTree's marginal rounds queue the verify's CUDA graph before the tree is built, so the "
                          "host's launch overlaps the draft (engine/launch.py; the runner engine with CUDA graphs, "
                          "both models on one GPU). Default: with --record light; elsewhere the rounds run as "
                          "without it. The run's last line says whether it was, and if not, why")
    run.add_argument("--tree-on-device", action=argparse.BooleanOptionalAction, default=None,
                     help="DDTree's marginal tree built on the device (the best-first kernel in a CUDA graph), its "
                          "inputs written by the device and its verify queued with no wait on the host (the runner "
                          "engine). Default: on one GPU, records kept or not, unless --launch-ahead is given (which "
                          "builds the tree on the host). The run's last line says where the trees were built")
    add_sampling_args(run)
    run.set_defaults(handler=command)


def command(args) -> int:
    from ..engine.prompts import encode
    from ..engine.recorder import Recording
    from ..engine.scheduler import Overlap
    from ..engine.session import DecodeSession

    spec = prompt_spec(args, args.prompt, args.prompt_file)  # the prompt's text checked (valid Unicode) before loading
    if args.record == "light" and (args.trace or args.compare):
        raise InputError(f"--record light keeps no trees, which {'--trace' if args.trace else '--compare'} needs: "
                         "use --record full (the default)")
    if args.compare:
        _check_compare(args.compare)
    if args.trace:
        check_output_path(args.trace, "trace file")
    pair = load_models(args)
    encoded = encode(pair.tokenizer, spec)
    settings = decode_settings(args)
    session = DecodeSession(pair, settings,
                            recording=Recording(record=args.record == "full", target_top_k=args.target_top_k,
                                                draft_top_k=args.draft_top_k),
                            overlap=Overlap(tree_on_device=args.tree_on_device, launch_ahead=args.launch_ahead))
    _print_setup(args, pair, session)
    print(_describe_prompt(spec, encoded))
    session.prefill(spec=spec)
    start = time.perf_counter()
    records = session.run()
    _print_result(args, session, records, (time.perf_counter() - start) * 1e3)
    if session.scheduler.tree_on_device or args.tree_on_device is not None:
        print(tree_line(session))
    elif args.launch_ahead or session.scheduler.launch_ahead:
        print(launch_ahead_line(session))

    saved = session.to_trace(with_greedy=not args.no_greedy)
    if args.compare:
        saved = _run_b(args, pair, settings, spec, session, saved)
    if args.trace:
        path = Path(args.trace)
        try:
            saved.save(path)
        except OSError as exc:
            raise InputError(f"cannot write trace file {path}: {exc.strerror or exc}") from None
        print(f"{'compare trace' if args.compare else 'trace'} written to {path}")
    return 0


def _check_compare(changes: dict) -> None:
    """Configuration B's named values, checked before any model loads."""
    for key, allowed in (("method", METHODS), ("verify", VERIFY_MODES), ("engine", ENGINE_CHOICES),
                         ("dtype", DTYPES), ("tree_scoring", TREE_SCORINGS)):
        if key in changes and changes[key] not in allowed:
            raise InputError(f"--compare {key} must be one of {', '.join(allowed)}, not {changes[key]!r}")


def _print_setup(args, pair, session) -> None:
    """The models, the method and its settings, the engine, the sampling and the naive warning."""
    print(pair.describe())
    print(pair.parameters_line())
    scoring = f" ({args.tree_scoring} scoring)" if args.tree_scoring != "marginal" else ""
    method = {"ddtree": f"DDTree{scoring}", "dflash": "DFlash (chain)", "dflash2": "DFlash2 (selector chain)"}[args.method]
    shape = f"budget {session.budget}, " if args.method == "ddtree" else ""  # a chain is block_size - 1 long
    chosen = " (auto: the fastest exact engine for this target)" if args.engine == "auto" else ""
    print(f"{method}, {shape}block size {session.block_size}, max new tokens {session.max_new_tokens}, verify {args.verify}, "
          f"engine {session.engine}{chosen}")
    if not session.sampler.greedy:
        print(f"{sampling_label(session.settings)}: position-keyed noise {session.sampler.settings['noise']} "
              "(docs/SAMPLING.md); compared with the target's own sampling, same seed")
    if args.verify == "naive":
        print("NAIVE verification: the known-wrong flattened-tree behaviour (GDN layers run the tree as one chain; "
              "rejected branches leak into the state). Output may differ from greedy; shown to reproduce the bug.")


def tree_line(session) -> str:
    """Where the rounds' trees were built (run --[no-]tree-on-device; by default on one GPU)."""
    if not session.scheduler.tree_on_device:
        return "trees built on the host (build_tree over the drafter's top-k, copied back)"
    builder = session.scheduler.tree_builder
    how = "in a CUDA graph" if builder.graph is not None else f"eagerly ({builder.error or 'no CUDA graphs here'})"
    return f"trees built on the device {how}, the verify's inputs written by the device"


def launch_ahead_line(session) -> str:
    """Whether the rounds' verify passes were launched ahead of their trees (run --launch-ahead, or --record light),
    and why not."""
    runner = getattr(session.target_engine, "runner", None)
    passes = getattr(runner, "passes_launched_ahead", 0)
    if session.scheduler.launch_ahead and passes:
        return f"verify launched ahead of its tree: {plural(passes, 'pass')}"
    why = getattr(runner, "launch_error", None) or (
        "it needs DDTree's marginal tree on the runner engine with CUDA graphs, both models on one GPU")
    return f"verify not launched ahead: {why}"


def _print_result(args, session, records, rounds_ms: float) -> None:
    """The text, tokens per round, acceptance, the rounds' time (by phase where they were timed), the session
    analysis and the reference's verdict."""
    print()
    print(printable(session.prompt) + printable(session.output_text))
    print()
    per_round = [r.kept for r in records]  # tokens kept: a round cut at max new tokens counts what it added
    print(f"rounds: {len(records)}  tokens per round: {' '.join(map(str, per_round)) or '-'}")
    print(f"generated tokens: {len(session.generated)} (1 from prefill + {len(session.generated) - 1} from rounds)")
    print(f"mean acceptance: {session.mean_acceptance:.2f} tokens kept per target forward (bonus included)")
    timings = {k: sum(r.timings_ms.get(k, 0.0) for r in records) for k in ("draft", "tree", "verify", "commit")}
    phases = (", ".join(f"{k} {v:.0f} ms" for k, v in timings.items()) if session.time_phases
              else "phases not timed: --record light")
    print(f"time: prefill {session.prefill_ms:.0f} ms, rounds {rounds_ms:.0f} ms; {phases}")
    errors = [e for r in records for e in getattr(r, "naive_state_error", ()) if e is not None]
    if errors:
        print(f"naive: committed GDN recurrent state is off from the exact one by up to {max(errors):.3g} "
              "(max |difference| over layers and rounds)")
    print_session_analysis(records, session.block_size, session.method)
    if args.no_greedy:
        print("greedy comparison skipped (--no-greedy)")
    else:
        print(_greedy_line(session, args.verify))
        print(_reference_line(session))


def _run_b(args, pair, settings, spec, session, trace_a):
    """`run --compare`: decode the prompt again with configuration B (compare.settings_b: A's settings changed as
    given), print it beside A, return both recorded."""
    from ..analysis import config_label
    from ..compare import settings_b, start_b
    from ..engine.models import load_pair
    from ..trace import CompareTrace

    dtype = args.compare.get("dtype", args.dtype)
    pair_b = pair if dtype == args.dtype else load_pair(args.target, args.draft, dtype=dtype, device=args.device,
                                                        draft_weights=args.draft_weights,
                                                        head_weights=args.head_weights)
    other = start_b(pair_b, settings_b(settings, args.compare), spec, session.sampler,
                    target_top_k=args.target_top_k, draft_top_k=args.draft_top_k)
    records = other.run()
    trace_b = other.to_trace(with_greedy=not args.no_greedy)
    print()
    print(f"B: {config_label(trace_b.settings)}")
    print(printable(other.prompt) + printable(other.output_text))
    print(f"rounds: {len(records)}  tokens per round: {' '.join(str(r.kept) for r in records) or '-'}")
    print(f"mean acceptance: {other.mean_acceptance:.2f} tokens kept per target forward (bonus included)")
    print_session_analysis(records, other.block_size, other.method)
    if not args.no_greedy:
        print(_greedy_line(other, other.verify))
    print()
    print_compare(trace_a, trace_b)
    return CompareTrace(trace_a, trace_b)


def _describe_prompt(spec, encoded) -> str:
    """One line on how the prompt went in: raw text, or templated (system prompt, messages, thinking)."""
    if not spec.chat:
        return f"prompt: raw text, {plural(len(encoded.ids), 'token')}"
    turns = spec.conversation()
    thinking = "template default" if spec.thinking is None else ("on" if spec.thinking else "off")
    return (f"prompt: chat template on, {plural(len(turns), 'message')} "
            f"({', '.join(t['role'] for t in turns)}), thinking {thinking}, {plural(len(encoded.ids), 'token')}")


def _token(session, token_id: int) -> str:
    return f"{session.token_text(token_id)!r} ({token_id})"


def _greedy_line(session, verify: str) -> str:
    label = " (naive verification, known-wrong)" if verify == "naive" else ""
    what, who, gap = reference_words(session.settings)
    greedy = session.greedy()
    check = session.divergence_check()
    index, margin = check.index, check.margin
    if check.invalid is not None:  # never "identical": equal tokens chosen from NaN logits prove nothing
        said = "matches" if index is None else f"differs at generated token {index}"
        return f"comparison with {what} INVALID ({said}, proving nothing): {check.invalid}{label}"
    if index is None:
        return f"output identical to {what} for {plural(len(session.generated), 'token')}{label}"
    ours = _token(session, session.generated[index]) if index < len(session.generated) else "(ended)"
    theirs = _token(session, greedy.ids[index]) if index < len(greedy.ids) else "(ended)"
    where = f"DIVERGES from {what} at generated token {index}{label}: {session.method} {ours} vs {who} {theirs}"
    where += f", {gap} {margin:.4g}" if margin is not None else ""
    return where + f"\nverdict: {verdict_words(check.verdict, check.margin, check.noise, check.noise_positions)}"


def _reference_line(session) -> str:
    """Where the reference ran, its time (apart from the rounds'), and the noise it measured."""
    check = session.divergence_check()
    noise = ("no numerical noise measured (no stretch of two or more tokens)" if check.noise is None else
             f"numerical noise {check.noise:.3g} (max |multi-position - one-token margin| over "
             f"{plural(check.noise_positions, 'position')})")
    drift = ("" if check.drift is None else
             f"; tree-pass drift {check.drift:.3g} over {plural(check.drift_positions, 'position')}")
    return (f"reference: {REFERENCE_NAMES.get(session.reference, session.reference)}, "
            f"{session.greedy_seconds * 1e3:.0f} ms (not in the rounds' time); {noise}{drift}")

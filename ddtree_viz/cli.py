"""Command line: `python -m ddtree_viz run | bench`. Parse, call the engine, print.

Every user error (a DDTreeVizError) prints `error: <message>` on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import DDTreeVizError, InputError, ModelLoadError

EXIT_USER_ERROR = 2

# ------------------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------------------


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny Qwen3.5-style model)")
    g.add_argument("--draft", metavar="DIR|HUB_ID", help="DFlash drafter for the target (default: the embedded one)")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="default: float32")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                   help="cpu, cuda (one GPU) or auto (all visible GPUs via accelerate); default: cpu")
    g.add_argument("--verbose", action="store_true", help="show transformers' log messages and progress bars")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--budget", type=_whole_number, default=32, help="draft tree nodes per round (default: 32)")
    g.add_argument("--max-new-tokens", type=_whole_number, default=64, help="tokens to generate (default: 64)")
    g.add_argument("--block-size", type=_whole_number, default=None,
                   help="drafter block: root + drafted depths (default: the drafter's own)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddtree_viz",
        description="ddtree-viz: debug and visualise DDTree speculative decoding on hybrid (Gated DeltaNet + attention) targets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="decode one prompt and compare with the target's greedy output",
                         description="Decode one prompt with DDTree (or DFlash), print the text, tokens per round, "
                                     "mean acceptance and whether the output equals the target's greedy decoding.")
    run.add_argument("--prompt", required=True, help="text to continue")
    _add_model_args(run)
    _add_decode_args(run)
    run.add_argument("--verify", default="exact", choices=("exact", "naive"),
                     help="exact (tree-exact GDN) or naive (the known-wrong flattened-tree behaviour); default: exact")
    run.add_argument("--method", default="ddtree", choices=("ddtree", "dflash"),
                     help="ddtree (draft tree) or dflash (top-1 chain); default: ddtree")
    run.add_argument("--trace", metavar="FILE.json", help="write the whole session as a trace JSON file")
    run.add_argument("--no-greedy", action="store_true", help="skip the greedy reference decoding (and the comparison)")
    run.set_defaults(handler=cmd_run)

    bench = sub.add_parser("bench", help="tokens/s of greedy, DFlash and DDTree on the same prompts",
                           description="Measure plain greedy decoding, DFlash (chain) and DDTree (exact) side by side. "
                                       "Each method is timed from the start of prefill to the last generated token, "
                                       "after one untimed warm-up.")
    bench.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                       help="a prompt (repeat for several; default: a few Python code openings)")
    _add_model_args(bench)
    _add_decode_args(bench)
    bench.add_argument("--repeats", type=_whole_number, default=1, help="timed runs per prompt and method (default: 1)")
    bench.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    bench.set_defaults(handler=cmd_bench)
    return parser


# ------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------


def _printable(text: str) -> str:
    """Model output may hold control characters (escape sequences included): show them as \\xNN."""
    return "".join(ch if ch in "\n\t" or ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _quiet_transformers(verbose: bool) -> None:
    if verbose:
        return
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _check_settings(args) -> None:
    """Range checks that need no model, done before a (possibly long) model load. The session re-checks."""
    from .engine.session import MAX_BUDGET, MAX_NEW_TOKENS, _check_int

    _check_int("budget", args.budget, 1, MAX_BUDGET)
    _check_int("max new tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS)
    if args.block_size is not None and args.block_size < 2:
        raise InputError(f"block size must be at least 2 (the root + one drafted depth), not {args.block_size}")


def _load(args):
    from .engine.models import EMBEDDED_TARGET, load_pair

    _check_settings(args)
    _quiet_transformers(args.verbose)
    if args.target is None and not EMBEDDED_TARGET.is_dir():
        raise ModelLoadError(
            f"the embedded default model is not installed ({EMBEDDED_TARGET} is missing); "
            "pass --target DIR|HUB_ID --draft DIR|HUB_ID"
        )
    return load_pair(args.target, args.draft, dtype=args.dtype, device=args.device)


def _token(session, token_id: int) -> str:
    return f"{session.token_text(token_id)!r} ({token_id})"


# ------------------------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------------------------


def cmd_run(args) -> int:
    from .engine.session import DecodeSession

    if args.prompt == "":
        raise InputError("the prompt is empty: type some text to continue")
    pair = _load(args)
    session = DecodeSession(pair, budget=args.budget, max_new_tokens=args.max_new_tokens, verify=args.verify,
                            method=args.method, block_size=args.block_size)
    print(pair.describe())
    method = "DDTree" if args.method == "ddtree" else "DFlash (chain)"
    shape = f"budget {session.budget}, " if args.method == "ddtree" else ""
    print(f"{method}, {shape}block size {session.block_size}, max new tokens {session.max_new_tokens}, verify {args.verify}")
    if args.verify == "naive":
        print("NAIVE verification: the known-wrong flattened-tree behaviour (GDN layers run the tree as one chain; "
              "rejected branches leak into the state). Output may differ from greedy; shown to reproduce the bug.")

    session.prefill(args.prompt)
    records = session.run()

    print()
    print(_printable(session.prompt) + _printable(session.output_text))
    print()
    per_round = [r.acceptance for r in records]
    print(f"rounds: {len(records)}  tokens per round: {' '.join(map(str, per_round)) or '-'}")
    print(f"generated tokens: {len(session.generated)} (1 from prefill + {len(session.generated) - 1} from rounds)")
    print(f"mean acceptance: {session.mean_acceptance:.2f} tokens per target forward (bonus included)")
    timings = {k: sum(r.timings_ms.get(k, 0.0) for r in records) for k in ("draft", "tree", "verify", "commit")}
    print(f"time: prefill {session.prefill_ms:.0f} ms, " + ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items()))
    errors = [e for r in records for e in getattr(r, "naive_state_error", ()) if e is not None]
    if errors:
        print(f"naive: committed GDN recurrent state is off from the exact one by up to {max(errors):.3g} "
              "(max |difference| over layers and rounds)")

    if args.no_greedy:
        print("greedy comparison skipped (--no-greedy)")
    else:
        print(_greedy_line(session, args.verify))

    if args.trace:
        path = Path(args.trace)
        try:
            session.to_trace(with_greedy=not args.no_greedy).save(path)
        except OSError as exc:
            raise InputError(f"cannot write trace file {path}: {exc.strerror or exc}") from None
        print(f"trace written to {path}")
    return 0


def _greedy_line(session, verify: str) -> str:
    label = " (naive verification, known-wrong)" if verify == "naive" else ""
    greedy = session.greedy()
    index, margin = session.divergence()
    if index is None:
        return f"output identical to greedy for {len(session.generated)} tokens{label}"
    ours = _token(session, session.generated[index]) if index < len(session.generated) else "(ended)"
    theirs = _token(session, greedy.ids[index]) if index < len(greedy.ids) else "(ended)"
    where = f"DIVERGES from greedy at generated token {index}{label}: {session.method} {ours} vs greedy {theirs}"
    return where + (f", greedy top-2 logit margin {margin:.4g}" if margin is not None else "")


# ------------------------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------------------------


def cmd_bench(args) -> int:
    from .bench import run_bench

    if args.prompts is not None and any(p == "" for p in args.prompts):
        raise InputError("a --prompt is empty: every prompt needs some text")
    pair = _load(args)
    print(pair.describe())
    result = run_bench(pair, args.prompts, budget=args.budget, max_new_tokens=args.max_new_tokens,
                       block_size=args.block_size, repeats=args.repeats,
                       progress=lambda text: print(f"  ... {text}", file=sys.stderr, flush=True))
    s = result.settings
    print(f"budget {s['budget']}, block size {s['block_size']}, max new tokens {s['max_new_tokens']}, repeats {s['repeats']}, "
          f"{s['torch_threads']} torch threads")
    print("timed: start of prefill to last generated token, after one untimed warm-up per method")
    print()
    for i, p in enumerate(result.prompts):
        head = p.prompt if len(p.prompt) <= 40 else p.prompt[:37] + "..."
        print(f"prompt {i + 1}: {head!r} ({p.prompt_tokens} tokens)")
        for m in ("greedy", "dflash", "ddtree"):
            line = f"  {m:<7} {p.tokens(m):>5} tok {p.seconds(m):>8.2f} s {p.tok_s(m):>9.1f} tok/s"
            if m != "greedy":
                div = p.divergence(m)
                same = "identical to greedy" if div is None else f"DIVERGES from greedy at token {div}"
                line += f"  x{_ratio(p.tok_s(m), p.tok_s('greedy')):.2f}  acceptance {p.mean_acceptance(m):.2f}  {same}"
            print(line)
    print()
    print(f"{'overall':<8} {'tok/s':>9}  {'vs greedy':>9}  {'mean acceptance':>15}  identical to greedy")
    for m in ("greedy", "dflash", "ddtree"):
        if m == "greedy":
            print(f"{m:<8} {result.tok_s(m):>9.1f}  {'1.00x':>9}  {'-':>15}  -")
        else:
            same = "yes" if result.identical_to_greedy(m) else "NO"
            print(f"{m:<8} {result.tok_s(m):>9.1f}  {result.speedup(m):>8.2f}x  {result.mean_acceptance(m):>15.2f}  {same}")

    if args.json:
        path = Path(args.json)
        try:
            path.write_text(json.dumps(result.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"figures written to {path}")
    return 0


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


# ------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USER_ERROR
    try:
        return args.handler(args)
    except DDTreeVizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # out of GPU memory is the user's to fix (smaller model, budget or dtype), not a bug
        if type(exc).__name__ == "OutOfMemoryError":
            print(f"error: out of memory: {exc}".splitlines()[0], file=sys.stderr)
            return EXIT_USER_ERROR
        raise


if __name__ == "__main__":
    raise SystemExit(main())

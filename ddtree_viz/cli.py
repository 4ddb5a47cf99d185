"""Command line: `ddtree-viz run | bench | export | replay | app` (or `python -m ddtree_viz ...`). Parse, call the
engine or a renderer, print; `app` starts the web UI (ddtree_viz/web.py, the options of app.py).

Every user error (a DDTreeVizError) prints `error: <message>` on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from .errors import DDTreeVizError, InputError
from .options import (DTYPES, ENGINE_CHOICES, METHODS, REFERENCE_NAMES, REFERENCES, VERIFY_MODES, check_decode_settings,
                      check_port, engine_for_verify, port_number, whole_number)
from .trace import is_sampled, reference_of, sampling_flags, sampling_label, verdict_text, verdict_words

EXIT_USER_ERROR = 2

# ------------------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------------------


def check_output_path(path: str | Path, what: str) -> Path:
    """Refuse an output file that cannot be written, before the decode, bench or export that would fill it."""
    out = Path(path)
    folder = out.parent
    if out.is_dir():
        raise InputError(f"cannot write {what} {out}: it is a directory")
    if not folder.is_dir():
        raise InputError(f"cannot write {what} {out}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InputError(f"cannot write {what} {out}: permission denied")
    return out


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny Qwen3.5-style model)")
    g.add_argument("--draft", metavar="DIR|HUB_ID", help="DFlash drafter for the target (default: the embedded one)")
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="default: float32")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                   help="cpu, cuda (one GPU) or auto (all visible GPUs via accelerate); default: cpu")
    g.add_argument("--verbose", action="store_true", help="show transformers' log messages and progress bars")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--budget", type=whole_number, default=32, help="draft tree nodes per round (default: 32)")
    g.add_argument("--max-new-tokens", type=whole_number, default=64, help="tokens to generate (default: 64)")
    g.add_argument("--block-size", type=whole_number, default=None,
                   help="drafter block: root + drafted depths (default: the drafter's own)")


COMPARE_KEYS = ("budget", "block_size", "method", "verify", "engine", "dtype")


def _compare_spec(text: str) -> dict:
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


def _add_chat_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chat", "chat models (Qwen3.6-27B among them) and their drafters were trained on "
                                     "chat-formatted text: --chat sends the prompt through the tokenizer's chat template")
    g.add_argument("--chat", action="store_true",
                   help="apply the tokenizer's chat template: the prompt is the user's message (or the messages of a "
                        "JSON --prompt-file), then the assistant's turn is opened")
    g.add_argument("--system", metavar="TEXT", help="a system prompt, first in the conversation (with --chat)")
    g.add_argument("--thinking", choices=("on", "off"),
                   help="the template's thinking switch (enable_thinking, as in Qwen3/3.5/3.6 templates), with --chat; "
                        "default: the template's own default")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None


def _add_sampling_args(p: argparse.ArgumentParser, several: bool = False) -> None:
    g = p.add_argument_group("sampling", "the target's choice at each position: greedy (temperature 0) or a sample "
                                         "drawn with noise keyed by (seed, position), so plain decoding and the tree "
                                         "walk still agree token for token (docs/SAMPLING.md)")
    if several:
        g.add_argument("--temperature", type=_number, nargs="+", default=[0.0], metavar="T",
                       help="one or more temperatures, each measured on the same prompts (e.g. 0 0.7 1.0); "
                            "0 = greedy (default)")
    else:
        g.add_argument("--temperature", type=_number, default=0.0, metavar="T", help="0 = greedy (default)")
    g.add_argument("--top-k", type=whole_number, default=0, metavar="K",
                   help="sample among the K most likely tokens only (default: 0, off)")
    g.add_argument("--top-p", type=_number, default=1.0, metavar="P",
                   help="sample among the most likely tokens holding probability P (default: 1, off)")
    g.add_argument("--seed", type=whole_number, default=0, metavar="S", help="noise seed, 0..2^32-1 (default: 0)")


def build_parser(prog: str = "python -m ddtree_viz") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="ddtree-viz: debug and visualise DDTree speculative decoding on hybrid (Gated DeltaNet + attention) targets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="decode one prompt and compare with the target's greedy output",
                         description="Decode one prompt with DDTree (or DFlash), print the text, tokens per round, "
                                     "mean acceptance and whether the output equals the target's own decoding "
                                     "(greedy, or sampled with the same seed).")
    source = run.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="text to continue (with --chat: the user's message)")
    source.add_argument("--prompt-file", metavar="FILE",
                        help="the prompt from a UTF-8 file: plain text, or a JSON list of messages "
                             "[{\"role\": \"user\", \"content\": \"...\"}, ...] (with --chat)")
    _add_chat_args(run)
    _add_model_args(run)
    _add_decode_args(run)
    run.add_argument("--verify", default="exact", choices=VERIFY_MODES,
                     help="exact (tree-exact GDN) or naive (the known-wrong flattened-tree behaviour); default: exact")
    run.add_argument("--method", default="ddtree", choices=METHODS,
                     help="ddtree (draft tree) or dflash (top-1 chain); default: ddtree")
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
    run.add_argument("--compare", metavar="KEY=VALUE[,...]", type=_compare_spec,
                     help="also decode the prompt with a second configuration B, the first one's settings changed as "
                          "given (keys: " + ", ".join(COMPARE_KEYS) + "; e.g. verify=naive, method=dflash, "
                          "budget=16); print both outputs, where they part and each verdict; --trace writes both")
    run.add_argument("--target-top-k", type=whole_number, default=5, metavar="K",
                     help="the target's top-K tokens recorded at every tree node (default: 5; 0: none)")
    run.add_argument("--draft-top-k", type=whole_number, default=16, metavar="K",
                     help="the drafter's candidates recorded per depth, at most the budget (default: 16; 0: none)")
    _add_sampling_args(run)
    run.set_defaults(handler=cmd_run)

    bench = sub.add_parser("bench", help="tokens/s of greedy, DFlash and DDTree on the same prompts",
                           description="Measure plain greedy decoding, DFlash (chain) and DDTree (exact) side by side. "
                                       "Each method is timed from the start of prefill to the last generated token, "
                                       "after one untimed warm-up. With --temperature T1 T2 ... every method samples "
                                       "(same seed) at each temperature in turn, on the same prompts.")
    bench.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                       help="a prompt (repeat for several; default: a few Python code openings)")
    bench.add_argument("--prompt-file", action="append", dest="prompt_files", metavar="FILE",
                       help="a prompt from a file: plain text or a JSON list of messages (repeat for several; after "
                            "the --prompt ones)")
    _add_chat_args(bench)
    _add_model_args(bench)
    _add_decode_args(bench)
    bench.add_argument("--repeats", type=whole_number, default=1, help="timed runs per prompt and method (default: 1)")
    bench.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    bench.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                       help="engine of the DFlash and DDTree runs: auto (default: the fastest exact engine that "
                            "applies, as run and the page use), transformers (the reference path) or runner")
    bench.add_argument("--runner", action="store_true",
                       help="also time greedy and DDTree through the static runner (preallocated state; CUDA graphs on a "
                            "GPU), Qwen3.5 hybrid targets on one device")
    _add_sampling_args(bench, several=True)
    bench.set_defaults(handler=cmd_bench)

    _add_export_parser(sub)
    _add_replay_parser(sub)
    _add_analyze_parser(sub)

    # The web UI parses its own options (ddtree_viz/web.py: build_parser, the options of app.py, defined once):
    # main() hands it every argument after `app`, `--help` included.
    app = sub.add_parser("app", add_help=False,
                         help="the web UI: step through DDTree in the browser (the options of app.py; `app --help`)")
    app.set_defaults(handler=cmd_app)
    return parser


def _add_analyze_parser(sub) -> None:
    an = sub.add_parser(
        "analyze", help="decode a prompt set; one summary and one self-contained report of where drafts diverge",
        description="Decode every prompt of FILE (plain text, one prompt per blank-line-separated block; or JSONL with "
                    "{'prompt': ...} per line; or a shipped set: heldout-code, docstring-first, instructions), write "
                    "one trace per prompt (DIR/traces/NNNN.json), DIR/summary.json, DIR/report.html and its figures. "
                    "Several processes: accelerate launch --num_processes N -m ddtree_viz analyze ... splits the "
                    "prompts; the main process merges.")
    an.add_argument("--prompts", required=True, metavar="FILE", help="the prompt file (or a shipped set's name)")
    an.add_argument("--out", required=True, metavar="DIR", help="the output directory")
    mode = an.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="DIR exists: skip the prompts whose traces exist")
    mode.add_argument("--force", action="store_true", help="DIR exists: start again (its traces and report are removed)")
    an.add_argument("--chat", action="store_true",
                    help="apply the target's chat template: a text prompt is the user's message, JSONL 'messages' the "
                         "conversation")
    an.add_argument("--system", metavar="TEXT", help="a system prompt, first in every conversation (with --chat)")
    an.add_argument("--thinking", choices=("on", "off"), help="the template's thinking switch, with --chat")
    an.add_argument("--budgets", type=whole_number, nargs="+", metavar="B",
                    help="the budget curve at these budgets (default: every budget up to --budget)")
    an.add_argument("--method", default="ddtree", choices=("ddtree", "dflash", "both"),
                    help="default: ddtree; both: every prompt with DDTree (traces/NNNN.json) and with the DFlash chain "
                         "(traces/NNNN.dflash.json), the same settings otherwise; summary.json's 'dflash' holds the "
                         "chain's figures")
    _add_model_args(an)
    _add_decode_args(an)
    _add_sampling_args(an)
    an.set_defaults(handler=cmd_analyze)


def cmd_analyze(args) -> int:
    from .analyze import cmd_analyze as run

    return run(args)



# The export choices, spelled out so that building the parser imports no renderer (plotly, matplotlib): `run`
# stays quick to start. tests/test_export.py holds them equal to ddtree_viz.render.export's.
FORMATS = ("svg", "pdf", "png", "tikz", "html", "json")
FIGURES = ("tree", "mask", "acceptance", "grid")
SHOW_CHOICES = ("text", "ids", "both")
SCHEME_NAMES = ("colorblind", "grayscale")
COLOR_RANGES = ("trace", "round")
PHASES = ("drafted", "verified")
DEFAULT_DPI = 300


def _add_export_parser(sub) -> None:
    ex = sub.add_parser(
        "export", help="one round of a saved trace as SVG, PDF, PNG, TikZ, HTML or JSON (no model needed)",
        description="Export one round of a saved trace: the draft tree (or the verify mask, or tokens per round) as a "
                    "vector figure for a paper (SVG, PDF, TikZ), a PNG, a self-contained interactive HTML page, or the "
                    "round's record as JSON. The figure is drawn from the same layout the web page uses.")
    ex.add_argument("--trace", required=True, metavar="FILE.json", help="a trace written by `run --trace` or the page")
    ex.add_argument("--step", default="last", metavar="K|last",
                    help="the round as the page numbers it, from 1 ('Round 1 of N'), or 'last' (default: last)")
    ex.add_argument("--format", choices=FORMATS, help="default: from the --out suffix (.svg .pdf .png .tex .html .json)")
    ex.add_argument("--out", required=True, metavar="FILE", help="the file to write ('-': standard output)")
    g = ex.add_argument_group("what to draw")
    g.add_argument("--figure", default="tree", choices=FIGURES,
                   help="tree (default), mask (the verify pass's attention mask), acceptance (tokens per round, rounds "
                        "1..K) or grid (the drafter's depth x rank log-probs the tree was built from)")
    g.add_argument("--phase", default="verified", choices=PHASES,
                   help="verified (default: accepted path, bonus) or drafted (the tree before verification)")
    g.add_argument("--show", default="text", choices=SHOW_CHOICES, help="node labels: token text (default), ids, or both")
    g.add_argument("--colors", default="colorblind", choices=SCHEME_NAMES,
                   help="colorblind (default: the page's colour-blind-safe colours) or grayscale (print)")
    g.add_argument("--min-logprob", type=float, metavar="X",
                   help="hide drafted nodes whose drafter log-prob is below X (and their subtrees; never the accepted path)")
    g.add_argument("--max-depth", type=whole_number, metavar="D",
                   help="hide drafted nodes deeper than D (never the accepted path)")
    g.add_argument("--path-label", action=argparse.BooleanOptionalAction, default=True,
                   help="write 'accepted path' along the path (default: on)")
    g.add_argument("--ranks", action=argparse.BooleanOptionalAction, default=True,
                   help="the drafter's rank (r0, r1, ...) under each node (default: on)")
    g.add_argument("--legend", action=argparse.BooleanOptionalAction, default=True,
                   help="marker legend and colour bar / key (default: on)")
    t = g.add_mutually_exclusive_group()
    t.add_argument("--title", metavar="TEXT", help="title (default: the page's title for this figure)")
    t.add_argument("--no-title", action="store_true", help="no title")
    g.add_argument("--caption", metavar="TEXT", help="a caption under the figure (default: none)")
    g.add_argument("--label-chars", type=whole_number, metavar="N", help="cut token labels to N characters (default: 12; mask 8)")
    g.add_argument("--color-range", default="trace", choices=COLOR_RANGES,
                   help="log-prob colour range: trace (default: the page's, min over all rounds .. 0) or round (this round's)")
    f = ex.add_argument_group("output")
    f.add_argument("--dpi", type=whole_number, help=f"PNG resolution (default: {DEFAULT_DPI}, lowered for a figure so large "
                   "that its PNG would pass 30 million pixels; an explicit --dpi may reach 120 million)")
    f.add_argument("--width", type=float, metavar="INCHES", help="figure width (default: sized to the figure); "
                   "a PNG is exactly round(width x dpi) pixels wide")
    f.add_argument("--height", type=float, metavar="INCHES", help="figure height (default: sized to the figure)")
    f.add_argument("--standalone", action="store_true",
                   help="TikZ: a whole LaTeX document that compiles alone (default: a tikzpicture to \\input)")
    ex.set_defaults(handler=cmd_export)


def _add_replay_parser(sub) -> None:
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
    rp.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    rp.add_argument("--port", type=port_number, default=7860, help="default: 7860")
    rp.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")
    rp.set_defaults(handler=cmd_replay)


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
    check_decode_settings(args.budget, args.max_new_tokens, args.block_size)
    for t in args.temperature if isinstance(args.temperature, list) else [args.temperature]:
        _sampler(args, t)


def _sampler(args, temperature: float):
    from .engine.sampling import Sampler

    return Sampler(temperature, args.top_k, args.top_p, args.seed)


def _load(args):
    from .engine.models import check_embedded, load_pair

    _check_settings(args)
    _quiet_transformers(args.verbose)
    if args.target is None:
        check_embedded(draft_too=args.draft is None)
    return load_pair(args.target, args.draft, dtype=args.dtype, device=args.device)


def _spec(args, text: str | None = None, path: str | None = None):
    """The PromptSpec of one prompt given on the command line (text or file) with the chat options; checked
    before any model is loaded."""
    from .engine.prompts import PromptSpec, check_spec, parse_thinking, spec_from_file

    options = dict(chat=args.chat, system=args.system, thinking=parse_thinking(args.thinking))
    if path is not None:
        return spec_from_file(path, **options)
    return check_spec(PromptSpec(text=text, **options))


def _describe_prompt(spec, encoded) -> str:
    """One line on how the prompt went in: raw text, or templated (system prompt, messages, thinking)."""
    if not spec.chat:
        return f"prompt: raw text, {len(encoded.ids)} tokens"
    turns = spec.conversation()
    thinking = "template default" if spec.thinking is None else ("on" if spec.thinking else "off")
    return (f"prompt: chat template on, {len(turns)} message{'s' * (len(turns) != 1)} "
            f"({', '.join(t['role'] for t in turns)}), thinking {thinking}, {len(encoded.ids)} tokens")


def _token(session, token_id: int) -> str:
    return f"{session.token_text(token_id)!r} ({token_id})"


# ------------------------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------------------------


def cmd_run(args) -> int:
    from .engine.session import DecodeSession

    from .engine.prompts import encode

    spec = _spec(args, args.prompt, args.prompt_file)  # the prompt's text checked (valid Unicode) before loading
    other = _other_config(args) if args.compare else None
    if args.trace:
        check_output_path(args.trace, "trace file")
    pair = _load(args)
    encoded = encode(pair.tokenizer, spec)
    session = DecodeSession(pair, budget=args.budget, max_new_tokens=args.max_new_tokens, verify=args.verify,
                            method=args.method, block_size=args.block_size, engine=args.engine,
                            sampler=_sampler(args, args.temperature), target_top_k=args.target_top_k,
                            draft_top_k=args.draft_top_k, reference=args.reference)
    print(pair.describe())
    print(pair.parameters_line())
    method = "DDTree" if args.method == "ddtree" else "DFlash (chain)"
    shape = f"budget {session.budget}, " if args.method == "ddtree" else ""
    chosen = " (auto: the fastest exact engine for this target)" if args.engine == "auto" else ""
    print(f"{method}, {shape}block size {session.block_size}, max new tokens {session.max_new_tokens}, verify {args.verify}, "
          f"engine {session.engine}{chosen}")
    if not session.sampler.greedy:
        print(f"{sampling_label(session.settings)}: position-keyed noise {session.sampler.settings['noise']} "
              "(docs/SAMPLING.md); compared with the target's own sampling, same seed")
    if args.verify == "naive":
        print("NAIVE verification: the known-wrong flattened-tree behaviour (GDN layers run the tree as one chain; "
              "rejected branches leak into the state). Output may differ from greedy; shown to reproduce the bug.")

    print(_describe_prompt(spec, encoded))
    session.prefill(spec=spec)
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
    _print_session_analysis(records, session.block_size, session.method)

    if args.no_greedy:
        print("greedy comparison skipped (--no-greedy)")
    else:
        print(_greedy_line(session, args.verify))
        print(_reference_line(session))

    saved = session.to_trace(with_greedy=not args.no_greedy)
    if other is not None:
        saved = _run_compare(args, pair, session, saved, other)
    if args.trace:
        path = Path(args.trace)
        try:
            saved.save(path)
        except OSError as exc:
            raise InputError(f"cannot write trace file {path}: {exc.strerror or exc}") from None
        print(f"{'compare trace' if other is not None else 'trace'} written to {path}")
    return 0


def _other_config(args) -> dict:
    """Configuration B of `run --compare`: A's settings with the given changes, checked before any model loads."""
    c = {"budget": args.budget, "block_size": args.block_size, "method": args.method, "verify": args.verify,
         "engine": args.engine, "dtype": args.dtype, **args.compare}
    for key, allowed in (("method", METHODS), ("verify", VERIFY_MODES), ("engine", ENGINE_CHOICES),
                         ("dtype", DTYPES)):
        if c[key] not in allowed:
            raise InputError(f"--compare {key} must be one of {', '.join(allowed)}, not {c[key]!r}")
    if "engine" not in args.compare:  # A's engine where it runs B's verify mode (naive: transformers' forward only)
        c["engine"] = engine_for_verify(c["engine"], c["verify"])
    return c


def _run_compare(args, pair, session, trace_a, c: dict):
    """`run --compare`: decode the prompt again with configuration B, print it beside A, return both recorded."""
    from .analysis import config_label
    from .engine.models import load_pair
    from .engine.session import DecodeSession
    from .trace import CompareTrace

    pair_b = pair if c["dtype"] == args.dtype else load_pair(args.target, args.draft, dtype=c["dtype"],
                                                              device=args.device)
    other = DecodeSession(pair_b, budget=c["budget"], max_new_tokens=args.max_new_tokens, verify=c["verify"],
                          method=c["method"], block_size=c["block_size"], engine=c["engine"], sampler=session.sampler,
                          target_top_k=args.target_top_k, draft_top_k=args.draft_top_k)
    other.prefill(args.prompt)
    records = other.run()
    trace_b = other.to_trace(with_greedy=not args.no_greedy)
    print()
    print(f"B: {config_label(trace_b.settings)}")
    print(_printable(other.prompt) + _printable(other.output_text))
    print(f"rounds: {len(records)}  tokens per round: {' '.join(str(r.acceptance) for r in records) or '-'}")
    print(f"mean acceptance: {other.mean_acceptance:.2f} tokens per target forward (bonus included)")
    _print_session_analysis(records, other.block_size, other.method)
    if not args.no_greedy:
        print(_greedy_line(other, c["verify"]))
    print()
    _print_compare(trace_a, trace_b)
    return CompareTrace(trace_a, trace_b)


def _print_compare(a, b) -> None:
    from .analysis import compare_outputs, config_label

    c = compare_outputs(a, b)
    print(f"compare: A = {config_label(a.settings)}; B = {config_label(b.settings)}")
    if c["part_at"] is None:
        print(f"outputs identical for {c['agree_upto']} tokens")
    else:
        i = c["part_at"]
        print(f"outputs part at generated token {i}: A {_texts(a, [c['a_token_id']])!r} ({c['a_token_id']}) vs "
              f"B {_texts(b, [c['b_token_id']])!r} ({c['b_token_id']})")
    for name, side in (("A", c["a"]), ("B", c["b"])):
        verdict = ("reference not recorded" if side["identical"] is None else "identical to its reference"
                   if side["identical"] else f"DIVERGES from its reference at token {side['first_divergence']}")
        mean = "-" if side["mean_acceptance"] is None else f"{side['mean_acceptance']:.2f}"
        print(f"  {name}: {side['rounds']} rounds, {side['tokens']} tokens, mean acceptance {mean}: {verdict}")


def _print_session_analysis(steps, block_size, method: str) -> None:
    """The session's acceptance by depth and the budget that would have done (ddtree_viz.analysis)."""
    from . import analysis
    from .render.budget_view import budget_line, rates_line

    if not steps:
        return
    hist = analysis.acceptance_histogram(steps, block_size)
    print("acceptance histogram (rounds with 0, 1, 2, ... accepted drafts): " + " ".join(map(str, hist)))
    print("per-depth acceptance P(accepted >= d | accepted >= d-1, tree depth >= d): "
          + rates_line(analysis.per_depth_acceptance(steps, block_size)))
    unit = "chain length" if method == "dflash" else "budget"
    exact = "" if all(analysis.curve_is_exact(s) for s in steps) else " [naive verify: the same choices only]"
    print(f"session {unit} curve ({unit}:tokens gained, where it steps up){exact}: "
          + budget_line(analysis.session_budget_curve(steps)))
    print("  " + analysis.curve_caveat(method))


def _reference(settings: dict) -> tuple[str, str, str]:
    """How the CLI names the reference: (what the output is compared with, its short name, its margin)."""
    if not is_sampled(settings):
        return "greedy", "greedy", "greedy top-2 logit margin"
    return ("the target's own sampling (same seed)", "sampling",
            "sampling decision margin (top-2 gap of logits/T + noise)")


def _greedy_line(session, verify: str) -> str:
    label = " (naive verification, known-wrong)" if verify == "naive" else ""
    what, who, gap = _reference(session.settings)
    greedy = session.greedy()
    index, margin = session.divergence()
    if index is None:
        return f"output identical to {what} for {len(session.generated)} tokens{label}"
    ours = _token(session, session.generated[index]) if index < len(session.generated) else "(ended)"
    theirs = _token(session, greedy.ids[index]) if index < len(greedy.ids) else "(ended)"
    where = f"DIVERGES from {what} at generated token {index}{label}: {session.method} {ours} vs {who} {theirs}"
    where += f", {gap} {margin:.4g}" if margin is not None else ""
    check = session.divergence_check()
    return where + f"\nverdict: {verdict_words(check.verdict, check.margin, check.noise, check.noise_positions)}"


def _reference_line(session) -> str:
    """Where the reference ran, its time (apart from the rounds'), and the noise it measured."""
    check = session.divergence_check()
    noise = ("no numerical noise measured (no stretch of two or more tokens)" if check.noise is None else
             f"numerical noise {check.noise:.3g} (max |multi-position - one-token margin| over {check.noise_positions} "
             "positions)")
    drift = "" if check.drift is None else f"; tree-pass drift {check.drift:.3g} over {check.drift_positions} positions"
    return (f"reference: {REFERENCE_NAMES.get(session.reference, session.reference)}, "
            f"{session.greedy_seconds * 1e3:.0f} ms (not in the rounds' time); {noise}{drift}")


# ------------------------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------------------------


def cmd_bench(args) -> int:
    from .benchmarks.decode import run_sweep, sweep_dict

    if args.prompts is not None and any(p == "" for p in args.prompts):
        raise InputError("a --prompt is empty: every prompt needs some text")
    prompts = None
    if args.prompts is not None or args.prompt_files is not None or args.chat:
        from .prompts import DEFAULT_PROMPTS

        texts = args.prompts if args.prompts is not None else ([] if args.prompt_files else list(DEFAULT_PROMPTS))
        prompts = [_spec(args, text=t) for t in texts] + [_spec(args, path=f) for f in args.prompt_files or ()]
    else:
        _spec(args, text="-")  # --system / --thinking without --chat: the same error as run's
    if args.json:
        check_output_path(args.json, "JSON file")
    pair = _load(args)
    print(pair.describe())
    results = run_sweep(pair, prompts, args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                        budget=args.budget, max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                        repeats=args.repeats, runner=args.runner, engine=args.engine,
                        progress=lambda text: print(f"  ... {text}", file=sys.stderr, flush=True))
    s = results[0].settings
    print(f"budget {s['budget']}, block size {s['block_size']}, max new tokens {s['max_new_tokens']}, repeats {s['repeats']}, "
          f"{s['torch_threads']} torch threads; dflash and ddtree on the {s['engine']} engine")
    print("timed: start of prefill to last generated token, after one untimed warm-up per method")
    if args.chat:
        thinking = "template default" if args.thinking is None else args.thinking
        print(f"prompts: through the chat template as user messages, thinking {thinking}"
              + (", with the system prompt" if args.system else ""))
    for result in results:
        _print_bench(result, args.runner, several=len(results) > 1)
    if len(results) > 1:
        _print_sweep(results)

    if args.json:
        path = Path(args.json)
        try:
            path.write_text(json.dumps(sweep_dict(results), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"figures written to {path}")
    return 0


def _print_bench(result, runner: bool, several: bool) -> None:
    """One temperature's figures. At T > 0 plain decoding samples (same seed): its rows read "sampling"."""
    _, who, _ = _reference(result.settings)
    name = lambda m: m.replace("greedy", who)  # noqa: E731
    print()
    if several or who != "greedy":
        print(f"== {sampling_label(result.settings)} ==")
    for i, p in enumerate(result.prompts):
        head = p.prompt if len(p.prompt) <= 40 else p.prompt[:37] + "..."
        print(f"prompt {i + 1}: {head!r} ({p.prompt_tokens} tokens)")
        for m in p.runs:
            line = f"  {name(m):<13} {p.tokens(m):>5} tok {p.seconds(m):>8.2f} s {p.tok_s(m):>9.1f} tok/s"
            if m != "greedy":
                div = p.divergence(m)
                same = f"identical to {who}" if div is None else f"DIVERGES from {who} at token {div}"
                acc = "" if m.endswith("greedy") else f"  acceptance {p.mean_acceptance(m):.2f}"
                line += f"  x{_ratio(p.tok_s(m), p.tok_s('greedy')):.2f}{acc}  {same}"
            print(line)
    print()
    print(f"{'overall':<14} {'tok/s':>9}  {'vs ' + who:>11}  {'mean acceptance':>15}  identical to {who}")
    for m in result.prompts[0].runs:
        same = "yes" if result.identical_to_greedy(m) else "NO"
        if m == "greedy":
            print(f"{name(m):<14} {result.tok_s(m):>9.1f}  {'1.00x':>11}  {'-':>15}  -")
        elif m == "runner-greedy":
            print(f"{name(m):<14} {result.tok_s(m):>9.1f}  {result.speedup(m):>10.2f}x  {'-':>15}  {same}")
        else:
            print(f"{name(m):<14} {result.tok_s(m):>9.1f}  {result.speedup(m):>10.2f}x  {result.mean_acceptance(m):>15.2f}  {same}")
    if runner:
        ratio = _ratio(result.tok_s("runner-ddtree"), result.tok_s("runner-greedy"))
        print(f"{name('runner-ddtree')} vs {name('runner-greedy')}: {ratio:.2f}x (both through the static runner)")


def _print_sweep(results) -> None:
    """The temperatures side by side: acceptance drops as the target's choices get less predictable."""
    print()
    print(f"{'temperature':>11}  {'ddtree acceptance':>17}  {'dflash acceptance':>17}  {'ddtree speedup':>14}  identical")
    for r in results:
        same = "yes" if r.identical_to_greedy("dflash") and r.identical_to_greedy("ddtree") else "NO"
        print(f"{r.settings['temperature']:>11g}  {r.mean_acceptance('ddtree'):>17.2f}  {r.mean_acceptance('dflash'):>17.2f}  "
              f"{r.speedup('ddtree'):>13.2f}x  {same}")


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


# ------------------------------------------------------------------------------------------------------------
# export
# ------------------------------------------------------------------------------------------------------------


def _load_trace(path: str):
    from .trace import Trace

    return Trace.load(path)  # TraceError (missing, corrupt, newer schema) -> `error: ...`, exit 2


def cmd_export(args) -> int:
    from .render.export import ExportOptions, export_figure, format_for, resolve_round

    fmt = format_for(args.out, args.format)
    options = ExportOptions(
        figure=args.figure, phase=args.phase, show=args.show, colors=args.colors, min_logprob=args.min_logprob,
        max_depth=args.max_depth, path_label=args.path_label, ranks=args.ranks, legend=args.legend, title=args.title,
        show_title=not args.no_title, caption=args.caption, label_chars=args.label_chars, color_range=args.color_range,
        dpi=args.dpi, width=args.width, height=args.height, standalone=args.standalone,
    )
    if args.out != "-":
        check_output_path(args.out, "export file")
    trace = _load_trace(args.trace)
    k = resolve_round(trace, args.step)
    data = export_figure(trace, k + 1, fmt, options)
    if args.out == "-":
        if fmt in ("pdf", "png") and sys.stdout.isatty():
            raise InputError(f"not writing {fmt.upper()} bytes to a terminal: pass --out FILE or redirect standard output")
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    path = Path(args.out)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    size = ""
    if fmt == "png":
        size = ", {} x {} px".format(*png_size(data))
    print(f"{fmt} of the {args.figure} of round {k + 1} of {len(trace.steps)} written to {path} ({len(data)} bytes{size})")
    return 0


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# ------------------------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------------------------


def cmd_replay(args) -> int:
    from .trace import CompareTrace, load_any

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
                from .render.export import resolve_round

                print_round(trace, resolve_round(trace, args.round_detail))
            if name is not None:
                print()
        if isinstance(loaded, CompareTrace):
            _print_compare(loaded.a, loaded.b)
        return 0
    check_port(args.host, args.port)  # before gradio loads: a port in use is a clear error, not a traceback
    from .page.web import app as web  # imports gradio: only here, so the other commands start quickly

    argv = ["--replay", str(args.trace), "--host", args.host, "--port", str(args.port)] + (["--share"] if args.share else [])
    return web.main(argv)


# ------------------------------------------------------------------------------------------------------------
# app
# ------------------------------------------------------------------------------------------------------------


def cmd_app(args) -> int:
    from .page.web import app as web

    return web.main(args.app_args, prog=f"{args.prog} app")


def _texts(trace, ids) -> str:
    return "".join(trace.token_texts.get(str(i), f"<{i}>") for i in ids)


def print_trace_summary(trace, path) -> None:
    """The rounds of a trace as text: the settings (sampling ones with the `run` options that reproduce them), per
    round the tokens gained, the tree, the text added; then the output and whether it equals the target's own
    decoding (greedy, or sampled with the same seed)."""
    from .render.prompt_view import prompt_summary
    from .render.stats_view import stats_summary

    s = trace.settings
    summary = stats_summary(trace)
    print(f"trace {path} (schema_version {trace.schema_version})")
    print(f"target {_printable(trace.target)}, draft {_printable(trace.draft)}")
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
          f"{'-' if mean is None else f'{mean:.2f}'} tokens per target forward (bonus included)")
    print(f"{'round':>5}  {'tokens':>6}  {'accepted':>8}  {'tree':>4}  {'committed':>9}  text added")
    for st in trace.steps:
        added = st.new_token_ids or tuple(st.nodes[i].token_id for i in st.accepted[1:]) + (st.bonus_token_id,)
        print(f"{st.index + 1:>5}  {st.acceptance:>6}  {f'{st.acceptance - 1}+bonus':>8}  {len(st.nodes):>4}  "
              f"{st.committed_len:>9}  {_texts(trace, added)!r}")
    _print_session_analysis(trace.steps, s.get("block_size"), s.get("method", "ddtree"))
    text = trace.output_text or _texts(trace, trace.output_ids)
    print(f"output: {text!r}")
    what, who, gap = _reference(s)
    if trace.greedy_ids is None:
        print(f"{who} reference not recorded (--no-greedy)")
    elif trace.first_divergence is None:
        print(f"output identical to {what} for {len(trace.output_ids)} tokens")
    else:
        i = trace.first_divergence
        ours = trace.output_ids[i] if i < len(trace.output_ids) else None
        theirs = trace.greedy_ids[i] if i < len(trace.greedy_ids) else None
        a = "(ended)" if ours is None else f"{_texts(trace, [ours])!r} ({ours})"
        b = "(ended)" if theirs is None else f"{_texts(trace, [theirs])!r} ({theirs})"
        margin = f", {gap} {trace.divergence_margin:.4g}" if trace.divergence_margin is not None else ""
        print(f"DIVERGES from {what} at generated token {i}: {a} vs {who} {b}{margin}")
        print(f"verdict: {verdict_text(trace)}")
    if trace.greedy_ids is not None:
        print(f"reference: {REFERENCE_NAMES.get(reference_of(s), reference_of(s))}"
              + (f", {trace.reference_ms:.0f} ms" if trace.reference_ms else ""))


def _tok(trace, token_id) -> str:
    return f"{_texts(trace, [token_id])!r}({token_id})"


def print_round(trace, k: int) -> None:
    """One round in full: where and why the walk stopped, the budget curve, the drafter's grid and every node
    with the target's view (ddtree_viz.analysis: stop_info, node_info), as `replay --print --round K` shows it."""
    from . import analysis
    from .render.budget_view import budget_line

    st = trace.steps[k]
    print()
    print(f"round {k + 1} of {len(trace.steps)}: committed length {st.committed_len}, {len(st.nodes)} tree positions, "
          f"accepted path {list(st.accepted)} = {st.acceptance - 1} drafts + bonus")
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
    unit = "chain length" if st.method == "dflash" else "budget"
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


# ------------------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    prog = "ddtree-viz" if Path(sys.argv[0]).stem == "ddtree-viz" else "python -m ddtree_viz"
    parser = build_parser(prog)
    args, rest = parser.parse_known_args(argv)
    if args.command == "app":
        args.app_args, args.prog = rest, prog  # the web UI's own parser reads them
    elif rest:
        parser.parse_args(argv)  # argparse's own "unrecognized arguments" message and exit status 2
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

"""`bench`: tokens/s of plain decoding, the DFlash chain and DDTree on the same prompts (ddtree_viz/benchmarks/decode.py
measures), printed per prompt and overall, at one or more temperatures; --json writes the figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import InputError
from ..words import plural
from ..options import ENGINE_CHOICES, whole_number
from ..trace import sampling_label
from .common import (add_chat_args, add_decode_args, add_model_args, add_sampling_args, check_output_path,
                     load_models, prompt_spec)
from .show import reference_words


def add_parser(sub) -> None:
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
    add_chat_args(bench)
    add_model_args(bench)
    add_decode_args(bench)
    bench.add_argument("--repeats", type=whole_number, default=1, help="timed runs per prompt and method (default: 1)")
    bench.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    bench.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                       help="engine of the DFlash and DDTree runs: auto (default: the fastest exact engine that "
                            "applies, as run and the page use), transformers (the reference path) or runner")
    bench.add_argument("--runner", action="store_true",
                       help="also time greedy and DDTree through the static runner (preallocated state; CUDA graphs on a "
                            "GPU), Qwen3.5 hybrid targets on one device")
    add_sampling_args(bench, several=True)
    costs = bench.add_argument_group("costs (docs/SPEEDUP.md)")
    costs.add_argument("--costs", action="store_true",
                       help="instead: the cost table of a round at each budget (draft, tree, verify, commit, host), the "
                            "chain's round and greedy's step on --engine, measured on the first prompt and cached "
                            "(~/.cache/ddtree-viz/costs.json) for analyze's speed-up study")
    costs.add_argument("--budgets", type=whole_number, nargs="+", metavar="B",
                       help="with --costs: the budgets (default: powers of two up to --budget, and it)")
    costs.add_argument("--cost-rounds", type=whole_number, default=8, metavar="N",
                       help="with --costs: rounds timed per budget (default 8; medians)")
    bench.set_defaults(handler=command)


def command(args) -> int:
    from ..benchmarks.decode import run_sweep, sweep_dict

    if args.prompts is not None and any(p == "" for p in args.prompts):
        raise InputError("a --prompt is empty: every prompt needs some text")
    prompts = None
    if args.prompts is not None or args.prompt_files is not None or args.chat:
        from ..prompts import DEFAULT_PROMPTS

        texts = args.prompts if args.prompts is not None else ([] if args.prompt_files else list(DEFAULT_PROMPTS))
        prompts = [prompt_spec(args, text=t) for t in texts] + [prompt_spec(args, path=f) for f in args.prompt_files or ()]
    else:
        prompt_spec(args, text="-")  # --system / --thinking without --chat: the same error as run's
    if args.json:
        check_output_path(args.json, "JSON file")
    pair = load_models(args)
    print(pair.describe())
    if args.costs:
        return _costs(args, pair, prompts)
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
        _write_json(Path(args.json), sweep_dict(results))
    return 0


def _print_bench(result, runner: bool, several: bool) -> None:
    """One temperature's figures. At T > 0 plain decoding samples (same seed): its rows read "sampling"."""
    _, who, _ = reference_words(result.settings)
    name = lambda m: m.replace("greedy", who)  # noqa: E731
    print()
    if several or who != "greedy":
        print(f"== {sampling_label(result.settings)} ==")
    for i, p in enumerate(result.prompts):
        head = p.prompt if len(p.prompt) <= 40 else p.prompt[:37] + "..."
        print(f"prompt {i + 1}: {head!r} ({plural(p.prompt_tokens, 'token')})")
        for m in p.runs:
            line = f"  {name(m):<15} {p.tokens(m):>5} tok {p.seconds(m):>8.2f} s {p.tok_s(m):>9.1f} tok/s"
            if m != "greedy":
                div = p.divergence(m)
                same = f"identical to {who}" if div is None else f"DIVERGES from {who} at token {div}"
                acc = "" if m.endswith("greedy") else f"  acceptance {p.mean_acceptance(m):.2f}"
                line += f"  x{_ratio(p.tok_s(m), p.tok_s('greedy')):.2f}{acc}  {same}"
            print(line)
    print()
    print(f"{'overall':<16} {'tok/s':>9}  {'vs ' + who:>11}  {'mean acceptance':>15}  identical to {who}")
    for m in result.prompts[0].runs:
        same = "yes" if result.identical_to_greedy(m) else "NO"
        if m == "greedy":
            print(f"{name(m):<16} {result.tok_s(m):>9.1f}  {'1.00x':>11}  {'-':>15}  -")
        elif m == "runner-greedy":
            print(f"{name(m):<16} {result.tok_s(m):>9.1f}  {result.speedup(m):>10.2f}x  {'-':>15}  {same}")
        else:
            print(f"{name(m):<16} {result.tok_s(m):>9.1f}  {result.speedup(m):>10.2f}x  {result.mean_acceptance(m):>15.2f}  {same}")
    for m in result.prompts[0].runs:
        for reason in result.degenerate(m):
            print(f"warning: {name(m)} output looks degenerate, {reason}: its tokens/s is no speed-up")
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


def _costs(args, pair, prompts) -> int:
    """bench --costs: the cost table (engine/costs.py), printed, cached, and with --json written."""
    from ..engine.costs import measure_costs
    from ..engine.prompts import PromptSpec, encode
    from ..prompts import DEFAULT_PROMPTS
    from ..promptset.speedup import budget_grid
    from ..speedup import PHASES, save_costs

    spec = prompts[0] if prompts else PromptSpec(text=DEFAULT_PROMPTS[0])
    ids = list(encode(pair.tokenizer, spec).ids)
    table = measure_costs(pair, ids, args.budgets or budget_grid(args.budget), engine=args.engine,
                          block_size=args.block_size, rounds=args.cost_rounds,
                          progress=lambda text: print(f"  ... {text}", file=sys.stderr, flush=True))
    print(f"costs on {table.device_name} ({table.engine} engine), block size {table.block_size}, "
          f"means of {plural(args.cost_rounds, 'round')} a context; greedy step {table.greedy_ms:.3f} ms; first ms: "
          "a decode's first round, after its prefill")
    print(f"{'budget':>7}  " + "  ".join(f"{p:>8}" for p in PHASES) + f"  {'round ms':>9}  {'x greedy':>8}"
          f"  {'first ms':>9}")
    named = [(str(b), c) for b, c in sorted(table.rounds.items())] + ([("chain", table.chain)] if table.chain else [])
    for label, c in named:
        print(f"{label:>7}  " + "  ".join(f"{getattr(c, p):>8.3f}" for p in PHASES)
              + f"  {c.total:>9.3f}  {c.total / table.greedy_ms:>7.2f}x  {c.first:>9.3f}")
    try:
        print(f"cached in {save_costs(table)}")
    except OSError as exc:
        print(f"not cached: {exc.strerror or exc}", file=sys.stderr)
    if args.json:
        _write_json(Path(args.json), table.to_dict())
    return 0


def _write_json(path: Path, obj) -> None:
    try:
        path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"figures written to {path}")

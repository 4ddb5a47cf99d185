"""The web UI's options, apart from the app: `app.py --help`, a mistyped option, a bad --threads and a port in use
are answered before gradio, torch and the models load (a second, not half a minute). Imports nothing heavy."""

from __future__ import annotations

import argparse
import os

from ...errors import InputError
from ...options import DEVICES, DRAFT_WEIGHTS, DTYPES, HEAD_WEIGHTS, ENGINE_CHOICES, check_int, check_port, port_number

MAX_THREADS = 1024  # torch threads: more than any machine this runs on has cores (a larger number only fails later)
FILE_TTL_S = 600  # gradio's copies of uploads and served downloads are deleted this long after they were made


def add_server_args(p: argparse.ArgumentParser) -> None:
    """Where the page listens and whether it is shared: the app's and `replay`'s (security defaults: this machine
    only, no share link)."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=port_number, default=7860, help="default: 7860")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")


def build_parser(prog: str = "app.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="ddtree-viz: a step-through debugger for DDTree on hybrid models.")
    p.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny Qwen3.5-style model)")
    p.add_argument("--draft", metavar="DIR|HUB_ID",
                   help="DFlash or DFlash2 drafter (default: the embedded one; with the embedded target, 'dflash2' "
                        "names its embedded DFlash2 drafter)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default=None,
                   help="int4: the drafter's Linears quantized to 4 bits at load (the output stays the target's; only "
                        "acceptance may change; on CUDA the weights stay packed)")
    p.add_argument("--head-weights", choices=HEAD_WEIGHTS, default=None,
                   help="int4 or fp8: the target's lm_head quantized at load (greedy and DDTree change together and "
                        "stay equal; analyze --head-weights-b audits what it costs)")
    p.add_argument("--device", default="cpu", choices=DEVICES)
    p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                   help="engine for exact rounds: auto (default: the fastest exact engine that applies: the static "
                        "runner on a Qwen3.5 hybrid target on one device, else transformers), transformers' forward "
                        "(the reference path) or the static runner (CUDA graphs on a GPU); naive rounds always use "
                        "transformers")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads for the model work (default: one core less than this machine has, at least "
                        "one, leaving a core to the server and the browser)")
    add_server_args(p)
    p.add_argument("--replay", metavar="TRACE.json", help="open with a saved trace loaded (no model needed)")
    p.add_argument("--report-root", metavar="DIR",
                   help="the Analyze tab reads report directories typed in under DIR only (relative paths from DIR). "
                        "Default: any directory the server can read when the page listens on this machine only "
                        "(127.0.0.1, no --share); none otherwise (uploads still work)")
    p.add_argument("--file-ttl", type=_seconds, default=FILE_TTL_S, metavar="SECONDS",
                   help=f"how long uploads and served downloads stay in gradio's temporary folder (default: {FILE_TTL_S})")
    return p


def checked_args(argv: list[str] | None, prog: str = "app.py") -> argparse.Namespace:
    """The options parsed (--help and a bad option exit here) and the checks that need no gradio, torch or model
    (--threads, --report-root, the --replay file, a port in use): the entry points call it before importing the app, so these errors come in a
    second, not after the imports (half a minute on a loaded machine). The app calls it again (the port may have
    been taken since). A user error is an InputError."""
    args = build_parser(prog).parse_args(argv)
    if args.threads is not None:
        check_int("--threads", args.threads, 1, MAX_THREADS)
    if args.report_root is not None and not os.path.isdir(args.report_root):
        raise InputError(f"--report-root {args.report_root}: no such directory (name a folder that exists; the "
                         "Analyze tab reads report folders under it)")
    if args.replay is not None:  # read and checked now, as the page will read it: a bad file is refused at start
        from ...trace import load_any

        load_any(args.replay)
    check_port(args.host, args.port)
    return args


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1, not {text!r}")
    return value

"""Command line: `ddtree-viz run | bench | export | replay | analyze | app` (or `python -m ddtree_viz ...`). Parse,
call the engine, the prompt-set loop or a renderer, print; `app` starts the web UI (ddtree_viz/page/web/app.py, the options
of app.py). One module per subcommand (its parser and its command); common.py holds what several share.

Every user error (a DDTreeVizError) prints `error: <message>` on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import DDTreeVizError
from . import analyze, app, bench, export, replay, run

EXIT_USER_ERROR = 2
SUBCOMMANDS = (run, bench, export, replay, analyze, app)  # in the order `--help` lists them


def build_parser(prog: str = "python -m ddtree_viz") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="ddtree-viz: debug and visualise DDTree speculative decoding on hybrid (Gated DeltaNet + attention) targets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser


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
    return dispatch(args)


def dispatch(args) -> int:
    """Run the parsed subcommand: a user error is `error: ...` and status 2, Ctrl-C status 130."""
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

"""ddtree-viz web UI: NOT BUILT YET.

The Gradio UI arrives with issue 4. Until then this script only parses the options the UI will take and says
so; it starts no server. Use the command line meanwhile: `python -m ddtree_viz run --prompt TEXT`.

Security defaults the UI will keep: listen on 127.0.0.1 only (never 0.0.0.0 unless asked for by --host),
no public share link unless --share, no trust_remote_code.
"""

from __future__ import annotations

import argparse
import sys

EXIT_NOT_BUILT = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="app.py",
        description="ddtree-viz web UI (not built yet: it arrives with issue 4; use `python -m ddtree_viz run` meanwhile).",
    )
    p.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny model)")
    p.add_argument("--draft", metavar="DIR|HUB_ID", help="DFlash drafter (default: the embedded one)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=7860, help="default: 7860")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")
    return p


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    print(
        "error: the ddtree-viz web UI is not built yet (it arrives with issue 4); no server was started.\n"
        "Meanwhile use the command line, e.g.:\n"
        "  python -m ddtree_viz run --prompt 'def fibonacci(n):' --trace trace.json\n"
        "  python -m ddtree_viz bench",
        file=sys.stderr,
    )
    return EXIT_NOT_BUILT


if __name__ == "__main__":
    raise SystemExit(main())

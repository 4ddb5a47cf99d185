"""`app`: the web UI (ddtree_viz/page/web/app.py, the options of app.py). The web UI parses its own options (defined once,
there): main() hands it every argument after `app`, `--help` included."""

from __future__ import annotations


def add_parser(sub) -> None:
    app = sub.add_parser("app", add_help=False,
                         help="the web UI: step through DDTree in the browser (the options of app.py; `app --help`)")
    app.set_defaults(handler=command)


def command(args) -> int:
    from ..page.web.args import checked_args

    checked_args(args.app_args, f"{args.prog} app")  # --help, a bad option, a port in use: answered before gradio loads
    from ..page.web import app as web  # imports gradio: only here, so the other commands start quickly

    return web.main(args.app_args, prog=f"{args.prog} app")

"""ddtree-viz web UI: step through DDTree on a hybrid target in the browser.

    python app.py [--target DIR|HUB_ID --draft DIR|HUB_ID] [--dtype float32] [--device cpu] [--host 127.0.0.1] [--port 7860]

Listens on 127.0.0.1 only unless --host says otherwise; no public share link unless --share; never
trust_remote_code. The page itself is ddtree_viz/page/ (its Gradio app: ddtree_viz/page/web/app.py; also
`ddtree-viz app`, the same options); this file is its entry point in a checkout.
"""

import sys

from ddtree_viz.errors import DDTreeVizError
from ddtree_viz.page.web.args import checked_args


def main(argv: list[str] | None = None) -> int:
    try:  # --help, a bad option, a port in use: answered before gradio and torch load
        checked_args(argv)
    except DDTreeVizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ddtree_viz.page.web.app import main as serve

    return serve(argv)


if __name__ == "__main__":
    sys.exit(main())

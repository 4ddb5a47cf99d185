"""`export`: one round of a saved trace as SVG, PDF, PNG, TikZ, HTML or JSON (ddtree_viz/render/export.py draws it;
no model needed); with --session, the whole session as one self-contained HTML file (render/supplement.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..words import plural
# The export choices come from options (torch- and plotly-free): building the parser imports no renderer.
from ..options import (COLOR_RANGES, DEFAULT_DPI, PAPER_WIDTHS_CM, PHASES, SCHEME_NAMES, SHOW_CHOICES, length_inches,
                       paper_width, whole_number, EXPORT_FIGURES as FIGURES, EXPORT_FORMATS as FORMATS)
from .common import check_output_path


def add_parser(sub) -> None:
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
    ex.add_argument("--session", action="store_true",
                    help="the whole session as one self-contained HTML file to step through (a paper's supplement: "
                         "every round's tree, mask, cache, output vs greedy and why it stopped; no server, no network; "
                         "at most 5 MB; docs/EXPORT.md)")
    ex.add_argument("--rounds", metavar="A-B",
                    help="with --session: only rounds A to B (as the page numbers them; B may be 'last'), for a "
                         "session past the 5 MB bound")
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
    f.add_argument("--width", default="column", metavar="column|full|LENGTH",
                   help=f"the figure's width in a paper: column (default: one column of a two-column paper, "
                        f"{PAPER_WIDTHS_CM['column']:g} cm), full (the text width, {PAPER_WIDTHS_CM['full']:g} cm) or a "
                        "length (8cm, 85mm, 3.3in, 241pt; a bare number is centimetres). Labels are 8 pt, shrunk to 6 pt "
                        "(then cut) where the figure would not fit; the size is printed. A PNG is exactly "
                        "round(width x dpi) pixels wide")
    f.add_argument("--height", metavar="LENGTH",
                   help="figure height, a length as --width's (default: what the figure needs at its width; TikZ: "
                        "always)")
    f.add_argument("--standalone", action="store_true",
                   help="TikZ: a whole LaTeX document that compiles alone (default: a tikzpicture to \\input)")
    ex.set_defaults(handler=command)


def command(args) -> int:
    from ..render.export import ExportOptions, export, format_for, resolve_round
    from ..trace import Trace

    if args.session:
        return session_command(args)
    if args.rounds is not None:
        raise InputError("--rounds thins a session supplement: add --session (one round is --step K)")
    fmt = format_for(args.out, args.format)
    options = ExportOptions(
        figure=args.figure, phase=args.phase, show=args.show, colors=args.colors, min_logprob=args.min_logprob,
        max_depth=args.max_depth, path_label=args.path_label, ranks=args.ranks, legend=args.legend, title=args.title,
        show_title=not args.no_title, caption=args.caption, label_chars=args.label_chars, color_range=args.color_range,
        dpi=args.dpi, width=paper_width(args.width),
        height=None if args.height is None else length_inches(args.height, "the height"), standalone=args.standalone,
    )
    if args.out != "-":
        check_output_path(args.out, "export file")
    trace = Trace.load(args.trace)  # TraceError (missing, corrupt, newer schema) -> `error: ...`, exit 2
    k = resolve_round(trace, args.step)
    exported = export(trace, k + 1, fmt, options)
    data = exported.data
    if args.out == "-":
        if fmt in ("pdf", "png") and sys.stdout.isatty():
            raise InputError(f"not writing {fmt.upper()} bytes to a terminal: pass --out FILE or redirect standard output")
    path = _write(args.out, data)
    if path is None:
        if exported.size is not None:  # the figure went to standard output: its size to standard error
            print(exported.size.describe(), file=sys.stderr)
        return 0
    size = ""
    if fmt == "png":
        size = ", {} x {} px".format(*png_size(data))
    print(f"{fmt} of the {args.figure} of round {k + 1} of {len(trace.steps)} written to {path} "
          f"({plural(len(data), 'byte')}{size})")
    if exported.size is not None:
        print(exported.size.describe())
    return 0


def session_command(args) -> int:
    """export --session: the whole session (or --rounds A-B) as one HTML file (render/supplement.py)."""
    from ..render.export import SUFFIXES
    from ..render.supplement import parse_rounds, supplement_html
    from ..trace import Trace

    fmt = args.format or SUFFIXES.get(Path(args.out).suffix.lower() if args.out != "-" else "", "html")
    if fmt != "html":
        raise InputError(f"--session writes one HTML file, not {fmt}: use --format html or an --out ending in .html")
    if args.out != "-":
        check_output_path(args.out, "session supplement")
    trace = Trace.load(args.trace)
    rounds = parse_rounds(args.rounds, len(trace.steps))
    data = supplement_html(trace, rounds).encode("utf-8")  # InputError past the bound, giving the size
    path = _write(args.out, data)
    if path is None:
        return 0
    first, last = rounds.start + 1, rounds.stop  # (as --rounds takes them: A-B)
    which = f"round {first}" if first == last else f"rounds {first}-{last}"
    print(f"session supplement of {which} of {len(trace.steps)} written to {path} ({plural(len(data), 'byte')}, "
          f"{len(data) / 1e6:.2f} MB)")
    return 0


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _write(out: str, data: bytes) -> Path | None:
    """`data` to standard output (`out` "-": None) or to the file `out` (its Path); InputError where it cannot."""
    if out == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return None
    path = Path(out)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path

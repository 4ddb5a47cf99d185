"""Paper-ready export (SVG, PDF, PNG, TikZ, HTML, JSON) and replay of saved traces, from traces made by the
engine on tiny CPU models: every format, every figure, hostile token text, the CLI end to end, the page's
export control over HTTP, and replay reproducing the live session round by round."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddtree_viz import cli
from ddtree_viz.page import actions
from ddtree_viz.page.host import ModelHost
from ddtree_viz.page.state import TabState, read_settings
from ddtree_viz.page.views import render_views
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import InputError, TraceError
from ddtree_viz.options import PAPER_WIDTHS_CM
from ddtree_viz.render import export as ex
from ddtree_viz.render import style
from ddtree_viz.render.scheme import SCHEMES
from ddtree_viz.render.tikz import latex_label
from ddtree_viz.trace import SCHEMA_VERSION, Trace
from tests.test_exactness import greedy_ids
from tests.tiny import tiny_pair

PROMPT = "def f(x):\n"
SVG_NS = "{http://www.w3.org/2000/svg}"
# Tokens that break naive LaTeX, XML and HTML writers (and matplotlib's mathtext)
EVIL = ["\\{}_%#&$^~", "<script>alert(1)</script>", "a<b>&\"'", " \n\t", "", "$x^2$\\end{document}", "é中🙂",
        "]]>--><!--", "\x00\x1b[31m", "<img src=x onerror=alert(1)>", "}{\\relax", "%comment"]
FORMATS = ex.FORMATS


# ---------------------------------------------------------------------------------------------------------
# Traces made by the engine
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("hybrid")


@pytest.fixture(scope="module")
def session(pair):
    """Oracle drafts (greedy's tokens at ranks 0/1/2): long accepted paths, first-rejected siblings, deep trees."""
    ids, greedy = greedy_ids(pair, PROMPT)
    s = DecodeSession.of(pair, budget=32, max_new_tokens=24,
                         proposer=OracleProposer(greedy, len(ids), [0, 1, 2], pair.target.config.vocab_size))
    s.prefill(PROMPT)
    s.run()
    return s


@pytest.fixture(scope="module")
def trace(session):
    t = session.to_trace()
    assert len(t.steps) >= 3 and max(st.acceptance for st in t.steps) >= 3
    return t


def rich_round(trace) -> int:
    """1-based round with an accepted draft and first-rejected siblings."""
    for st in trace.steps:
        if st.acceptance >= 2 and any(n.parent == st.accepted[-1] for n in st.nodes):
            return st.index + 1
    raise AssertionError("no rich round")


@pytest.fixture(scope="module")
def k(trace):
    return rich_round(trace)


@pytest.fixture(scope="module")
def evil(trace, k):
    """The rich round with every node's token (and the bonus token's text) replaced by hostile text."""
    st = trace.steps[k - 1]
    nodes = tuple(dataclasses.replace(n, token=EVIL[i % len(EVIL)]) for i, n in enumerate(st.nodes))
    texts = dict(trace.token_texts)
    texts.update({str(n.token_id): n.token for n in nodes})
    texts[str(st.bonus_token_id)] = "<script>bonus</script>"
    steps = list(trace.steps)
    steps[k - 1] = dataclasses.replace(st, nodes=nodes)
    return dataclasses.replace(trace, steps=tuple(steps), token_texts=texts)


def layout_of(trace, k, **kw):
    o = ex.ExportOptions(**kw)
    return ex.tree_parts(trace, k - 1, o).layout


# ---------------------------------------------------------------------------------------------------------
# Format checkers
# ---------------------------------------------------------------------------------------------------------


def svg_texts(data: bytes) -> tuple[ET.Element, list[str]]:
    root = ET.fromstring(data)  # parses as XML
    return root, ["".join(el.itertext()) for el in root.iter(f"{SVG_NS}text")]


def by_id(root, prefix: str) -> list[ET.Element]:
    return [el for el in root.iter() if (el.get("id") or "").startswith(prefix)]


def strokes(el) -> set[str]:
    out = set()
    for e in el.iter():
        m = re.search(r"stroke:\s*(#[0-9a-fA-F]{6})", e.get("style", ""))
        if m:
            out.add(m.group(1).lower())
    return out


def pdf_pages(data: bytes) -> int:
    """Page objects in a PDF, those packed in compressed object streams (PDF 1.5, pdfTeX) included."""
    import zlib

    chunks = [data]
    for m in re.finditer(rb"stream\r?\n", data):
        try:
            chunks.append(zlib.decompressobj().decompress(data[m.end():]))
        except zlib.error:
            pass
    return sum(len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", c)) for c in chunks)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


class Resources(HTMLParser):
    """Every tag and every attribute that could make a browser fetch something."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[tuple[str, str, str]] = []
        self.csp: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        for name in ("src", "href", "data", "action", "poster", "srcset", "background", "formaction"):
            if a.get(name):
                self.urls.append((tag, name, a[name]))
        if tag == "meta" and (a.get("http-equiv") or "").lower() == "content-security-policy":
            self.csp = a.get("content")


def external_loads(page: str) -> list[str]:
    """Resource loads that would leave the file: tag attributes naming a URL, CSS imports and url(...) to a
    scheme other than data:. (The inlined plotly.js contains URL strings in its code and comments, e.g. for
    map tiles and the plotly cloud; they are not loads of this page, and the page's CSP forbids them anyway.)"""
    p = Resources()
    p.feed(page)
    bad = [f"<{t} {n}={v}>" for t, n, v in p.urls if not v.startswith(("data:", "#", "blob:"))]
    head = page.split("<body", 1)[0]
    body_outside_scripts = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    bad += re.findall(r"@import[^;]*", body_outside_scripts)
    bad += [u for u in re.findall(r"url\(\s*['\"]?([^)'\"]+)", body_outside_scripts) if not u.startswith("data:")]
    assert "<base" not in head
    return bad


class Tex:
    """Structural check of LaTeX text: braces balance, and # $ % & ^ _ ~ appear only escaped."""

    @staticmethod
    def check(text: str) -> None:
        depth, i = 0, 0
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                i += 1
                if i < len(text) and text[i].isalpha():
                    while i < len(text) and text[i].isalpha():
                        i += 1
                    continue
                i += 1  # an escaped character
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                assert depth >= 0, f"unbalanced }} in {text!r}"
            elif ch in "#$%&^_~":
                raise AssertionError(f"bare {ch!r} in {text!r}")
            i += 1
        assert depth == 0, f"unbalanced {{ in {text!r}"


def label_groups(tikz: str) -> list[str]:
    """The contents of every node label (label={[ddt label]above:{...}}), brace-matched."""
    out, key = [], "[ddt label]above:{"
    start = tikz.find(key)
    while start >= 0:
        i, depth = start + len(key), 1
        j = i
        while depth:
            if tikz[j] == "\\":
                j += 2
                continue
            depth += tikz[j] == "{"
            depth -= tikz[j] == "}"
            j += 1
        out.append(tikz[i:j - 1])
        start = tikz.find(key, j)
    return out


def tex_engines() -> list[str]:
    return [e for e in ("pdflatex", "lualatex", "xelatex") if shutil.which(e)]


def compile_tex(engine: str, source: str, tmp: Path) -> bytes:
    path = tmp / "fig.tex"
    path.write_text(source, encoding="utf-8")
    proc = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", path.name], cwd=tmp,
                          capture_output=True, text=True, errors="replace", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return (tmp / "fig.pdf").read_bytes()


# ---------------------------------------------------------------------------------------------------------
# Rounds, options, the CLI's copy of the choices
# ---------------------------------------------------------------------------------------------------------


def test_cli_choices_are_the_exporters():
    from ddtree_viz.cli import export as cli

    assert cli.FORMATS == ex.FORMATS and cli.FIGURES == ex.FIGURES and cli.SHOW_CHOICES == ex.SHOW_CHOICES
    assert cli.COLOR_RANGES == ex.COLOR_RANGES and cli.DEFAULT_DPI == ex.DEFAULT_DPI
    assert cli.SCHEME_NAMES == tuple(SCHEMES) and cli.PHASES == ("drafted", "verified")


def test_cli_phases_are_the_layouts():
    from ddtree_viz.cli import export as cli
    from ddtree_viz.render.layout import PHASES

    assert cli.PHASES == PHASES  # spelled out in cli/export.py so that parsing imports no renderer


def test_step_is_the_pages_round_number_or_last(trace):
    n = len(trace.steps)
    assert ex.resolve_round(trace, 1) == 0 and ex.resolve_round(trace, "1") == 0
    assert ex.resolve_round(trace, n) == n - 1 and ex.resolve_round(trace, "last") == n - 1
    assert ex.resolve_round(trace, " LAST ") == n - 1
    for bad in (0, n + 1, -1, "0", "999", "abc", "1.5", True):
        with pytest.raises(InputError, match=f"1..{n}|round number"):
            ex.resolve_round(trace, bad)
    with pytest.raises(InputError, match="numbered from 1"):
        ex.resolve_round(trace, 0)
    with pytest.raises(InputError, match="no rounds"):
        ex.resolve_round(dataclasses.replace(trace, steps=()), 1)


@pytest.mark.parametrize("bad", [dict(figure="graph"), dict(show="names"), dict(colors="rainbow"), dict(phase="x"),
                                 dict(max_depth=-1), dict(max_depth=1.5), dict(dpi=5), dict(dpi=True),
                                 dict(width=0.1), dict(height=1000), dict(label_chars=0), dict(min_logprob=float("nan")),
                                 dict(color_range="all")])
def test_bad_options_are_clear_errors(trace, bad):
    with pytest.raises(InputError):
        ex.export_figure(trace, 1, "svg", **bad)


def test_format_from_suffix():
    assert ex.format_for("a/b.TEX", None) == "tikz" and ex.format_for("x.htm", None) == "html"
    assert ex.format_for("x.whatever", "png") == "png"
    with pytest.raises(InputError, match="cannot tell the format"):
        ex.format_for("x.doc", None)
    with pytest.raises(InputError, match="format must be one of"):
        ex.format_for("x.svg", "gif")


# ---------------------------------------------------------------------------------------------------------
# Each format from an engine trace
# ---------------------------------------------------------------------------------------------------------


def test_svg_parses_keeps_labels_as_text_and_marks_the_path(trace, k):
    data = ex.export_figure(trace, k, "svg")
    root, texts = svg_texts(data)
    layout = layout_of(trace, k)
    for n in layout.nodes:  # every node's label is a searchable <text>
        assert n.label in texts, n.label
    st = trace.steps[k - 1]
    path_edges = by_id(root, "ddt-path-edge-")
    assert len(path_edges) == len(st.accepted) - 1 >= 1
    assert {e.get("id") for e in path_edges} == {f"ddt-path-edge-{a}-{b}" for a, b in zip(st.accepted, st.accepted[1:])}
    for e in path_edges:
        assert style.PATH_COLOR.lower() in strokes(e)
    assert by_id(root, "ddt-bonus-edge") and by_id(root, "ddt-nodes-first_rejected")
    assert "accepted path" in texts and any(t.startswith("Round ") for t in texts)
    css = "".join(el.text or "" for el in root.iter(f"{SVG_NS}style"))
    assert "@font-face" in css and "data:font/ttf;base64," in css  # glyphs embedded, text kept as text
    assert b"<image" not in data  # vector only
    assert ex.export_figure(trace, k, "svg") == data  # reproducible byte for byte


def test_a_reports_svgs_share_one_font_subset_that_covers_all_their_text():
    """The analyze report's figures embed their fonts together (mpl.embed_svg_fonts_together: one subset a face, not
    one a figure): each SVG carries the same font, and that font has a glyph for every character of every figure."""
    import base64
    import io

    from fontTools.ttLib import TTFont

    from ddtree_viz.render import mpl, report

    summary = {"rounds": 3, "acceptance_histogram": {"1": 2, "3": 1}, "per_depth_acceptance": [0.5, 0.25],
               "budget_curve": {"1": 1.5, "2": 2.0}, "stop_rank_histogram": {"0": 1, "≥8": 2},
               "acceptance_by_position": [{"from": 0, "to": 15, "mean_acceptance": 2.0}]}
    svgs = report.figures(summary, "svg")
    assert set(svgs) == set(report.FIGURES)

    def faces(svg: bytes) -> set[str]:
        return set(re.findall(r"base64,([A-Za-z0-9+/=]+)", svg.decode()))

    fonts = [faces(svg) for svg in svgs.values()]
    assert all(f == fonts[0] for f in fonts) and len(fonts[0]) == 1  # DejaVu Sans, cut once
    cmap = TTFont(io.BytesIO(base64.b64decode(next(iter(fonts[0]))))).getBestCmap()
    text = set().union(*(mpl._svg_fonts(svg)[("DejaVu Sans", "normal", "normal")] for svg in svgs.values()))
    assert "≥" in text and not [c for c in text if ord(c) not in cmap and not c.isspace()]
    one = report.figure(summary, "stop_rank", "svg")  # alone: its own glyphs only
    raw = report.drawn(summary, "stop_rank", ("svg",))["svg"]
    assert one == mpl.embed_svg_fonts(raw) and len(one) < len(svgs["stop_rank"])


def test_report_figures_tick_counts_depths_and_budgets_in_whole_numbers():
    """Rounds are counted, depths and budgets are whole: no 0.25-round or depth-1.25 ticks (matplotlib's default
    locator put them there); a mean (acceptance by position) keeps its fractional ticks."""
    from ddtree_viz.render import report

    summary = {"rounds": 5, "acceptance_histogram": {"1": 1, "2": 2, "3": 2}, "per_depth_acceptance": [0.8, 0.5, 0.0],
               "budget_curve": {"1": 1.8, "2": 2.0, "4": 2.0, "8": 2.0}, "stop_rank_histogram": {"3": 2, "5": 1},
               "acceptance_by_position": [{"from": 0, "to": 0, "mean_acceptance": 2.0}]}

    def ticks(name: str, axis: str) -> list[str]:
        root = ET.fromstring(report.figure(summary, name, "svg"))
        groups = [g for g in root.iter(f"{SVG_NS}g") if (g.get("id") or "").startswith(f"{axis}tick_")]
        return ["".join(t.itertext()).strip() for g in groups for t in g.iter(f"{SVG_NS}text")]

    for name, axis in (("acceptance_histogram", "y"), ("stop_rank", "y"), ("per_depth_acceptance", "x"),
                       ("budget_curve", "x")):
        shown = ticks(name, axis)
        assert shown and all(re.fullmatch(r"[−-]?\d+", t) for t in shown), (name, shown)
    assert any("." in t for t in ticks("acceptance_by_position", "y"))


def test_pdf_is_one_page_with_embedded_truetype_fonts(trace, k):
    data = ex.export_figure(trace, k, "pdf")
    assert data.startswith(b"%PDF")
    assert pdf_pages(data) == 1
    assert b"/FontFile2" in data and b"/Type3" not in data  # TrueType (Type 42) embedded, no Type 3 bitmaps
    assert ex.export_figure(trace, k, "pdf") == data  # no timestamps: reproducible


@pytest.mark.parametrize("width,height,dpi,expect", [(3, 2, 100, (300, 200)), (4.1, 2.7, 300, (1230, 810)),
                                                      (6.5, 3.3, 72, (468, 238)), (2.54, 2.54, 254, (645, 645))])
def test_png_has_the_requested_pixel_size(trace, k, width, height, dpi, expect):
    data = ex.export_figure(trace, k, "png", width=width, height=height, dpi=dpi)
    assert png_size(data) == expect == ex.png_pixels(width, height, dpi)


def test_png_default_dpi_shrinks_for_huge_figures_and_explicit_dpi_is_checked(trace, k):
    assert ex.effective_dpi(ex.ExportOptions(), 6, 4) == ex.DEFAULT_DPI
    big = ex.effective_dpi(ex.ExportOptions(), 100, 100)
    assert big < ex.DEFAULT_DPI and (100 * big) ** 2 <= ex.MAX_PNG_PIXELS
    assert ex.effective_dpi(ex.ExportOptions(dpi=72), 100, 100) == 72
    with pytest.raises(InputError, match="million"):  # refused before anything is drawn
        ex.export_figure(trace, k, "png", width=100, height=100, dpi=600)
    assert ex.export_figure(trace, k, "svg", width=100, height=100, dpi=600)[:5] == b"<?xml"  # vector: any size


def test_png_default_size_follows_dpi(trace, k):
    a = png_size(ex.export_figure(trace, k, "png", dpi=50))
    b = png_size(ex.export_figure(trace, k, "png", dpi=100))
    assert abs(b[0] - 2 * a[0]) <= 1 and abs(b[1] - 2 * a[1]) <= 1


def test_tikz_is_one_picture_with_one_node_per_tree_node(trace, k):
    layout = layout_of(trace, k)
    text = ex.export_figure(trace, k, "tikz").decode()
    assert text.count(r"\begin{tikzpicture}") == 1 and text.count(r"\end{tikzpicture}") == 1
    assert r"\documentclass" not in text and r"\begin{document}" not in text  # for \input
    named = re.findall(r"\\node\[[^\n]*\] \(n(\d+)\) at", text)
    assert sorted(map(int, named)) == sorted(n.id for n in layout.nodes)
    st = trace.steps[k - 1]
    assert text.count(r"\draw[ddt path edge]") == len(st.accepted) - 1
    assert text.count(r"\draw[ddt bonus edge]") == 1
    assert r"\definecolor{ddtpath}{HTML}{D55E00}" in text
    for n in layout.nodes:  # every fill is an xcolor definition, the page's colour
        if n.role not in ("root", "bonus"):
            assert re.search(rf"\\definecolor{{ddtfill{n.id}}}{{HTML}}{{[0-9A-F]{{6}}}}", text)
    bare = ex.export_figure(trace, k, "tikz", show_title=False, legend=False).decode()
    assert bare.count(r"\node") == len(layout.nodes)  # without title/caption: exactly one \node per tree node
    for group in label_groups(text):
        Tex.check(group)


def test_tikz_standalone_compiles_where_a_tex_engine_is_installed(trace, k, tmp_path):
    text = ex.export_figure(trace, k, "tikz", standalone=True).decode()
    assert text.count(r"\begin{tikzpicture}") == 1 and r"\begin{document}" in text and r"\end{document}" in text
    engines = tex_engines()
    if not engines:
        pytest.skip("no TeX engine installed (pdflatex/lualatex/xelatex): structural checks only")
    pdf = compile_tex(engines[0], text, tmp_path)
    assert pdf.startswith(b"%PDF") and pdf_pages(pdf) == 1


def test_html_is_self_contained_and_loads_nothing(trace, k):
    page = ex.export_figure(trace, k, "html").decode()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    assert len(page) > 1_000_000 and "Plotly.newPlot" in page  # plotly.js inlined
    p = Resources()
    p.feed(page)
    assert external_loads(page) == []
    assert not re.search(r"<script[^>]+src=", page, flags=re.I) and not re.search(r"<link\b", page, flags=re.I)
    assert p.csp and "default-src 'none'" in p.csp and "connect-src 'none'" in p.csp
    assert "ddtree-viz export" in page and f"round {k} of" in page


def test_json_round_trips_to_the_same_record(trace, k):
    data = json.loads(ex.export_figure(trace, k, "json"))
    assert data["schema_version"] == SCHEMA_VERSION and data["format"] == ex.EXPORT_FORMAT
    assert data["round"] == k and data["rounds"] == len(trace.steps)
    assert data["settings"] == trace.settings and data["target"] == trace.target and data["prompt"] == trace.prompt
    st = trace.steps[k - 1]
    assert ex.step_from_export(data) == st
    assert ex.step_from_export(json.dumps(data)) == st
    named = {n.token_id for n in st.nodes} | set(st.target_argmax) | {st.bonus_token_id}
    assert {str(i) for i in named} <= set(data["token_texts"])
    layout = layout_of(trace, k)
    assert [(n["id"], n["x"], n["y"], n["role"]) for n in data["tree"]["nodes"]] == \
        [(n.id, n.x, n.y, n.role) for n in layout.nodes]
    with pytest.raises(TraceError, match="not a ddtree-viz round"):
        ex.step_from_export({"step": data["step"]})
    with pytest.raises(TraceError, match="newer"):
        ex.step_from_export({**data, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(TraceError):
        ex.step_from_export({**data, "step": {**data["step"], "nodes": []}})


# ---------------------------------------------------------------------------------------------------------
# Hostile token text survives every format
# ---------------------------------------------------------------------------------------------------------


def test_special_characters_survive_every_format(evil, trace, k, tmp_path):
    layout = layout_of(evil, k)
    labels = [n.label for n in layout.nodes]
    assert any("$" in lab for lab in labels) and any("<script>" in lab or "<script" in lab for lab in labels)

    wide = 12.0  # inches: wide enough that no label is cut to fit (a column's width cuts them: tests/test_print_size.py)
    svg = ex.export_figure(evil, k, "svg", width=wide)
    root, texts = svg_texts(svg)  # still well-formed XML
    for lab in labels:
        assert lab in texts, lab  # literally, unescaped after parsing (no mathtext: '$x^2$' stays as typed)
    assert not any(el.tag.endswith("script") for el in root.iter())
    assert b"<script>" not in svg

    pdf = ex.export_figure(evil, k, "pdf")
    assert pdf.startswith(b"%PDF") and pdf_pages(pdf) == 1
    assert png_size(ex.export_figure(evil, k, "png", width=5, height=4, dpi=80)) == (400, 320)

    tikz = ex.export_figure(evil, k, "tikz", title="T_1 & <b>100%</b> $", caption="a #caption ~ with ^ and \\",
                            width=wide).decode()
    groups = label_groups(tikz)
    assert len(groups) == len(layout.nodes)
    for lab, group in zip(labels, groups):
        assert group == latex_label(lab)
        Tex.check(group)
    assert r"\end{document}" not in tikz and "\x00" not in tikz and "\x1b" not in tikz
    assert r"\textvisiblespace" in tikz and r"\hookleftarrow" in tikz and r"\emptyset" in tikz  # whitespace shown
    assert r"\ddtuni{4E2D}" in tikz and r"\ddtuni{1F642}" in tikz and "é" in tikz
    title = re.search(r"\(title\) at [^{]*\{(.*)\};", tikz).group(1)
    Tex.check(title)
    engines = tex_engines()
    if engines:  # where a TeX engine is installed, every one of them compiles it
        for engine in engines:
            d = tmp_path / engine
            d.mkdir()
            pdf = compile_tex(engine, ex.export_figure(evil, k, "tikz", standalone=True).decode(), d)
            assert pdf_pages(pdf) == 1

    page = ex.export_figure(evil, k, "html", caption="<script>cap</script>", title="<b>t</b>").decode()
    p = Resources()
    p.feed(page)
    clean = ex.export_figure(trace, k, "html").decode()
    q = Resources()
    q.feed(clean)
    assert p.tags.count("script") == q.tags.count("script")  # no token opened a tag
    assert "img" not in p.tags and external_loads(page) == []
    assert "<script>alert(1)" not in page and "<img src=x" not in page and "<script>cap" not in page
    assert "&lt;script&gt;cap&lt;/script&gt;" in page

    data = ex.export_figure(evil, k, "json")
    back = json.loads(data)
    assert ex.step_from_export(back) == evil.steps[k - 1]
    assert {n["token"] for n in back["tree"]["nodes"] if not n["synthetic"]} <= set(EVIL)


# ---------------------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------------------


def test_grayscale_has_no_colour(trace, k):
    svg = ex.export_figure(trace, k, "svg", colors="grayscale").decode()
    colours = set(re.findall(r"#([0-9a-fA-F]{6})\b", svg))
    assert colours and all(c[0:2].lower() == c[2:4].lower() == c[4:6].lower() for c in colours), colours
    tikz = ex.export_figure(trace, k, "tikz", colors="grayscale").decode()
    for hexa in re.findall(r"\{HTML\}\{([0-9A-F]{6})\}", tikz):
        assert hexa[0:2] == hexa[2:4] == hexa[4:6], hexa
    figure = ex.export_figure(trace, k, "html", colors="grayscale").decode().rsplit("Plotly.newPlot(", 1)[1]
    assert style.PATH_COLOR not in figure and style.BONUS_FILL not in figure
    scale = ex.plotly_figure(trace, k - 1, ex.ExportOptions(colors="grayscale")).layout.coloraxis.colorscale
    assert all(len(set(re.findall(r"\d+", c))) == 1 for _, c in scale)  # r = g = b all along the scale
    assert style.PATH_COLOR in ex.export_figure(trace, k, "html").decode().rsplit("Plotly.newPlot(", 1)[1]


def test_filters_hide_nodes_but_never_the_path(trace, k):
    st = trace.steps[k - 1]
    full = layout_of(trace, k)
    cut = layout_of(trace, k, max_depth=1)
    assert cut.hidden > 0 and len(cut.nodes) < len(full.nodes)
    assert all(i in cut for i in st.accepted)
    text = ex.export_figure(trace, k, "tikz", max_depth=1, show_title=False, legend=False).decode()
    assert text.count(r"\node") == len(cut.nodes)
    low = min(n.logprob for n in st.nodes[1:])
    thin = layout_of(trace, k, min_logprob=low + 1e-6)
    assert thin.hidden > 0 and all(i in thin for i in st.accepted)
    root, texts = svg_texts(ex.export_figure(trace, k, "svg", max_depth=1))
    assert len(by_id(root, "ddt-label-")) == len(cut.nodes)
    assert any("hidden" in t for t in texts)  # the page's title says how many are hidden


def test_labels_ids_both_title_caption_path_label_ranks(trace, k):
    st = trace.steps[k - 1]
    root, texts = svg_texts(ex.export_figure(trace, k, "svg", show="ids"))
    assert {str(n.token_id) for n in st.nodes} <= set(texts)
    both = layout_of(trace, k, show="both")
    _, texts = svg_texts(ex.export_figure(trace, k, "svg", show="both", width=12.0))  # wide: no label cut to fit
    assert all(n.label in texts and n.label.endswith(f" {n.token_id}") for n in both.nodes)
    _, texts = svg_texts(ex.export_figure(trace, k, "svg", title="My tree", caption="Figure 3: a tree."))
    assert "My tree" in texts and "Figure 3: a tree." in texts
    root, texts = svg_texts(ex.export_figure(trace, k, "svg"))
    assert by_id(root, "ddt-path-label") and by_id(root, "ddt-rank-")
    root, texts = svg_texts(ex.export_figure(trace, k, "svg", show_title=False, path_label=False, ranks=False))
    assert not any(t.startswith("Round ") for t in texts) and not by_id(root, "ddt-path-label")
    assert not any(re.fullmatch(r"r\d+", t) for t in texts) and not by_id(root, "ddt-rank-")
    tikz = ex.export_figure(trace, k, "tikz", show_title=False, path_label=False, ranks=False).decode()
    assert "(title)" not in tikz and "ddt path label]" not in tikz and "[ddt rank]" not in tikz
    tikz = ex.export_figure(trace, k, "tikz", caption="Figure 3").decode()
    assert "(caption)" in tikz and "Figure 3" in tikz


def test_drafted_phase_has_no_verification_marks(trace, k):
    root, texts = svg_texts(ex.export_figure(trace, k, "svg", phase="drafted"))
    assert not by_id(root, "ddt-path-edge-") and not by_id(root, "ddt-bonus-edge") and not by_id(root, "ddt-path-label")
    assert "accepted path" not in texts and "drafted" in texts
    tikz = ex.export_figure(trace, k, "tikz", phase="drafted").decode()
    assert "ddt path edge]" not in tikz and "ddt bonus edge]" not in tikz and "ddt bonus," not in tikz


@pytest.mark.parametrize("fmt", FORMATS)
def test_mask_and_acceptance_export_in_every_format(trace, k, fmt):
    st = trace.steps[k - 1]
    mask = ex.export_figure(trace, k, fmt, figure="mask")
    acc = ex.export_figure(trace, k, fmt, figure="acceptance")
    if fmt == "svg":
        root, texts = svg_texts(mask)
        assert {e.get("id") for e in by_id(root, "ddt-accepted-row-")} == {f"ddt-accepted-row-{a}" for a in st.accepted}
        assert any(t.startswith("✓ ") for t in texts) and f"prefix ({st.committed_len} tokens)" in texts
        root, _ = svg_texts(acc)
        assert len(by_id(root, "ddt-bar-")) == k  # rounds 1..k, as the page shows at round k
    elif fmt == "pdf":
        assert pdf_pages(mask) == pdf_pages(acc) == 1
    elif fmt == "png":
        assert png_size(mask) and png_size(acc)
    elif fmt == "tikz":
        for t in (mask.decode(), acc.decode()):
            assert t.count(r"\begin{tikzpicture}") == 1
        assert mask.decode().count(r"\draw[ddtpath, line width=1pt]") == len(st.accepted)
        assert acc.decode().count(r"\fill[ddtbar]") == k
    elif fmt == "html":
        assert external_loads(mask.decode()) == [] and external_loads(acc.decode()) == []
    else:
        m, a = json.loads(mask), json.loads(acc)
        assert len(m["mask"]["visible"]) == len(st.nodes) and len(m["mask"]["visible"][0]) == len(st.nodes) + 1
        assert [r["tokens"] for r in a["acceptance"]] == [s.acceptance for s in trace.steps[:k]]


def test_export_agrees_with_the_page(trace, k):
    """Positions, roles, labels and the colour range of the export are those of the page's tree figure."""
    no_model = ModelHost(None, None, "float32", "cpu")
    tab = TabState(trace=trace, view=k - 1, replay=True)
    page = render_views(no_model, tab, "verified").tree
    data = json.loads(ex.export_figure(trace, k, "json"))["tree"]
    from_page = {}
    for t in page.data:
        if t.customdata is not None:
            for i, x, y in zip(t.customdata, t.x, t.y):
                from_page[int(i)] = (x, y)
    assert from_page == {n["id"]: (n["x"], n["y"]) for n in data["nodes"]}
    ca = page.layout.coloraxis
    assert (ca.cmin, ca.cmax) == tuple(data["color_range"])
    assert page.layout.title.text == data["title"]
    # the HTML export is the page's own figure: the same traces (markers, labels, hovers, colours)
    exported = ex.plotly_figure(trace, k - 1, ex.ExportOptions())
    assert exported.to_dict()["data"] == page.to_dict()["data"]
    assert exported.layout.coloraxis.to_plotly_json() == page.layout.coloraxis.to_plotly_json()


# ---------------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_file(trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    trace.save(path)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_export_end_to_end(trace_file, trace, k, tmp_path, capsys, fmt):
    out = tmp_path / f"fig{ex.EXTENSION[fmt]}"
    extra = ["--width", "4in", "--height", "3in", "--dpi", "50"] if fmt == "png" else []
    rc = cli.main(["export", "--trace", str(trace_file), "--step", str(k), "--out", str(out), *extra])
    assert rc == 0
    assert f"round {k} of {len(trace.steps)}" in capsys.readouterr().out
    data = out.read_bytes()
    assert data == ex.export_figure(trace, k, fmt, **({"width": 4, "height": 3, "dpi": 50} if fmt == "png" else {}))
    if fmt == "png":
        assert png_size(data) == (200, 150)


def test_cli_export_options_and_explicit_format(trace_file, trace, tmp_path):
    out = tmp_path / "fig.txt"
    rc = cli.main(["export", "--trace", str(trace_file), "--step", "last", "--format", "tikz", "--out", str(out),
                   "--figure", "tree", "--show", "both", "--colors", "grayscale", "--max-depth", "2", "--min-logprob",
                   "-3.5", "--no-path-label", "--no-ranks", "--no-legend", "--no-title", "--caption", "C_1",
                   "--label-chars", "6", "--color-range", "round", "--phase", "drafted", "--standalone"])
    assert rc == 0
    expect = ex.export_figure(trace, "last", "tikz", show="both", colors="grayscale", max_depth=2, min_logprob=-3.5,
                              path_label=False, ranks=False, legend=False, show_title=False, caption="C_1",
                              label_chars=6, color_range="round", phase="drafted", standalone=True)
    assert out.read_bytes() == expect and rb"C\_1" in expect


def test_cli_export_to_standard_output(trace_file, trace, k, capfdbinary):
    rc = cli.main(["export", "--trace", str(trace_file), "--step", str(k), "--format", "json", "--out", "-"])
    assert rc == 0
    assert ex.step_from_export(capfdbinary.readouterr().out.decode()) == trace.steps[k - 1]


@pytest.fixture()
def bad_traces(trace_file, tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema_version": 1, "steps": [', encoding="utf-8")
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**json.loads(trace_file.read_text()), "schema_version": SCHEMA_VERSION + 1}))
    broken = tmp_path / "broken.json"
    d = json.loads(trace_file.read_text())
    d["steps"][0]["accepted"] = [5, 0]
    broken.write_text(json.dumps(d))
    return {"corrupt": corrupt, "newer": newer, "broken": broken, "missing": tmp_path / "nope.json"}


@pytest.mark.parametrize("argv,words", [
    (["--step", "0"], "numbered from 1"),
    (["--step", "999"], "out of range"),
    (["--step", "first"], "round number or 'last'"),
    (["--format", "gif"], "invalid choice"),
    (["--figure", "graph"], "invalid choice"),
    (["--dpi", "1"], "dpi"),
    (["--width", "0"], "width"),
    (["--max-depth", "x"], "whole number"),
    (["--out", "fig.doc"], "cannot tell the format"),
    (["--out", "/nonexistent-dir/fig.svg"], "cannot write"),
])
def test_cli_export_bad_inputs_exit_2(trace_file, tmp_path, capsys, argv, words):
    base = ["export", "--trace", str(trace_file)] + ([] if "--out" in argv else ["--out", str(tmp_path / "fig.svg")])
    assert run_cli(base + argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and words in err and "Traceback" not in err


def run_cli(argv: list[str]) -> int:
    """cli.main's exit status, argparse's own usage errors (SystemExit 2) included."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("which,words", [("corrupt", "not valid JSON"), ("newer", "newer than"),
                                         ("broken", "accepted path"), ("missing", "not found")])
def test_cli_bad_trace_files_exit_2(bad_traces, tmp_path, capsys, monkeypatch, which, words):
    path = str(bad_traces[which])
    assert cli.main(["export", "--trace", path, "--out", str(tmp_path / "f.svg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err
    from ddtree_viz.page.web import app as web

    monkeypatch.setattr(web, "main", lambda argv: pytest.fail("a server must not start for a bad trace"))
    assert cli.main(["replay", path]) == 2
    assert cli.main(["replay", path, "--print"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and words in err


def test_replay_print_lists_the_rounds(trace_file, trace, capsys):
    assert cli.main(["replay", str(trace_file), "--print"]) == 0
    out = capsys.readouterr().out
    assert f"rounds: {len(trace.steps)}" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\+bonus", line)]
    assert [int(r[0]) for r in rows] == list(range(1, len(trace.steps) + 1))
    assert [int(r[1]) for r in rows] == [s.kept for s in trace.steps]  # #26.4: kept, was the walk
    assert f"output identical to greedy for {len(trace.output_ids)} tokens" in out
    assert repr(trace.output_text) in out
    assert cli.main(["replay", str(trace_file), "--summary"]) == 0


def test_replay_print_reports_divergence_and_naive(trace, tmp_path, capsys):
    # a reference that really differs at token 2 (a trace whose first_divergence disagrees with its ids is refused)
    greedy = trace.greedy_ids[:2] + (trace.greedy_ids[2] + 1,) + trace.greedy_ids[3:]
    t = dataclasses.replace(trace, greedy_ids=greedy, first_divergence=2, divergence_margin=0.125,
                            settings={**trace.settings, "verify": "naive"})
    path = tmp_path / "t.json"
    t.save(path)
    assert cli.main(["replay", str(path), "--print"]) == 0
    out = capsys.readouterr().out
    assert "DIVERGES from greedy at generated token 2" in out and "margin 0.125" in out and "NAIVE" in out


def test_replay_launches_the_app_with_the_trace(trace_file, monkeypatch):
    seen = {}

    class FakeApp:
        @staticmethod
        def main(argv):
            seen["argv"] = argv
            return 0

    from ddtree_viz.page.web import app  # the real web UI (app.py's page)

    monkeypatch.setattr(app, "main", FakeApp.main)
    assert cli.main(["replay", str(trace_file), "--port", "7999", "--host", "127.0.0.1"]) == 0
    assert seen["argv"] == ["--replay", str(trace_file), "--host", "127.0.0.1", "--port", "7999"]
    assert app.build_parser().parse_args(seen["argv"]).replay == str(trace_file)


# ---------------------------------------------------------------------------------------------------------
# Replay == live
# ---------------------------------------------------------------------------------------------------------


def test_saved_trace_replays_the_live_sessions_records(session, tmp_path):
    path = tmp_path / "live.json"
    session.to_trace().save(path)
    again = Trace.load(path)
    assert again == session.to_trace()
    assert again.steps == tuple(session.history)


def test_replay_renders_every_round_as_live(pair, tmp_path):
    host = ModelHost(None, None, "float32", "cpu")
    host.pair, host.stage = pair, "ready"
    tab = TabState()
    settings = read_settings(host, dict(prompt=PROMPT, budget=8, block_size=8, max_new_tokens=12, verify="exact",
                                        method="ddtree"))
    for tab in actions.run_rounds(host, tab, settings):
        pass
    path = tmp_path / "t.json"
    tab.trace.save(path)
    no_model = ModelHost(None, None, "float32", "cpu")  # never started: nothing loaded
    replay = actions.load_replay(TabState(), str(path))
    assert replay.trace == tab.trace and replay.view == tab.view
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    n = len(tab.trace.steps)
    for k in range(n):
        tab = actions.move(tab, to=k)
        replay = actions.move(replay, to=k)
        for phase in ("verified", "drafted"):
            live, again = render_views(host, tab, phase), render_views(no_model, replay, phase)
            assert (again.rounds, again.view) == (live.rounds, live.view) == (n, k)
            assert again.cache_rows == live.cache_rows
            assert again.diff_html == live.diff_html
            assert again.divergence == live.divergence
            assert again.tree.to_dict() == live.tree.to_dict()
            assert again.mask.to_dict() == live.mask.to_dict()
            assert again.acceptance.to_dict() == live.acceptance.to_dict()
            assert f"Round {k + 1} of {n}" in again.status and "replay" in again.status
            # and the export of what is on screen is the same from either
            a = ex.export_round_file(replay.trace, replay.view, "json", tmp_path / "a", phase=phase)
            b = ex.export_round_file(tab.trace, tab.view, "json", tmp_path / "b", phase=phase)
            assert a.read_bytes() == b.read_bytes()


def test_export_round_file_names_and_errors(trace, tmp_path):
    p = ex.export_round_file(trace, 1, "pdf", tmp_path, figure="mask")
    assert p.name == "ddtree-round2-mask.pdf" and pdf_pages(p.read_bytes()) == 1
    assert ex.export_round_file(trace, 10_000, "tikz", tmp_path).name == f"ddtree-round{len(trace.steps)}-tree.tex"
    with pytest.raises(InputError, match="nothing to export"):
        ex.export_round_file(None, 0, "svg")
    assert ex.optional_number("", "x") is None and ex.optional_number(" -2.5 ", "x") == -2.5
    assert ex.optional_number("3", "d", integer=True) == 3
    with pytest.raises(InputError, match="whole number"):
        ex.optional_number("2.5", "max depth", integer=True)
    with pytest.raises(InputError, match="number"):
        ex.optional_number("abc", "x")


# ---------------------------------------------------------------------------------------------------------
# The page's export control, served
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_replay(trace_file):
    """One app serving --replay for the served tests of this module (they only read: each is its own client)."""
    from tests.test_app import serve

    proc, url = serve("--replay", str(trace_file))
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_served_app_exports_the_round_on_screen(served_replay, trace_file, trace):
    from gradio_client import Client, handle_file

    client = Client(served_replay, verbose=False)
    out = client.predict("verified", handle_file(str(trace_file)), api_name="/replay")
    assert f"Round {len(trace.steps)} of {len(trace.steps)}" in out[0]
    client.predict("verified", api_name="/back")
    got, note = client.predict("verified", "svg", "tree", "both", "grayscale", "", "1", True, "full", api_name="/export")
    path = Path(got["value"] if isinstance(got, dict) else got)
    assert path.name == f"ddtree-round{len(trace.steps) - 1}-tree.svg"
    exported = ex.export(trace, len(trace.steps) - 1, "svg", show="both", colors="grayscale", max_depth=1, width="full")
    assert path.read_bytes() == exported.data
    assert note == f"Exported: {exported.size.describe()}" and note.startswith("Exported: SVG: 17.5 cm x ")
    # the width left out is the page's default, a column; its size is said too
    got, note = client.predict("verified", "tikz", "tree", "text", "colorblind", "", "", True, api_name="/export")
    assert note.startswith("Exported: TikZ: 8.5 cm x ") and "pt labels" in note
    with pytest.raises(Exception, match="max depth must be a whole number"):
        client.predict("verified", "svg", "tree", "text", "colorblind", "", "1.5", True, api_name="/export")


def test_downloads_and_exports_are_served_only_to_the_browser_that_made_them(served_replay, trace_file, trace):
    """#27 D13: a tab's trace download and figure export are refused (404) to a client without that browser's
    cookie (a plain HTTP client, another client with its own cookie), and served to the one that made them; the
    page's own files (its script) still load for anyone. Bound to 127.0.0.1 here; the same check serves --share and
    --host, where others can reach the server."""
    import httpx
    from gradio_client import Client, handle_file

    owner = Client(served_replay, verbose=False, download_files=False)
    other = Client(served_replay, verbose=False)
    owner.predict("verified", handle_file(str(trace_file)), api_name="/replay")
    made = [owner.predict(api_name="/download"),
            owner.predict("verified", "tikz", "tree", "text", "colorblind", "", "", True, "column", api_name="/export")[0]]
    urls = [got["value"]["url"] if "value" in got else got["url"] for got in made]  # a DownloadButton's update
    for url in urls:
        assert httpx.get(url).status_code == 404
        assert httpx.get(url, cookies=other.cookies).status_code == 404
        assert httpx.get(url, cookies=owner.cookies).status_code == 200
    assert Trace.from_json(httpx.get(urls[0], cookies=owner.cookies).content).output_ids == trace.output_ids
    assert httpx.get(urls[1], cookies=owner.cookies).content == ex.export_figure(trace, len(trace.steps), "tikz")
    assert httpx.get(served_replay).status_code == 200
    assert owner.cookies.get("ddv_client") and other.cookies.get("ddv_client") != owner.cookies["ddv_client"]


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (bash .ci/run installs it)")
def test_html_export_renders_offline_in_a_browser(trace, k, tmp_path):
    """Opened from disk in headless Chromium: the figure draws, and the page asks for nothing but itself."""
    from playwright.sync_api import sync_playwright

    from tests.test_browser import ARGS

    path = tmp_path / "fig.html"
    path.write_bytes(ex.export_figure(trace, k, "html"))
    n_nodes = len(layout_of(trace, k).nodes)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(path.as_uri())
            page.wait_for_selector(".scatterlayer .point", timeout=30_000)
            assert page.locator(".scatterlayer .point").count() == n_nodes
            time.sleep(0.5)
        finally:
            browser.close()
    assert requests == [path.as_uri()] and errors == []


# ---------------------------------------------------------------------------------------------------------
# The drafter's grid, and the round's analysis in the JSON export
# ---------------------------------------------------------------------------------------------------------


def test_the_grid_in_every_format(trace, k):
    st = trace.steps[k - 1]
    depths, kk = len(st.draft_top_ids), len(st.draft_top_ids[0])
    taken = {(n.depth, n.rank) for n in st.nodes[1:] if n.rank < kk}
    root, texts = svg_texts(ex.export_figure(trace, k, "svg", figure="grid"))
    assert len(by_id(root, "ddt-cell-")) == depths * kk
    assert {el.get("id") for el in by_id(root, "ddt-taken-")} == {f"ddt-taken-{d}-{r}" for d, r in taken}
    assert by_id(root, "ddt-grid-path") and any("walk stopped at depth" in t or "walk accepted" in t for t in texts)
    assert pdf_pages(ex.export_figure(trace, k, "pdf", figure="grid")) == 1
    assert png_size(ex.export_figure(trace, k, "png", figure="grid", width=6, height=4, dpi=50)) == (300, 200)
    tikz = ex.export_figure(trace, k, "tikz", figure="grid").decode()
    assert tikz.count(r"\node[ddt cell") == depths * kk and tikz.count(r"\draw[ddtrejected") == len(taken)
    page = ex.export_figure(trace, k, "html", figure="grid").decode()
    assert external_loads(page) == [] and "Drafter" in page
    data = json.loads(ex.export_figure(trace, k, "json", figure="grid"))
    cells = data["grid"]["cells"]
    assert len(cells) == depths * kk and data["grid"]["path"] == [[st.nodes[a].depth, st.nodes[a].rank]
                                                                   for a in st.accepted[1:]]
    assert {(c["depth"], c["rank"]) for c in cells if c["taken"]} == taken
    gray = ex.export_figure(trace, k, "tikz", figure="grid", colors="grayscale").decode()
    for hexa in re.findall(r"\{HTML\}\{([0-9A-F]{6})\}", gray):
        if hexa != ex.get_scheme("grayscale").path[1:].upper():
            assert hexa[0:2] == hexa[2:4] == hexa[4:6], hexa


def test_the_json_export_carries_the_rounds_analysis(trace, k):
    st = trace.steps[k - 1]
    data = json.loads(ex.export_figure(trace, k, "json"))
    a = data["analysis"]
    assert a["stop"]["depth"] == st.acceptance and a["stop"]["target_token_id"] == st.bonus_token_id
    assert a["budget_curve"] == st.budget_curve and a["budget_curve"][str(len(st.nodes) - 1)] == st.acceptance
    assert len(a["nodes"]) == len(st.nodes)
    node = a["nodes"][st.accepted[1]]
    assert node["node_is_choice"] and node["target_top"][0][0] == node["token_id"]
    assert data["step"]["target_top_ids"] == [list(r) for r in st.target_top_ids]
    assert all(str(t) in data["token_texts"] for row in st.target_top_ids for t in row)


def test_hostile_text_in_the_grid_and_a_round_without_one(trace, k):
    evil = dataclasses.replace(trace, token_texts={i: EVIL[int(i) % len(EVIL)] for i in trace.token_texts})
    svg = ex.export_figure(evil, k, "svg", figure="grid")
    root, texts = svg_texts(svg)
    assert b"<script>" not in svg and not any(el.tag.endswith("script") for el in root.iter())
    tikz = ex.export_figure(evil, k, "tikz", figure="grid").decode()
    for label in re.findall(r"\(ddtcell-\d+-\d+\) at \(\d+,\d+\) \{(.*)\};", tikz):
        Tex.check(label)
    page = ex.export_figure(evil, k, "html", figure="grid").decode()
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    bare = dataclasses.replace(trace, steps=tuple(dataclasses.replace(s, draft_top_ids=(), draft_top_logprobs=())
                                                  for s in trace.steps))
    with pytest.raises(InputError, match="no drafter grid"):
        ex.export_figure(bare, k, "svg", figure="grid")


@pytest.mark.parametrize("budget", [32, 128])
def test_default_tree_export_is_page_sized_with_readable_labels(pair, budget):
    """Issue #26.9: the exported tree was 6 x 15 in for 33 nodes, too tall for a paper page. By default it is a
    column wide (8.5 cm, issue #65 item 4) and at most 9 in tall while labels of at least 6 pt fit (beside their nodes
    when above them does not); a tree with more rows than that (128 nodes, ~120 leaves) is as short as 6 pt labels
    allow. SVG and PDF agree."""
    from ddtree_viz.render import mpl

    s = DecodeSession.of(pair, budget=budget, max_new_tokens=8)  # the random drafter: wide, shallow trees
    s.prefill(PROMPT)
    s.run()
    trace = s.to_trace()
    k = 1 + max(range(len(trace.steps)), key=lambda i: len(trace.steps[i].nodes))  # as the page numbers it
    assert len(trace.steps[k - 1].nodes) == budget + 1
    svg = ex.export_figure(trace, k, "svg")
    root = ET.fromstring(svg)
    w_in, h_in = (float(root.get(a).removesuffix("pt")) / 72 for a in ("width", "height"))
    media = re.search(rb"MediaBox \[ 0 0 ([\d.]+) ([\d.]+) \]", ex.export_figure(trace, k, "pdf"))
    assert (round(float(media[1]) / 72, 2), round(float(media[2]) / 72, 2)) == (round(w_in, 2), round(h_in, 2))
    assert round(w_in * 2.54, 2) == PAPER_WIDTHS_CM["column"]
    rows = layout_of(trace, k).height
    if budget == 32:
        assert h_in <= mpl.MAX_PAGE_HEIGHT
    else:  # as tall as its rows need at the smallest label, no taller
        extras = mpl._tree_extras(w_in, title=True, caption=None, legend=True)  # title, legend, colour bar (under it)
        assert h_in <= max(mpl.MAX_PAGE_HEIGHT, rows * mpl.LABEL_MIN_PT * 1.35 / 72 + extras), (rows, h_in)
    sizes = [float(re.search(r"font-size: ([\d.]+)px", t.get("style"))[1])
             for g in by_id(root, "ddt-label-") for t in g.iter(f"{SVG_NS}text")]
    assert len(sizes) == len(layout_of(trace, k).nodes) and min(sizes) >= mpl.LABEL_MIN_PT

"""Print sizes (issue #65 item 4): a paper export is one column wide by default (8.5 cm), or the full text width, or
any length; its labels print at 8 pt, shrunk to 6 pt and then cut where the figure would not fit, and it says its
size ("TikZ: 8.5 cm x 6.1 cm, 8 pt labels") and what did not fit. Read back from the files themselves: the TikZ
picture's coordinates, its fonts, the PDF's MediaBox, and (where a TeX engine is installed) the compiled page."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import zlib

import pytest

from ddtree_viz import cli
from ddtree_viz.errors import InputError
from ddtree_viz.options import PAPER_WIDTHS_CM, length_inches
from ddtree_viz.render import export as ex
from ddtree_viz.render import paper, tikz
from tests.test_export import compile_tex, layout_of, pair, run_cli, session, trace  # noqa: F401 (fixtures)

COLUMN, FULL = PAPER_WIDTHS_CM["column"], PAPER_WIDTHS_CM["full"]
PT_CM = 2.54 / 72.27
LONG = ["_abcdefghijklmnopqrstu", " the", "ing"]  # long labels on a deep tree: no column holds them whole at 8 pt


@pytest.fixture(scope="module")
def k(trace):
    """The round with the deepest tree (as the page numbers it)."""
    return 1 + max(range(len(trace.steps)), key=lambda i: layout_of(trace, i + 1).width)


@pytest.fixture(scope="module")
def long(trace, k):
    """That round with every drafted token's text long (the deep tree of a real model: too wide for a column)."""
    st = trace.steps[k - 1]
    nodes = tuple(dataclasses.replace(n, token=LONG[i % len(LONG)]) for i, n in enumerate(st.nodes))
    texts = dict(trace.token_texts)
    texts.update({str(n.token_id): n.token for n in nodes})
    steps = list(trace.steps)
    steps[k - 1] = dataclasses.replace(st, nodes=nodes)
    return dataclasses.replace(trace, steps=tuple(steps), token_texts=texts)


# ---------------------------------------------------------------------------------------------------------
# Reading a TikZ picture back
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Picture:
    unit_x: float  # cm per depth column (x=)
    unit_y: float  # cm per row (y=, pointing down)
    nodes: dict[int, tuple[float, float]]  # (nID) -> its position, in the picture's units
    box: tuple[float, float, float, float]  # the invisible rectangle: x0, y0, x1, y1 (cm)
    stated: str  # the size comment, "TikZ: ..."
    label_pt: float  # the labels' \fontsize (a tree's tokens, a grid's cells, a mask's or a chart's ticks)
    sizes: list[float]  # every \fontsize in the picture

    @property
    def width(self) -> float:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]


def picture(text: str) -> Picture:
    unit_x, unit_y = (float(re.search(rf"^  {a}=(-?[\d.]+)cm,", text, re.M)[1]) for a in "xy")
    nodes = {int(m[1]): (float(m[2]), float(m[3]))
             for m in re.finditer(r"\\node\[[^\n]*\] \(n(\d+)\) at \((-?[\d.]+),(-?[\d.]+)\)", text)}
    box = tuple(map(float, re.search(r"^\\path \((-?[\d.]+)cm,(-?[\d.]+)cm\) rectangle \((-?[\d.]+)cm,(-?[\d.]+)cm\);",
                                     text, re.M).groups()))
    stated = re.search(r"^% (TikZ: .*)$", text, re.M)[1]
    label_pt = float(re.search(r"ddt (?:label|cell|tick)/\.style=\{font=\\\w+\\fontsize\{([\d.]+)\}", text)[1])
    sizes = [float(s) for s in re.findall(r"\\fontsize\{([\d.]+)\}", text)]
    return Picture(unit_x, unit_y, nodes, box, stated, label_pt, sizes)


def tex_glyphs(label: str) -> int:
    r"""Typewriter glyphs a label's LaTeX prints, roughly and on its own: {\charNN} and \textvisiblespace{} one each,
    \ldots{} three, \ddtuni{HEX}{c} (U+HEX, small) five, braces none."""
    label = re.sub(r"\\ddtuni\{[0-9A-F]+\}\{.\}", "UUUUU", label)
    label = re.sub(r"\\ldots\{\}", "...", label)
    label = re.sub(r"\{\\char\d+\}|\\ensuremath\{\\\w+\}|\\\w+\{\}|\\.", "c", label)
    return len(label.replace("{", "").replace("}", ""))


def stated_cm(line: str) -> tuple[float, float]:
    m = re.search(r"^\w+: ([\d.]+) cm x ([\d.]+) cm", line)
    return float(m[1]), float(m[2])


def media_box_cm(pdf: bytes) -> tuple[float, float]:
    """The first page's MediaBox (cm), from the PDF's bytes or its compressed object streams (pdfTeX's)."""
    chunks = [pdf]
    for m in re.finditer(rb"stream\r?\n", pdf):
        try:
            chunks.append(zlib.decompressobj().decompress(pdf[m.end():]))
        except zlib.error:
            pass
    for c in chunks:
        m = re.search(rb"/MediaBox\s*\[\s*([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s+([-\d.]+)\s*\]", c)
        if m:
            x0, y0, x1, y1 = map(float, m.groups())
            return (x1 - x0) / 72 * 2.54, (y1 - y0) / 72 * 2.54
    raise AssertionError("no MediaBox in the PDF")


# ---------------------------------------------------------------------------------------------------------
# TikZ
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["trace", "long"])
def test_default_tikz_tree_is_a_column_wide_by_its_own_coordinates(request, which, k):
    """Every node with its label (at the picture's x= and the label's \\fontsize) lies inside the picture's
    rectangle, and that is at most a column wide: before, a deep tree was ~26 cm."""
    t = request.getfixturevalue(which)
    text = ex.export_figure(t, k, "tikz").decode()
    p = picture(text)
    layout = layout_of(t, k)
    assert p.width <= COLUMN + 1e-9 and p.width > COLUMN * 0.5
    assert set(p.nodes) == {n.id for n in layout.nodes}
    labels = {int(m[2]): m[1] for m in re.finditer(r"label=\{\[ddt label\]above:\{(.*)\}\}(?:, label=[^\n]*)?\] "
                                                   r"\(n(\d+)\)", text)}
    x0, _, x1, _ = p.box
    for n in layout.nodes:
        x, y = p.nodes[n.id]
        assert (x, y) == (pytest.approx(n.x, abs=1e-3), pytest.approx(n.y, abs=1e-3))
        half = (tex_glyphs(labels[n.id]) * 0.531 * p.label_pt + 2) * PT_CM / 2  # the typewriter label, its inner sep
        assert x0 - 1e-3 <= x * p.unit_x - half and x * p.unit_x + half <= x1 + 1e-3, (n, labels[n.id])
    span = max(x for x, _ in p.nodes.values()) * p.unit_x
    assert span <= COLUMN  # the depth columns alone fit; before, each was >= 1.6 cm (a 16-depth tree: 26 cm)


def test_full_width_is_wider_than_a_column_and_within_the_text(long, k):
    col, full = (picture(ex.export_figure(long, k, "tikz", width=w).decode()) for w in ("column", "full"))
    assert col.width <= COLUMN + 1e-9 < full.width <= FULL + 1e-9
    assert full.unit_x > col.unit_x and full.label_pt >= col.label_pt
    cm12 = picture(ex.export_figure(long, k, "tikz", width=12 / 2.54).decode())  # any length (inches in Python)
    assert col.width < cm12.width <= 12 + 1e-9


def test_fonts_are_absolute_and_as_stated(trace, long, k):
    """Labels 8 pt where the tree fits, shrunk then cut (6 pt) where it does not, and the line says which; no text
    under 6 pt but the small U+HEX of a character pdfLaTeX's fonts lack; title 9 pt, caption 8 pt."""
    for t, pt in ((trace, 8), (long, 6)):
        d = ex.export(t, k, "tikz", caption="a caption")
        p = picture(d.data.decode())
        assert p.stated == d.size.describe() and d.size.label_pt == p.label_pt == pt
        assert f", {pt} pt labels" in p.stated
        assert min(p.sizes) == tikz.UNI_PT and sorted(set(p.sizes))[1] >= paper.MIN_LABEL_PT
        assert rf"ddt title/.style={{font=\sffamily\fontsize{{9}}" in p.stated + d.data.decode()
        assert rf"ddt caption/.style={{font=\sffamily\fontsize{{8}}" in d.data.decode()
        assert r"\scriptsize" not in d.data.decode() and r"\tiny" not in d.data.decode()  # relative sizes: none
    note = ex.export(long, k, "tikz").size.notes
    assert len(note) == 1 and note[0].startswith("labels cut to") and "--width full" in note[0]
    assert r"\ldots{}" in ex.export_figure(long, k, "tikz").decode()  # where a label was cut


def test_a_tree_too_deep_for_a_column_says_so(trace, k):
    """Forty depth columns of long labels cannot fit 8.5 cm even cut to three glyphs at 6 pt: the picture is as wide
    as it must be and its line says so, and what to do."""
    parts = ex.tree_parts(trace, k - 1, ex.ExportOptions())
    layout = parts.layout
    deep = dataclasses.replace(layout, nodes=tuple(dataclasses.replace(n, x=n.x * 6, label="abcdefgh")
                                                   for n in layout.nodes))
    d = tikz.tree_tikz(deep, parts.fills, parts.scheme, cmin=parts.cmin, cmax=parts.cmax)
    p = picture(d.text)
    assert p.width > COLUMN and p.label_pt == paper.MIN_LABEL_PT
    assert any(n.startswith("does not fit a column (8.5 cm) even at 6 pt labels") and "--width full" in n
               for n in d.size.notes)
    assert stated_cm(d.size.describe()) == (round(p.width, 1), round(p.height, 1))


@pytest.mark.parametrize("figure", ex.FIGURES)
def test_every_tikz_figure_fits_and_says_its_size(trace, k, figure):
    for width, target in (("column", COLUMN), ("full", FULL)):
        d = ex.export(trace, k, "tikz", figure=figure, width=width)
        p = picture(d.data.decode())
        assert p.width <= target + 1e-9 and p.stated == d.size.describe()
        assert stated_cm(p.stated) == (round(p.width, 1), round(p.height, 1))
        assert ex.export(trace, k, "tikz", figure=figure, width=width).data == d.data  # the same bytes again


@pytest.mark.parametrize("figure", ["tree", "mask"])
def test_compiled_tikz_page_is_the_stated_size(trace, long, k, tmp_path, figure):
    """Compiled alone (a 4 pt border around the picture), the PDF page is the stated size: the rectangle holds every
    mark, so the measurements of the labels were generous enough."""
    engines = [e for e in ("pdflatex", "lualatex") if shutil.which(e)]
    if not engines:
        pytest.skip("no pdflatex / lualatex installed: the picture's own coordinates are checked above")
    for t, name in ((trace, "trace"), (long, "long")):
        if figure == "mask" and name == "long":
            continue
        d = ex.export(t, k, "tikz", figure=figure, standalone=True)
        w, h = stated = (d.size.width_cm, d.size.height_cm)
        folder = tmp_path / name
        folder.mkdir()
        pdf = compile_tex(engines[0], d.data.decode(), folder)
        pw, ph = media_box_cm(pdf)
        border = 2 * 4 * PT_CM
        assert pw - border == pytest.approx(w, abs=0.03), (name, stated, (pw, ph))
        assert ph - border == pytest.approx(h, abs=0.1), (name, stated, (pw, ph))
        assert pw - border <= COLUMN + 0.03
        if shutil.which("pdfinfo"):  # a PDF reader agrees
            out = subprocess.run(["pdfinfo", str(folder / "fig.pdf")], capture_output=True, text=True).stdout
            bp = float(re.search(r"Page size:\s+([\d.]+) x", out)[1])
            assert bp / 72 * 2.54 == pytest.approx(pw, abs=0.01)


# ---------------------------------------------------------------------------------------------------------
# Matplotlib (SVG, PDF, PNG)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("figure", ex.FIGURES)
def test_pdf_media_box_is_the_stated_size(trace, k, figure):
    for width, target in (("column", COLUMN), ("full", FULL)):
        d = ex.export(trace, k, "pdf", figure=figure, width=width)
        w, h = media_box_cm(d.data)
        assert (round(w, 2), round(h, 2)) == (round(d.size.width_cm, 2), round(d.size.height_cm, 2)) == \
            (target, round(h, 2))
        assert stated_cm(d.size.describe()) == (round(w, 1), round(h, 1))
        assert ex.export(trace, k, "pdf", figure=figure, width=width).data == d.data  # byte-stable


def test_matplotlib_labels_shrink_then_cut_and_say_so(long, k):
    from ddtree_viz.render import mpl

    col = ex.export(long, k, "svg")
    assert col.size.label_pt >= mpl.LABEL_MIN_PT and any(n.startswith("labels cut to") for n in col.size.notes)
    assert "…" in col.data.decode()
    wide = ex.export(long, k, "svg", width=12.0)
    assert not wide.size.notes and "_abcdefghij" in wide.data.decode()
    png = ex.export(long, k, "png", dpi=100)
    assert png.size.fmt == "PNG" and round(png.size.width_cm, 1) == COLUMN


# ---------------------------------------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_file(trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    trace.save(path)
    return path


@pytest.mark.parametrize("width,fmt", [(None, "tex"), ("full", "tex"), ("12cm", "tex"), (None, "pdf"),
                                       ("3.3in", "pdf")])
def test_cli_prints_the_size_of_the_file_it_wrote(trace_file, trace, k, tmp_path, capsys, width, fmt):
    out = tmp_path / f"fig.{fmt}"
    argv = ["export", "--trace", str(trace_file), "--step", str(k), "--out", str(out)]
    assert cli.main(argv + (["--width", width] if width else [])) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^(TikZ|PDF): ", line)]
    assert len(said) == 1
    w, h = stated_cm(said[0])
    if fmt == "tex":
        p = picture(out.read_text(encoding="utf-8"))
        assert said[0] == p.stated and (w, h) == (round(p.width, 1), round(p.height, 1))
    else:
        mw, mh = media_box_cm(out.read_bytes())
        assert (w, h) == (round(mw, 1), round(mh, 1))
    target = {None: COLUMN, "full": FULL, "12cm": 12.0, "3.3in": 3.3 * 2.54}[width]
    assert w <= round(target, 1) and ("pt labels" in said[0])


@pytest.mark.parametrize("argv,words", [
    (["--width", "huge"], "error: the width must be a number of centimetres or a length such as 8.5cm"),
    (["--width", "0"], "the width must be from 0.5 to 200 in (1.27 to 508 cm), not '0'"),
    (["--width", "-3"], "or column: 8.5 cm, full: 17.5 cm"),
    (["--width", "1e9"], "the width must be from 0.5 to 200 in"),
    (["--width", "8,5"], "not '8,5'"),
    (["--width", "12ft"], "not '12ft'"),
    (["--width", "600cm"], "(1.27 to 508 cm), not '600cm'"),
    (["--height", "tall"], "error: the height must be a number of centimetres"),
])
def test_cli_bad_widths_exit_2_with_a_clear_message(trace_file, tmp_path, capsys, argv, words):
    assert run_cli(["export", "--trace", str(trace_file), "--out", str(tmp_path / "f.tex"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: ") and words in err and "Traceback" not in err, err
    assert not (tmp_path / "f.tex").exists()


def test_lengths_and_the_python_api():
    assert length_inches("8.5cm") == pytest.approx(8.5 / 2.54) and length_inches("10") == pytest.approx(10 / 2.54)
    assert length_inches("85 mm") == pytest.approx(8.5 / 2.54) and length_inches("3.3in") == 3.3
    assert length_inches("241pt") == pytest.approx(241 / 72.27)
    with pytest.raises(InputError, match="width must be column or full or a number of inches"):
        ex.ExportOptions(width="wide")
    with pytest.raises(InputError, match="from 0.5 to 200 inches"):
        ex.ExportOptions(width=0.1)
    assert paper.width_cm(None) == paper.width_cm("column") == COLUMN and paper.width_cm(2) == 5.08

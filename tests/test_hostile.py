"""Hostile and clumsy traces at scale (issue #19): generated mutations of a real session's trace (types, ranges,
invariants, sizes, encodings, nesting, numbers) go through the loader the CLI and the page use. Every case must end
in a clear refusal (a TraceError naming the problem, one line) or a correct render (every page view, every export,
Download trace), within a bounded time and memory (the rise of the process's peak resident memory, VmHWM, over
the case). The figures (cases tried / refused / rendered, max time and
memory per case) are printed and written to artifacts/hostile-suite.json.

Rendering costs: every accepted case gets the page's views (both phases) and the JSON / TikZ exports and a
Download round trip; the matplotlib exports (SVG / PDF / PNG) and the HTML export, which cost a second or so each,
run for every case whose text or numbers reach a figure (encodings, numbers, sizes) and for the trace as recorded."""

from __future__ import annotations

import copy
import json
import math
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddtree_viz import trace as T
from ddtree_viz.trace import validation as trace_validation
from ddtree_viz.page.host import ModelHost
from ddtree_viz.page.state import TabState
from ddtree_viz.page.views import render_views
from ddtree_viz.render.layout import PHASES
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.sampling import Sampler
from ddtree_viz.engine.session import DecodeSession, greedy_decode
from ddtree_viz.errors import InputError, TraceError
from ddtree_viz.render import export as ex
from ddtree_viz.trace import Trace
from tests.tiny import tiny_pair

ROOT = Path(__file__).resolve().parents[1]
CASE_SECONDS = 30.0  # a bound no case may pass (the largest rounds, every export, on a slow shared CI machine)
CASE_BYTES = 1_500_000_000  # how far one case may raise the process's resident memory above where it started
VIEW_BYTES = 16_000_000  # what the page would send for one round's views (JSON of every figure and HTML)
NO_MODEL = ModelHost(None, None, "float32", "cpu")  # replay: no model, as the page in replay mode
HOSTILE_TEXT = ['say "hi"', "it's", "a & b", "&quot;", "&amp;lt;", "<br>", "x<br>y", "<b>bold</b>",
                "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "%{y}", "$x^2$", "\\end{document}",
                "#%&~_^{}", "\x00\x07\x1b[31m\x7f", "\u202eevil", "zero\u200bwidth", "\ufeffbom", "\uffff\ufffe",
                "é中🙂", "e\u0301", "\n\t\r", " ", "", "]]>--><!--", "x" * T.MAX_TOKEN_CHARS]


# ---------------------------------------------------------------------------------------------------------------
# A real session's trace, and what the suite records
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real() -> dict:
    """A real session's trace as JSON data: several rounds, accepted drafts, greedy reference."""
    pair = tiny_pair("hybrid", seed=3)
    prompt = 'def f(x):\n    return "<b>" & x'
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    greedy = greedy_decode(pair.target, ids, 14, pair.eos_token_ids).ids
    # oracle drafts (greedy's tokens at ranks 0 and 1): accepted paths, rejected siblings, the real records
    session = DecodeSession(pair, budget=6, max_new_tokens=14,
                            proposer=OracleProposer(greedy, len(ids), [0, 1], pair.target.config.vocab_size))
    session.prefill(prompt)
    session.run()
    data = json.loads(session.to_trace().to_json())
    assert len(data["steps"]) >= 3 and any(len(s["accepted"]) > 1 for s in data["steps"])
    return data


@dataclass
class Tally:
    cases: list[dict] = field(default_factory=list)

    def add(self, category: str, name: str, outcome: str, seconds: float, peak: int, detail: str = "") -> None:
        self.cases.append(dict(category=category, name=name, outcome=outcome, seconds=round(seconds, 4),
                               peak_bytes=peak, detail=detail[:200]))


TALLY = Tally()


def _status(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes (Linux)."""
    match = re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) * 1024


def memory_mark() -> int:
    """Reset the peak resident memory (VmHWM) to now, and return the resident memory now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def memory_growth(start: int) -> int:
    """How far the peak resident memory rose above `start` since memory_mark()."""
    return max(0, _status("VmHWM") - start)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if not TALLY.cases:
        return
    summary = summarise(TALLY.cases)
    (ROOT / "artifacts").mkdir(exist_ok=True)
    (ROOT / "artifacts" / "hostile-suite.json").write_text(json.dumps(dict(summary=summary, cases=TALLY.cases),
                                                                      indent=1, ensure_ascii=True))
    print("\nhostile suite:", json.dumps(summary))


def summarise(cases: list[dict]) -> dict:
    slowest = max(cases, key=lambda c: c["seconds"])
    biggest = max(cases, key=lambda c: c["peak_bytes"])
    return dict(tried=len(cases), refused=sum(c["outcome"] == "refused" for c in cases),
                rendered=sum(c["outcome"] == "rendered" for c in cases),
                max_seconds=slowest["seconds"], slowest=f"{slowest['category']}: {slowest['name']}",
                max_memory_growth_mb=round(biggest["peak_bytes"] / 2**20, 1), biggest=f"{biggest['category']}: {biggest['name']}",
                by_category={cat: sum(c["category"] == cat for c in cases) for cat in dict.fromkeys(c["category"] for c in cases)})


# ---------------------------------------------------------------------------------------------------------------
# One case: load (as the CLI and the page do), then refuse clearly or render everything correctly
# ---------------------------------------------------------------------------------------------------------------

ALLOWED_PLOTLY_TAGS = re.compile(r"</?(br|b|sub|i|extra)>")


def plotly_strings(obj, out=None) -> list[str]:
    out = [] if out is None else out
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("hovertemplate",):
                plotly_strings(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            plotly_strings(v, out)
    return out


def check_plotly(fig_json: dict) -> None:
    """Text for plotly: no tag but plotly's own (<br>, <b>, <sub>), and no entity plotly would draw literally."""
    for s in plotly_strings(fig_json):
        assert "<" not in ALLOWED_PLOTLY_TAGS.sub("", s), s[:200]
        for entity in re.findall(r"&[#a-zA-Z0-9]+;", s):
            assert entity in ("&amp;", "&lt;", "&gt;") or entity.startswith("&#"), (entity, s[:200])


def checked_json(spec) -> str:
    """A view's figure as the page sends it (FigureSpec.to_json), its data and layout first checked by plotly
    (go.Figure validates every property; a bad one raises). The template FigureSpec adds to every figure is the
    same each time: validated once (test_the_figures_template_is_valid_plotly), not in each of the suite's ~1,000
    figures, where it took ~20 ms of each figure's ~22 ms."""
    import plotly.graph_objects as go

    go.Figure(data=spec.data, layout=spec.layout)
    return spec.to_json()


def test_the_figures_template_is_valid_plotly():
    """The template every FigureSpec carries (plotly's default, tick labels as they fall) passes plotly's checks,
    and a figure built with it validates as the same figure: what checked_json leaves out of each figure."""
    import plotly.graph_objects as go

    from ddtree_viz.render.figure import FigureSpec, _template

    go.layout.Template(_template())
    spec = FigureSpec(data=[dict(type="heatmap", z=[[1, 2]])], layout=dict(title=dict(text="t")))
    assert json.loads(spec.figure().to_json()) == json.loads(spec.to_json())


def render_everything(trace: Trace, level: str) -> None:
    """Render what the page and the exports would, and check it. level "light": the page's views of the first and
    last rounds, the JSON export, Download trace and loading it back; "full": also the drafted phase, every figure
    as JSON and TikZ, the HTML export's figure, SVG (parsed as XML, with hostile titles), PNG and PDF; "big" (one
    round at the size limits): the views, JSON, TikZ, the HTML export's figure, and SVG within
    export.MAX_FIGURE_POSITIONS (past it a clear InputError)."""
    rounds = sorted({0, len(trace.steps) - 1}) if trace.steps else []
    tab = TabState(trace=trace, replay=True)
    for k in rounds or [0]:
        for phase in PHASES if level == "full" else ("verified",):
            tab.view = k
            v = render_views(NO_MODEL, tab, phase)
            sent = 0
            for name in ("tree", "mask", "cache_chart", "acceptance"):
                spec = v[f"{name}_spec"]
                if spec is not None:
                    text = checked_json(spec)
                    sent += len(text)
                    check_plotly(json.loads(text))
            for html in (v.status, v.diff_html, v.stats, v.divergence):
                sent += len(html)
                assert "<script" not in html and "<img" not in html
            assert sent < VIEW_BYTES, sent
    back = Trace.from_json(trace.to_json())  # Download trace, and loading it again
    assert back == trace
    if not rounds:
        return
    k = rounds[-1]
    figures = ex.FIGURES if level == "full" else ("tree",)
    for figure in figures:
        data = json.loads(ex.export_figure(trace, k + 1, "json", figure=figure))
        assert ex.step_from_export(data) == trace.steps[k]
    if level == "light":
        return
    for figure in figures:
        assert ex.export_figure(trace, k + 1, "tikz", figure=figure).decode().count(r"\begin{tikzpicture}") == 1
    o = ex.make_options(title='a "b" & <br> c')
    check_plotly(json.loads(ex.plotly_figure(trace, k, o).to_json()))  # the HTML export's figure
    try:
        ET.fromstring(ex.export_figure(trace, k + 1, "svg", title='t "q" & <br> ctl \x01\x1b end', caption="c \x00 <b>"))
    except InputError as exc:  # only a round too large to draw
        assert level == "big" and str(ex.MAX_FIGURE_POSITIONS) in str(exc), exc
        return
    if level == "full":
        assert ex.export_figure(trace, k + 1, "html", options=o).startswith(b"<!DOCTYPE html>")
        ET.fromstring(ex.export_figure(trace, k + 1, "svg", figure="mask"))
        assert ex.export_figure(trace, k + 1, "png", dpi=30).startswith(b"\x89PNG")
        assert ex.export_figure(trace, k + 1, "pdf", figure="acceptance").startswith(b"%PDF")


def run_case(category: str, name: str, text: str | bytes, *, expect: str = "either", words: str | None = None,
             level: str = "light", path: Path | None = None) -> str:
    """Load `text` (or the file at `path`) as the CLI and the page do; refuse clearly or render everything. Returns
    'refused' or 'rendered'; records time and peak memory."""
    base = memory_mark()
    start = time.perf_counter()
    detail = ""
    try:
        trace = Trace.load(path, name="upload.json") if path is not None else Trace.from_json(text)
    except TraceError as exc:
        message = str(exc)
        outcome, detail = "refused", message
        assert message and "\n" not in message and len(message) < 500, (name, message)
        assert "Traceback" not in message and str(path or "/nonexistent") not in message.replace("upload.json", "")
        if words is not None:
            assert words in message, (name, message)
    else:
        outcome = "rendered"
        render_everything(trace, level)
    seconds = time.perf_counter() - start
    peak = memory_growth(base)
    TALLY.add(category, name, outcome, seconds, peak, detail)
    assert expect in ("either", outcome), f"{category}: {name}: expected {expect}, got {outcome} ({detail})"
    assert seconds < CASE_SECONDS and peak < CASE_BYTES, (name, seconds, peak)
    return outcome


def dumps(data) -> str:
    return json.dumps(data, ensure_ascii=False, allow_nan=True)


def mutated(data: dict, fn) -> str:
    d = json.loads(dumps(data))  # a deep copy (the trace is JSON data), several times faster than copy.deepcopy
    fn(d)
    return dumps(d)


# ---------------------------------------------------------------------------------------------------------------
# The trace as recorded, and real sessions of every kind
# ---------------------------------------------------------------------------------------------------------------


def test_real_sessions_of_every_kind_validate_and_render(real):
    """The engine's own traces always pass validation: DDTree and DFlash, exact and naive, sampled, the runner
    engine, a session saved mid-run, one without the greedy reference."""
    run_case("real", "as recorded", dumps(real), expect="rendered", level="full")
    pair = tiny_pair("hybrid", seed=5)
    kinds = {"dflash": dict(method="dflash"), "naive": dict(verify="naive"), "runner": dict(engine="runner"),
             "sampled": dict(sampler=Sampler(0.8, 20, 0.9, 7))}
    for name, over in kinds.items():
        session = DecodeSession(pair, **{"budget": 6, "max_new_tokens": 8, **over})
        session.prefill("import os\n")
        session.step()
        run_case("real", f"{name}, mid-run", session.to_trace().to_json(), expect="rendered")
        run_case("real", f"{name}, no greedy", session.to_trace(with_greedy=False).to_json(), expect="rendered")
        session.run()
        run_case("real", name, session.to_trace().to_json(), expect="rendered")
    zero = DecodeSession(pair, budget=4, max_new_tokens=4)
    zero.prefill("a")
    run_case("real", "prefilled, no rounds", zero.to_trace().to_json(), expect="rendered")


# ---------------------------------------------------------------------------------------------------------------
# Types: every field of every record kind, replaced by every kind of JSON value
# ---------------------------------------------------------------------------------------------------------------

VALUES = {"null": None, "true": True, "string": "x", "list": [], "object": {}, "-1": -1, "1.5": 1.5,
          "1e40": 10**40, "NaN": math.nan, "inf": math.inf, "0": 0}


def field_paths(data: dict) -> list[tuple]:
    """Paths to every field of one of each record kind (and the known settings)."""
    step, node = data["steps"][0], data["steps"][0]["nodes"][1]
    layer = step["cache"][0]
    paths = [(k,) for k in data if k not in ("steps", "settings")]
    paths += [("steps", 0, k) for k in step]
    paths += [("steps", 0, "nodes", 1, k) for k in node] + [("steps", 0, "nodes", 0, k) for k in ("parent", "rank")]
    paths += [("steps", 0, "cache", 0, k) for k in layer]
    paths += [("steps", 0, "cache", 0, "tensors", 0, k) for k in layer["tensors"][0]]
    paths += [("settings", k) for k in data["settings"]]
    return paths


def put(data, path, value) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def test_every_field_with_every_type(real):
    tried = 0
    for path in field_paths(real):
        for label, value in VALUES.items():
            name = ".".join(map(str, path)) + " = " + label
            run_case("types", name, mutated(real, lambda d: put(d, path, copy.deepcopy(value))))
            tried += 1
        run_case("types", ".".join(map(str, path)) + " removed", mutated(real, lambda d: _delete(d, path)))
    assert tried >= 500


def _delete(data, path) -> None:
    for key in path[:-1]:
        data = data[key]
    del data[path[-1]]


# ---------------------------------------------------------------------------------------------------------------
# Ranges and invariants: what the engine never writes (issue #19, defects 3, 4 and 8)
# ---------------------------------------------------------------------------------------------------------------


def _not_child_of_root(d) -> int:
    nodes = d["steps"][0]["nodes"]
    return next(n["id"] for n in nodes if n["parent"] not in (-1, 0))


def _drop_greedy_tail(d) -> None:
    d["greedy_ids"] = d["output_ids"][:-3]


def _cut_short(d) -> None:
    """The first round's added tokens cut to one (as when the output ends), yet more rounds follow."""
    step = d["steps"][0]
    step["new_token_ids"] = step["new_token_ids"][:1] if len(step["new_token_ids"]) > 1 else [7, 7]


INVARIANTS = {
    # first_divergence (the CLI printed 'DIVERGES at token -1' where the page said identical)
    "first_divergence -1": (lambda d: d.update(first_divergence=-1), "first_divergence"),
    "first_divergence past the end": (lambda d: d.update(first_divergence=len(d["output_ids"]) + 5), "first_divergence"),
    "first_divergence where identical": (lambda d: d.update(first_divergence=0), "first_divergence"),
    "first_divergence without a reference": (lambda d: d.update(greedy_ids=None, first_divergence=2), "no reference"),
    "a divergence margin where identical": (lambda d: d.update(divergence_margin=0.5), "divergence_margin"),
    "output differs from the reference it claims to equal": (
        lambda d: d["greedy_ids"].__setitem__(1, d["greedy_ids"][1] + 1), "first_divergence"),
    # accepted paths
    "accepted path not a parent chain": (lambda d: d["steps"][0].update(accepted=[0, _not_child_of_root(d)]), "accepted"),
    "accepted path repeats the root": (lambda d: d["steps"][0].update(accepted=[0, 0]), "accepted"),
    "accepted path stops early": (lambda d: d["steps"][_longest(d)].update(accepted=d["steps"][_longest(d)]["accepted"][:1]),
                                  "accepted"),
    "accepted path empty": (lambda d: d["steps"][0].update(accepted=[]), "accepted"),
    "bonus is not the target's choice": (lambda d: d["steps"][0].update(bonus_token_id=d["steps"][0]["bonus_token_id"] + 1),
                                         "bonus_token_id"),
    # lengths that disagree with the rounds
    "output_ids shorter than the rounds produced": (lambda d: d.update(output_ids=d["output_ids"][:-2]), "output_ids"),
    "output_ids empty": (lambda d: d.update(output_ids=[]), "output_ids"),
    "greedy_ids shorter than the rounds produced": (_drop_greedy_tail, "greedy_ids"),
    "more output than max_new_tokens": (lambda d: d["settings"].update(max_new_tokens=2), "max_new_tokens"),
    "new_token_ids not from the path": (lambda d: d["steps"][0].update(new_token_ids=[999]), "new_token_ids"),
    "new_token_ids cut short mid-trace": (_cut_short, "new_token_ids"),
    # negative ids, indices, lengths
    "negative token id": (lambda d: d["steps"][0]["nodes"][1].update(token_id=-1), "token id"),
    "token id past 2^31": (lambda d: d["steps"][0]["nodes"][1].update(token_id=2**31), "token id"),
    "negative prompt id": (lambda d: d["prompt_ids"].__setitem__(0, -5), "prompt_ids"),
    "negative round index": (lambda d: d["steps"][0].update(index=-1), "index"),
    "negative committed length": (lambda d: d["steps"][0].update(committed_len=-3), "committed"),
    "negative rank": (lambda d: d["steps"][0]["nodes"][1].update(rank=-2), "rank"),
    "negative cache bytes": (lambda d: d["steps"][0]["cache"][0].update(bytes=-1), "bytes"),
    "negative tensor size": (lambda d: d["steps"][0]["cache"][0]["tensors"][0].update(shape=[1, -4]), "shape"),
    "negative time": (lambda d: d["steps"][0]["timings_ms"].update(verify=-2.0), "timings_ms"),
    # depths, per-node arrays, caches, rounds
    "depth disagrees with parents": (lambda d: d["steps"][0]["nodes"][1].update(depth=5), "depth"),
    "root not at depth 0": (lambda d: d["steps"][0]["nodes"][0].update(depth=1), "depth"),
    "root with a rank": (lambda d: d["steps"][0]["nodes"][0].update(rank=0), "root"),
    "root token differs from root_token_id": (lambda d: d["steps"][0].update(root_token_id=d["steps"][0]["root_token_id"] + 1),
                                              "root"),
    "target_argmax one short": (lambda d: d["steps"][0]["target_argmax"].pop(), "target_argmax"),
    "target_margin one long": (lambda d: d["steps"][0]["target_margin"].append(1.0), "target_margin"),
    "target_choice of the wrong length": (lambda d: d["steps"][0].update(target_choice=[1]), "target_choice"),
    "target_prob without target_choice": (lambda d: d["steps"][0].update(target_prob=[0.5] * len(d["steps"][0]["nodes"])),
                                          "target_prob"),
    "probability above 1": (lambda d: d["steps"][0].update(target_choice=d["steps"][0]["target_argmax"],
                                                           target_prob=[1.5] * len(d["steps"][0]["nodes"])), "probability"),
    "positive log-prob": (lambda d: d["steps"][0]["nodes"][1].update(logprob=0.5), "log-prob"),
    "negative margin": (lambda d: d["steps"][0]["target_margin"].__setitem__(0, -1.0), "margin"),
    "cache list one layer short": (lambda d: d["steps"][1]["cache"].pop(), "layers"),
    "cache_before_commit one layer long": (lambda d: d["steps"][0]["cache_before_commit"].append(
        d["steps"][0]["cache_before_commit"][0]), "layer"),
    "prefill cache one layer short": (lambda d: d["prefill_cache"].pop(), "layers"),
    "cache layers out of order": (lambda d: d["steps"][0]["cache"][0].update(layer=1), "layer"),
    "naive state error of the wrong length": (lambda d: d["steps"][0].update(naive_state_error=[0.1]), "naive_state_error"),
    "duplicate round index": (lambda d: d["steps"][1].update(index=0), "index"),
    "rounds out of order": (lambda d: d["steps"].reverse(), "index"),
    "a round dropped": (lambda d: d["steps"].pop(1), "steps[1]"),
    "a round repeated": (lambda d: d["steps"].insert(1, copy.deepcopy(d["steps"][0])), "steps[1]"),
    "committed length off by one": (lambda d: d["steps"][1].update(committed_len=d["steps"][1]["committed_len"] + 1),
                                    "committed_len"),
    "first round not after the prompt": (lambda d: d["steps"][0].update(committed_len=d["steps"][0]["committed_len"] - 1),
                                         "committed_len"),
    "round not starting from the last bonus": (lambda d: _reroot(d["steps"][1]), "root_token_id"),
    "prompt_ids empty with rounds": (lambda d: d.update(prompt_ids=[]), "prompt_ids"),
    "unknown method": (lambda d: d["steps"][0].update(method="beam"), "method"),
    "unknown verify mode": (lambda d: d["steps"][0].update(verify="sideways"), "verify"),
    "settings: top_p a string": (lambda d: d["settings"].update(top_p="high"), "top_p"),
    "settings: temperature negative": (lambda d: d["settings"].update(temperature=-1), "temperature"),
    "settings: block size below the tree": (lambda d: d["settings"].update(block_size=2), "block size"),
    "budget_curve with a gap": (lambda d: d["steps"][0].update(budget_curve={"1": 1, "3": 2}), "budget_curve"),
    "a drafter top-k row past the cap": (lambda d: d["steps"][0].update(draft_top_ids=[list(range(300))],
                                                                        draft_top_logprobs=[[-1.0] * 300]), "at most"),
    "divergence verdict where identical": (lambda d: d.update(divergence_verdict="noise"), "divergence_verdict"),
    "unknown divergence verdict": (lambda d: d.update(greedy_ids=d["greedy_ids"][:1] + [d["greedy_ids"][1] + 1]
                                                      + d["greedy_ids"][2:], first_divergence=1,
                                                      divergence_verdict="maybe"), "divergence_verdict"),
}


def _longest(d) -> int:
    return max(range(len(d["steps"])), key=lambda i: len(d["steps"][i]["accepted"]))


def _reroot(step) -> None:
    """A round whose root is not the previous bonus, otherwise consistent."""
    new = step["root_token_id"] + 1
    step["root_token_id"] = new
    step["nodes"][0]["token_id"] = new


def test_invariants_the_engine_guarantees_are_refused_by_name(real):
    assert len(real["steps"][0]["new_token_ids"]) >= 1 and len(real["steps"]) >= 3
    for name, (change, words) in INVARIANTS.items():
        run_case("invariants", name, mutated(real, change), expect="refused", words=words)


RANGE_VALUES = {"-1": -1, "-2^31": -(2**31), "2^31": 2**31, "2^53+1": 2**53 + 1, "1e40": 10**40, "NaN": math.nan,
                "inf": math.inf, "-inf": -math.inf, "1e308": 1e308, "-0.0": -0.0, "5e-324": 5e-324}


def test_number_ranges_in_every_numeric_field(real):
    """Ints and floats at and past every edge in every numeric field of a node, a round and the top level: NaN and
    infinite log-probs (defect 3) and huge integers (defect 4) are refused; the rest refuse or render."""
    node, step = real["steps"][0]["nodes"][1], real["steps"][0]
    paths = [("steps", 0, "nodes", 1, k) for k, v in node.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    paths += [("steps", 0, k) for k, v in step.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    paths += [("prefill_ms",), ("divergence_margin",), ("steps", 0, "timings_ms", "draft"),
              ("steps", 0, "target_margin", 0), ("steps", 0, "target_argmax", 0), ("output_ids", 0), ("prompt_ids", 0)]
    for path in paths:
        for label, value in RANGE_VALUES.items():
            must = "refused" if label in ("NaN", "inf", "-inf", "1e40", "2^53+1") else "either"
            run_case("numbers", ".".join(map(str, path)) + " = " + label, mutated(real, lambda d: put(d, path, value)),
                     expect=must, level="full" if label == "5e-324" and path[-1] == "logprob" else "light")
    # every node's log-prob NaN, then every one -inf: the page and every export once failed on these
    for value in (math.nan, -math.inf):
        def all_nodes(d, value=value):
            for s in d["steps"]:
                for n in s["nodes"][1:]:
                    n["logprob"] = value
        run_case("numbers", f"every log-prob {value}", mutated(real, all_nodes), expect="refused", words="finite")


# ---------------------------------------------------------------------------------------------------------------
# Encodings: hostile text everywhere a trace carries text (defects 5 and 9)
# ---------------------------------------------------------------------------------------------------------------


def _text_everywhere(d, text: str) -> None:
    d["prompt"] = d["output_text"] = d["target"] = d["draft"] = text
    d["settings"]["dtype"] = text
    for s in d["steps"]:
        for n in s["nodes"]:
            n["token"] = text
    d["token_texts"] = {k: text for k in d["token_texts"]}


def test_hostile_text_everywhere_renders_as_text(real):
    """Quotes, ampersands, angle brackets, <br>, scripts, control and invisible characters, noncharacters, very
    long tokens in every text field: the trace loads, and every view and export shows the text as text (plotly
    labels carry no &quot; and no tag of the token's own; SVG parses; JSON and Download round-trip)."""
    for text in HOSTILE_TEXT:
        run_case("encodings", f"text {text[:24]!r}", mutated(real, lambda d: _text_everywhere(d, text)),
                 expect="rendered")
    run_case("encodings", "every hostile text at once, every view and export", mutated(real, _texts_mixed),
             expect="rendered", level="full")


def _texts_mixed(d) -> None:
    """Each node, token text, name and setting its own hostile text."""
    texts = HOSTILE_TEXT
    d["prompt"], d["output_text"] = "".join(texts[:-1]), " ".join(texts[:-1])
    d["target"], d["draft"], d["settings"]["dtype"] = texts[0], texts[8], texts[14]
    i = 0
    for s in d["steps"]:
        for n in s["nodes"]:
            n["token"] = texts[i % len(texts)]
            i += 1
    d["token_texts"] = {k: texts[j % len(texts)] for j, k in enumerate(d["token_texts"])}


SURROGATE_PLACES = {
    "node token": lambda d, s: d["steps"][0]["nodes"][1].update(token=s),
    "prompt": lambda d, s: d.update(prompt=s),
    "output_text": lambda d, s: d.update(output_text=s),
    "token_texts value": lambda d, s: d["token_texts"].update({next(iter(d["token_texts"])): s}),
    "token_texts key": lambda d, s: d["token_texts"].update({s: "x"}),
    "target name": lambda d, s: d.update(target=s),
    "settings value": lambda d, s: d["settings"].update(device=s),
    "settings key": lambda d, s: d["settings"].update({s: 1}),
    "cache class": lambda d, s: d["steps"][0]["cache"][0].update(cache_class=s),
    "timings key": lambda d, s: d["steps"][0]["timings_ms"].update({s: 1.0}),
}


def test_unpaired_surrogates_are_refused_wherever_they_are(real):
    """JSON's \\ud800 escapes make strings no encoder can write: once loaded, Download trace and the JSON
    exports failed (defect 5). They are refused at load, naming the field."""
    for place, change in SURROGATE_PLACES.items():
        for s in ("\ud800", "a\udc80b", "\udfff"):
            text = json.dumps(json.loads(mutated(real, lambda d: change(d, s))))  # ASCII JSON with \\uXXXX escapes
            run_case("encodings", f"{place}: {s!r}", text, expect="refused", words="surrogate")


def test_file_encodings(real, tmp_path):
    """Bytes that are not UTF-8 JSON, through Trace.load (the CLI and the page's upload)."""
    good = dumps(real).encode("utf-8")
    files = {
        "UTF-8 BOM": b"\xef\xbb\xbf" + good, "UTF-16": dumps(real).encode("utf-16"), "Latin-1 bytes": good.replace(
            b"def", "dé".encode("latin-1")), "NUL bytes": b"\x00" * 64, "empty": b"", "whitespace": b" \n\t ",
        "truncated": good[: len(good) // 2], "two traces": good + good, "trailing garbage": good + b"\x1a",
        "null": b"null", "a list": b"[]", "a string": b'"trace"', "a number": b"1",
    }
    for name, data in files.items():
        path = tmp_path / "upload.json"
        path.write_bytes(data)
        run_case("encodings", f"file: {name}", b"", expect="refused", path=path)


# ---------------------------------------------------------------------------------------------------------------
# Nesting and numbers JSON itself can hold (defect 2)
# ---------------------------------------------------------------------------------------------------------------


def test_nesting_and_number_literals(real):
    body = dumps(real)[1:]
    cases = {
        "2,000 nested lists": ("[" * 2000 + "]" * 2000, "nested too deeply"),
        "100,000 nested lists": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        "2,000 nested objects in settings": (mutated(real, lambda d: d["settings"].update(x="@@hostile@@")).replace(
            '"@@hostile@@"', '{"a":' * 2000 + "1" + "}" * 2000), "nested too deeply"),
        f"{T.MAX_NESTING + 1} levels in settings": (mutated(real, lambda d: d["settings"].update(x=_nest(T.MAX_NESTING))),
                                                    "nested too deeply"),
        "5,000-digit integer": ('{"big": ' + "9" * 5000 + ", " + body, "cannot be read"),
        "5,000-digit token id": (_literal(real, lambda d, x: d["output_ids"].__setitem__(0, x), "9" * 5000),
                                 "cannot be read"),
        "401-digit integer where a number goes": (_literal(real, lambda d, x: d.update(prefill_ms=x), "9" * 401),
                                                  "prefill_ms"),
        "1e400 (infinite) log-prob": (mutated(real, lambda d: d["steps"][0]["nodes"][1].update(logprob="@@hostile@@")).replace(
            '"@@hostile@@"', "-1e400"), "finite"),
        "NaN literal": (mutated(real, lambda d: d["steps"][0]["nodes"][1].update(logprob=math.nan)), "finite"),
        "Infinity literal in settings": (mutated(real, lambda d: d["settings"].update(extra=math.inf)), "finite"),
        "duplicate keys (the last wins)": ('{"schema_version": 1, ' + body.replace('"schema_version": 1', '"schema_version": 7'),
                                           None),
    }
    for name, (text, words) in cases.items():
        run_case("nesting", name, text, expect="refused" if words else "either", words=words)
    run_case("nesting", f"{T.MAX_NESTING - 2} levels in settings (allowed)",
             mutated(real, lambda d: d["settings"].update(x=_nest(T.MAX_NESTING - 3))), expect="rendered")


def _literal(real: dict, put_at, literal: str) -> str:
    """The trace's JSON with `literal` written as is (a number no encoder would write) where put_at puts it."""
    return mutated(real, lambda d: put_at(d, "@@hostile@@")).replace('"@@hostile@@"', literal)


def _nest(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


# ---------------------------------------------------------------------------------------------------------------
# Sizes (defect 7): past every limit, refused at load in bounded time; at every limit, rendered in bounded time
# ---------------------------------------------------------------------------------------------------------------


def consistent_step(parents: list[int], tokens: list[int], accepted: list[int], committed: int, index: int,
                    cache: list) -> dict:
    """A round the engine could have recorded: depths from the parents, the target's choices leading along
    `accepted` and off the tree after it (the bonus)."""
    depths, children = [], {}
    for i, p in enumerate(parents):
        depths.append(0 if p < 0 else depths[p] + 1)
        children.setdefault(p, set()).add(tokens[i])
    choice = [1] * len(parents)
    for a, b in zip(accepted, accepted[1:]):
        choice[a] = tokens[b]
    last = accepted[-1]
    bonus = next(t for t in range(2, 10**6) if t not in children.get(last, set()))
    choice[last] = bonus
    for i in range(len(parents)):  # elsewhere: a token that is not a child (no effect on the walk)
        if i not in accepted:
            choice[i] = next(t for t in range(2, 10**6) if t not in children.get(i, set()))
    nodes = [dict(id=i, parent=p, depth=depths[i], token_id=tokens[i], token=f"t{tokens[i]}", logprob=0.0 if i == 0 else
                  -0.01 * (i % 700), rank=-1 if i == 0 else i % 97) for i, p in enumerate(parents)]
    new = [tokens[a] for a in accepted[1:]] + [bonus]
    return dict(index=index, committed_len=committed, root_token_id=tokens[0], nodes=nodes, target_argmax=choice,
                accepted=accepted, bonus_token_id=bonus, timings_ms=dict(draft=1.0, tree=0.1, verify=2.0, commit=0.5),
                cache=cache, new_token_ids=new, target_margin=[0.5] * len(parents))


def synthetic_trace(real: dict, rounds: list[tuple[list[int], list[int], list[int]]], block: int = 256) -> dict:
    """`real`'s context (prompt, settings, cache layout) with consistent rounds of the given shapes (parents, tokens,
    accepted path): each round starts where the previous one left off, from its bonus token."""
    d = copy.deepcopy(real)
    root, committed, output, steps = d["output_ids"][0], len(d["prompt_ids"]), [d["output_ids"][0]], []
    for i, (parents, tokens, accepted) in enumerate(rounds):
        step = consistent_step(parents, [root] + list(tokens[1:]), accepted, committed, i, d["steps"][0]["cache"])
        steps.append(step)
        output += step["new_token_ids"]
        root, committed = step["bonus_token_id"], committed + len(accepted)
    d["steps"], d["output_ids"] = steps, output
    d["greedy_ids"], d["first_divergence"], d["divergence_margin"] = list(output), None, None
    d["settings"].update(block_size=block, max_new_tokens=len(output), budget=max(len(r[0]) for r in rounds))
    return d


def one_round_trace(real: dict, parents: list[int], tokens: list[int], accepted: list[int], block: int = 256) -> dict:
    return synthetic_trace(real, [(parents, tokens, accepted)], block)


def many_rounds_trace(real: dict, rounds: int, width: int) -> dict:
    """`rounds` rounds of a root with `width` children, the first accepted: a long session's trace."""
    shape = ([-1] + [0] * width, list(range(1, width + 2)), [0, 1])
    return synthetic_trace(real, [shape] * rounds)


def test_sizes_past_the_limits_are_refused_quickly(real, tmp_path, monkeypatch):
    chain = lambda n: list(range(-1, n - 1))  # noqa: E731 - parents of an n-position chain
    cases = {
        # the two denial-of-service uploads
        "a 3,000-deep accepted chain (issue: 20 min at 100% CPU)": (
            one_round_trace(real, chain(3000), list(range(3000)), list(range(3000)), block=3001), "at most"),
        "20,001 positions in one round (issue: 542 MB response)": (
            one_round_trace(real, [-1] + [0] * 20000, list(range(20001)), [0]), "at most"),
        f"{T.MAX_NODES + 1} positions in one round": (
            one_round_trace(real, [-1] + [0] * T.MAX_NODES, list(range(T.MAX_NODES + 1)), [0]), "at most"),
        f"depth {T.MAX_DEPTH + 1}": (
            one_round_trace(real, chain(T.MAX_DEPTH + 2), list(range(T.MAX_DEPTH + 2)), [0], block=999), "deep"),
        f"{T.MAX_ROUNDS + 1} rounds": ({**real, "steps": [{}] * (T.MAX_ROUNDS + 1)}, "at most"),
        f"{T.MAX_OUTPUT_TOKENS + 1} output tokens": ({**real, "output_ids": [1] * (T.MAX_OUTPUT_TOKENS + 1)}, "at most"),
        f"a token of {T.MAX_TOKEN_CHARS + 1} characters": (
            mutated_data(real, lambda d: d["steps"][0]["nodes"][1].update(token="y" * (T.MAX_TOKEN_CHARS + 1))), "characters"),
        f"a prompt of {T.MAX_TEXT_CHARS + 1} characters": ({**real, "prompt": "p" * (T.MAX_TEXT_CHARS + 1)}, "characters"),
        f"{T.MAX_LAYERS + 1} cache layers": (mutated_data(real, lambda d: d["steps"][0].update(
            cache=[d["steps"][0]["cache"][0]] * (T.MAX_LAYERS + 1))), "at most"),
        "a tensor of 9 dimensions": (mutated_data(real, lambda d: d["steps"][0]["cache"][0]["tensors"][0].update(
            shape=[1] * 9)), "at most"),
    }
    for name, (data, words) in cases.items():
        run_case("sizes", name, dumps(data), expect="refused", words=words)
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # a sparse file just over the limit: refused from its size, never read
        f.truncate(T.MAX_TRACE_BYTES + 1)
    run_case("sizes", "a file over the size limit", b"", expect="refused", words="at most 64 MiB", path=big)
    # the total over all rounds (400,000 real positions is slow to build), where the checks read it
    monkeypatch.setattr(trace_validation, "MAX_TOTAL_NODES", 10)
    run_case("sizes", "more tree positions over all rounds than allowed", dumps(real), expect="refused",
             words="over all rounds")


def mutated_data(data: dict, fn) -> dict:
    d = copy.deepcopy(data)
    fn(d)
    return d


def test_sizes_at_the_limits_render_in_bounded_time(real):
    """The largest rounds a trace may hold render on the page and in every export within the bounds."""
    n, depth = T.MAX_NODES, T.MAX_DEPTH
    chain = list(range(-1, depth))
    cases = {
        f"{ex.MAX_FIGURE_POSITIONS - 1} positions (the largest figure SVG / PDF / PNG draw)": one_round_trace(
            real, [-1] + [(i - 1) // 4 for i in range(1, ex.MAX_FIGURE_POSITIONS - 1)],
            [0] + [(i % 4) + 2 for i in range(1, ex.MAX_FIGURE_POSITIONS - 1)], [0, 1, 5]),
        f"{depth}-deep accepted chain": one_round_trace(real, chain, list(range(depth + 1)), list(range(depth + 1))),
        f"{n} positions, 4-ary tree": one_round_trace(real, [-1] + [(i - 1) // 4 for i in range(1, n)],
                                                      [0] + [(i % 4) + 2 for i in range(1, n)], [0, 1, 5, 21]),
        f"{n} positions, all children of the root": one_round_trace(real, [-1] + [0] * (n - 1), list(range(n)), [0, 1]),
        "1,000 rounds (a long session: every view over all rounds stays linear)": many_rounds_trace(real, 1000, 16),
    }
    for name, data in cases.items():
        run_case("sizes", name, dumps(data), expect="rendered", level="big")


# ---------------------------------------------------------------------------------------------------------------
# The limits are the engine's own: every trace a session can write fits them
# ---------------------------------------------------------------------------------------------------------------


def test_trace_limits_match_what_the_engine_can_record():
    from ddtree_viz.engine import drafter, session
    from ddtree_viz.render import mask_plot

    assert T.MAX_NODES == session.MAX_BUDGET + 1  # a round's tree: the largest budget + the root
    assert T.MAX_OUTPUT_TOKENS == session.MAX_NEW_TOKENS and T.MAX_ROUNDS >= session.MAX_NEW_TOKENS - 1
    assert T.MAX_TOP_K >= session.MAX_TOP_K
    assert drafter.MAX_BLOCK_SIZE == T.MAX_DEPTH + 1  # a tree is at most block_size - 1 deep
    assert mask_plot.MAX_POSITIONS == 512 + 1  # the page's largest budget: its rounds' masks show whole
    assert ex.MAX_FIGURE_POSITIONS >= 512 + 2  # ... and its trees export (the bonus node included)


def test_compare_traces_are_validated_side_by_side(real, tmp_path):
    """A compare trace (two sessions) is two traces: each side is validated, the message says which."""
    good = {"schema_version": 1, "kind": "compare", "a": real, "b": real}
    path = tmp_path / "compare.json"
    path.write_text(dumps(good))
    assert T.load_any(path).a == T.load_any(path).b
    bad = copy.deepcopy(good)
    bad["b"]["first_divergence"] = -1
    path.write_text(dumps(bad))
    base = memory_mark()
    start = time.perf_counter()
    with pytest.raises(TraceError, match="compare trace: trace.first_divergence: -1"):
        T.load_any(path, name="compare.json")
    TALLY.add("invariants", "compare trace, side b inconsistent", "refused", time.perf_counter() - start,
              memory_growth(base))


# ---------------------------------------------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------------------------------------------


def test_zz_the_suite_covers_every_kind_of_case():
    """Runs last (the last test of the file): the figures the issue's closing note asks for."""
    if len(TALLY.cases) < 100:
        pytest.skip("run with the whole file for the figures")
    s = summarise(TALLY.cases)
    assert s["tried"] >= 800 and s["refused"] > 0 and s["rendered"] > 0
    assert set(s["by_category"]) >= {"real", "types", "invariants", "numbers", "encodings", "nesting", "sizes"}
    assert s["max_seconds"] < CASE_SECONDS


def test_page_error_messages_are_escaped():
    """gradio renders an error's message as HTML; messages quote user input (a file name, a prompt's character, a
    trace's field), so markup in them must show as text."""
    from ddtree_viz.errors import InputError
    from ddtree_viz.page.web.wiring import page_error as _page_error

    hostile = 'cannot read trace file <img src=x onerror="alert(1)">.json & more'
    for exc in (InputError(hostile), ValueError(hostile), RuntimeError("CUDA out of memory <b>x</b>")):
        message = _page_error(exc).message
        assert "<" not in message and ">" not in message, message
        assert "&lt;img src=x" in message or "&lt;b&gt;x&lt;/b&gt;" in message

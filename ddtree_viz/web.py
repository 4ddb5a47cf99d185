"""The web UI: the Gradio page that steps through DDTree on a hybrid target in the browser.

Started by `python app.py`, `ddtree-viz app` or `python -m ddtree_viz app` (the same options: build_parser) and by
`ddtree-viz replay`. Listens on 127.0.0.1 only unless --host says otherwise; no public share link unless --share;
never trust_remote_code. This module only wires widgets to ddtree_viz.ui (session state + views) and the renderers.
"""
from __future__ import annotations

import argparse
import functools
import html
import inspect
import os
import sys
import threading
import time

import gradio as gr

from . import ui
from .options import DTYPES, ENGINE_CHOICES, MAX_SEED, METHODS, VERIFY_LABELS, check_port, port_number
from .prompts import DEFAULT_PROMPTS
from .errors import DDTreeVizError
from .render import export as exporter
from .render import report as report_view

KEYS_JS = """
() => {
  // the node inspector: a click on a tree node writes its tree position into the hidden #ddv-inspect-click box
  // (gr.Plot forwards no plotly events); a nonce makes a second click on the same node count too
  const hook = () => {
    document.querySelectorAll('#ddv-tree .js-plotly-plot').forEach((plot) => {
      if (plot._ddvHooked || !plot.on) return;
      plot._ddvHooked = true;
      plot.on('plotly_click', (ev) => {
        const pt = ev && ev.points && ev.points[0];
        if (!pt || pt.customdata === undefined || pt.customdata === null) return;
        const box = document.querySelector('#ddv-inspect-click textarea, #ddv-inspect-click input');
        if (!box) return;
        box.value = pt.customdata + ':' + Date.now();
        box.dispatchEvent(new Event('input', {bubbles: true}));
      });
    });
  };
  // gradio's Plot re-mounts its plotly div for every new figure, after the old div's own update has drawn that
  // figure into the old div, which is then removed: every figure was drawn twice a Step (~0.3 s of the browser's
  // ~0.6 s on a 2-core machine). A div of the page that has been drawn is not drawn again: a new figure always
  // arrives in a new div (and the same figure again needs no drawing).
  // And a figure of the page off screen is drawn after the ones in view: right after them, one figure a task, or
  // sooner if it scrolls near the window (a Step shows what is in view first; the rest follows).
  const drawOnce = () => {
    const P = window.Plotly;
    if (!P || P._ddvOnce) return;
    P._ddvOnce = true;
    const react = P.react, resize = P.Plots.resize;
    const pending = new Set();  // figures waiting off screen
    const ours = (gd) => gd && gd.closest && gd.closest('[id^="ddv-"]');
    P._ddvDraws = 0;  // figures drawn since (a test counts them: one a figure a Step)
    Object.defineProperty(P, '_ddvPending', {get: () => pending.size});  // (read by tests and bench_page)
    P._ddvOrder = [];  // the last figures drawn, oldest first, by their component's id (a test reads the order)
    const drawn = (gd) => {
      gd._ddvDrawn = true;
      P._ddvDraws += 1;
      P._ddvOrder.push((ours(gd) || {}).id);
      if (P._ddvOrder.length > 64) P._ddvOrder.shift();
    };
    const near = (gd) => {
      if (gd.offsetParent === null) return false;  // not laid out (another tab)
      const r = gd.getBoundingClientRect();
      return r.bottom > -200 && r.top < window.innerHeight + 200;
    };
    const draw = (gd) => {
      if (!pending.delete(gd)) return;
      seen.unobserve(gd);
      if (!gd.isConnected) return;  // a newer figure replaced it first
      react.call(P, gd, ...gd._ddvArgs);
      gd._ddvArgs = null;
      drawn(gd);
    };
    const seen = new IntersectionObserver((entries) => {
      entries.forEach((e) => { if (e.isIntersecting) draw(e.target); });
    }, {rootMargin: '200px'});
    // one figure a task, the first after the frame that shows the update which brought them (so what is in view
    // is painted first); the browser may paint and handle input between them
    let draining = false;
    const schedule = (how) => {
      if (draining) return;
      draining = true;
      if (how === 'frame') requestAnimationFrame(() => setTimeout(drain, 0));
      else setTimeout(drain, how === 'later' ? 250 : 0);
    };
    const drain = () => {
      draining = false;
      for (const gd of pending) if (!gd.isConnected) draw(gd);  // gone: forgotten
      const next = [...pending].find((gd) => gd.offsetParent !== null);
      if (next) draw(next);
      if (pending.size) schedule(next ? 'next' : 'later');  // hidden ones (another tab): looked at again shortly
    };
    P.react = function (gd, ...args) {
      if (gd && ours(gd)) {
        if (gd._ddvDrawn) return Promise.resolve(gd);
        const waiting = pending.has(gd);  // then a newer figure for it replaces the older
        if (waiting || !near(gd)) {
          gd._ddvArgs = args;
          if (!waiting) { pending.add(gd); seen.observe(gd); }
          schedule('frame');
          return Promise.resolve(gd);
        }
      }
      const out = react.call(this, gd, ...args);
      if (gd) drawn(gd);
      return out;
    };
    P.Plots.resize = function (gd, ...args) {  // gradio resizes right after react: not a figure still waiting
      if (gd && pending.has(gd)) return Promise.resolve(gd);
      return resize.call(this, gd, ...args);
    };
  };
  new MutationObserver(() => { drawOnce(); hook(); }).observe(document.body, {childList: true, subtree: true});
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
    const id = {'s': 'ddv-step', 'ArrowLeft': 'ddv-back', 'ArrowRight': 'ddv-forward'}[e.key];
    // only while the Step tab is shown (its buttons are hidden under the Analyze tab)
    if (id) { const b = document.getElementById(id); if (b && b.offsetParent !== null) { b.click(); e.preventDefault(); } }
  });
  // the Analyze tab: a click on a round link of the report writes 'file|round|nonce' into the hidden
  // #ddv-report-click box, which opens that round in the Step tab (the link's own href goes nowhere)
  document.addEventListener('click', (e) => {
    const a = e.target && e.target.closest ? e.target.closest('#ddv-report a.ddv-open-round') : null;
    if (!a) return;
    e.preventDefault();
    const box = document.querySelector('#ddv-report-click textarea, #ddv-report-click input');
    if (!box) return;
    box.value = a.dataset.file + '|' + a.dataset.round + '|' + Date.now();
    box.dispatchEvent(new Event('input', {bubbles: true}));
  });
""" + report_view.SCRIPT + """
}
"""



def click_js(elem_id: str) -> str:
    """After a file is prepared, click its (now filled) download button: one click for the user saves it."""
    return """
() => new Promise((done) => setTimeout(() => {
  const el = document.getElementById('%s');
  const b = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
  if (b) b.click();
  done();
}, 250))
""" % elem_id


# after a report's round opened in the Step tab: its status line (and the tree under it) at the top of the window
SHOW_STATUS_JS = "() => { const s = document.getElementById('ddv-status'); if (s) s.scrollIntoView({block: 'start'}); }"

DEFAULT_PROMPT = DEFAULT_PROMPTS[2]  # a few lines of code, like every bench prompt (prompts/__init__.py says why)
CSS = (".ddv-out { font-family: monospace; } #ddv-status { min-height: 2.5em; } "
       ".ddv-hidden { display: none !important; } "
       ".ddv-special { color: #0072B2; } .ddv-ws { color: #999999; } "  # prompt view: template markers, whitespace
       + report_view.scoped_css("#ddv-report"))  # the Analyze tab's copy of an analyze report


def build_parser(prog: str = "app.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="ddtree-viz: a step-through debugger for DDTree on hybrid models.")
    p.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny Qwen3.5-style model)")
    p.add_argument("--draft", metavar="DIR|HUB_ID", help="DFlash drafter (default: the embedded one)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                   help="engine for exact rounds: auto (default: the fastest exact engine that applies: the static "
                        "runner on a Qwen3.5 hybrid target on one device, else transformers), transformers' forward "
                        "(the reference path) or the static runner (CUDA graphs on a GPU); naive rounds always use "
                        "transformers")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads for the model work (default: one core less than this machine has, at least "
                        "one, leaving a core to the server and the browser)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=port_number, default=7860, help="default: 7860")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link (off by default)")
    p.add_argument("--replay", metavar="TRACE.json", help="open with a saved trace loaded (no model needed)")
    p.add_argument("--report-root", metavar="DIR",
                   help="the Analyze tab reads report directories typed in under DIR only (relative paths from DIR). "
                        "Default: any directory the server can read when the page listens on this machine only "
                        "(127.0.0.1, no --share); none otherwise (uploads still work)")
    p.add_argument("--file-ttl", type=_seconds, default=FILE_TTL_S, metavar="SECONDS",
                   help=f"how long uploads and served downloads stay in gradio's temporary folder (default: {FILE_TTL_S})")
    return p


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1, not {text!r}")
    return value




def _page_error(exc: Exception) -> gr.Error:
    """The message gradio shows for an error. gradio renders a message as HTML, and messages quote what the user
    gave (a prompt's character, a file's name, a trace's field): escaped, so it shows as text."""
    if isinstance(exc, DDTreeVizError):
        text = str(exc)
    elif "out of memory" in str(exc).lower():
        text = f"out of memory: {exc}. Try a smaller budget or fewer new tokens."
    else:
        text = f"{type(exc).__name__}: {exc}"
    return gr.Error(html.escape(text, quote=False))


def _errors(fn):
    """User errors become a message in the page; the app keeps serving."""
    if inspect.isgeneratorfunction(fn):
        def wrapped(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as exc:  # noqa: BLE001
                raise _page_error(exc) from None
    else:
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except gr.Error:
                raise
            except Exception as exc:  # noqa: BLE001
                raise _page_error(exc) from None
    functools.update_wrapper(wrapped, fn)
    return wrapped


STATE_TTL_S = 1800  # a tab left alone this long (with no browser heartbeat to say it closed) is freed
FILE_TTL_S = 600  # gradio's copies of uploads and served downloads are deleted this long after they were made
MODEL_EVENTS = 16  # Step / Run events in flight at once (they take turns on the model)
STATE_SESSIONS = 256  # gradio sessions kept at most (tabs open at once); the least recently used go first


def _sweep_upload_leftovers(age: float) -> int:
    """Delete the empty `tmp*` files gradio's multipart parser leaves in its upload folder (one per upload; gradio's
    own delete_cache never sees them) once they are `age` seconds old. Returns how many went."""
    from gradio.utils import get_upload_folder

    gone, now = 0, time.time()
    try:
        entries = list(os.scandir(get_upload_folder()))
    except OSError:
        return 0
    for entry in entries:
        try:
            if (entry.name.startswith("tmp") and entry.is_file(follow_symlinks=False)
                    and entry.stat().st_size == 0 and now - entry.stat().st_mtime > age):
                os.unlink(entry.path)
                gone += 1
        except OSError:
            pass
    return gone


def _janitor(file_ttl: int) -> None:
    """Every min(60, file_ttl) seconds, for as long as the server runs: _sweep_upload_leftovers(file_ttl)."""
    def loop():
        while True:
            time.sleep(min(60, file_ttl))
            _sweep_upload_leftovers(file_ttl)

    threading.Thread(target=loop, name="ddtree-viz-janitor", daemon=True).start()


def _forget_session(demo: gr.Blocks, session: str | None) -> None:
    """Drop a closed tab's gradio session. gradio frees its State values an hour after the tab closes but keeps the
    session itself, with its copy of every component's last value (the figures: ~1 MB), until STATE_SESSIONS newer
    sessions push it out. Best effort: a gradio without this holder keeps them to that bound."""
    holder = getattr(demo, "state_holder", None)
    data, lock = getattr(holder, "session_data", None), getattr(holder, "lock", None)
    if not session or not isinstance(data, dict) or lock is None:
        return
    with lock:
        data.pop(session, None)
        getattr(holder, "time_last_used", {}).pop(session, None)


def _with_request(n_inputs: int, progress: bool = False):
    """For a handler `fn(*inputs, request=None[, progress=None])`: the signature gradio reads says n_inputs
    positional inputs, then `request: gr.Request` (and a gr.Progress) — gradio hands the request to the parameter
    annotated with it, which a *inputs signature would hide."""
    def wrap(fn):
        P = inspect.Parameter
        params = [P(f"input_{i}", P.POSITIONAL_OR_KEYWORD) for i in range(n_inputs)]
        params.append(P("request", P.POSITIONAL_OR_KEYWORD, annotation=gr.Request))
        if progress:
            params.append(P("progress", P.POSITIONAL_OR_KEYWORD, default=gr.Progress()))
        if inspect.isgeneratorfunction(fn):
            def call(*args, **kwargs):
                positional, named = _split(args, kwargs, n_inputs, progress)
                yield from fn(*positional, **named)
        else:
            def call(*args, **kwargs):
                positional, named = _split(args, kwargs, n_inputs, progress)
                return fn(*positional, **named)
        call.__name__, call.__doc__ = fn.__name__, fn.__doc__
        call.__signature__ = inspect.Signature(params)
        call.__annotations__ = {"request": gr.Request}  # gradio reads the type hints too
        return call
    return wrap


def _split(args, kwargs, n_inputs: int, progress: bool):
    """gradio's positional call (inputs, request[, progress]) as fn's (*inputs, request=, progress=)."""
    named = dict(kwargs)
    rest = list(args[n_inputs:])
    if rest:
        named["request"] = rest.pop(0)
    if progress and rest:
        named["progress"] = rest.pop(0)
    return args[:n_inputs], named


def report_dirs(args: argparse.Namespace) -> ui.ReportDirs:
    """Which report directories the Analyze tab may read when typed in: under --report-root, else any when the page
    listens on this machine only, else none (a page shared beyond it would let anyone probe the server's files)."""
    if args.report_root is not None:
        return ui.ReportDirs(allowed=True, root=args.report_root)
    local = not args.share and args.host in ("127.0.0.1", "localhost", "::1")
    return ui.ReportDirs(allowed=local)


def build_app(host: ui.ModelHost, replay_path: str | None = None, file_ttl: int = FILE_TTL_S,
              dirs: ui.ReportDirs | None = None) -> gr.Blocks:
    dirs = dirs or ui.ReportDirs()
    block_max = 16

    # delete_cache: every minute, gradio deletes the uploads and the copies of downloads it made over file_ttl ago
    with gr.Blocks(title="ddtree-viz", delete_cache=(min(60, file_ttl), file_ttl)) as demo:
        gr.Markdown("# ddtree-viz — DDTree speculative decoding, step by step, on a hybrid target")
        model_md = gr.Markdown(host.status_markdown(), elem_id="ddv-model")
        with gr.Tabs(selected="step", elem_id="ddv-tabs") as page_tabs:
            with gr.Tab("Step", id="step", elem_id="ddv-tab-step"):
                with gr.Accordion("Per-layer cache layout (measured before the first step)", open=True):
                    layout_df = gr.HTML(ui.layout_html(host), elem_id="ddv-layout")
                with gr.Row():
                    with gr.Column(scale=3):
                        prompt = gr.Textbox(label="Prompt", lines=5, value=DEFAULT_PROMPT, elem_id="ddv-prompt",
                                            info="raw text to continue; with the chat template on, the user's message")
                        # chat models and their drafters were trained on chat-formatted text (engine/prompts.py); the
                        # switches follow the target's tokenizer once it has loaded (on_timer)
                        with gr.Row(elem_id="ddv-chat-row"):
                            chat = gr.Checkbox(value=False, interactive=False, label="Chat template", elem_id="ddv-chat",
                                               info="waiting for the model's tokenizer")
                            thinking = gr.Checkbox(value=True, interactive=False, label="Thinking", elem_id="ddv-thinking",
                                                   info="the template's thinking switch (enable_thinking)")
                        system = gr.Textbox(value="", label="System message (chat template only; blank: none)", lines=1,
                                            elem_id="ddv-system")
                    with gr.Column(scale=2):
                        with gr.Row():
                            budget = gr.Slider(1, 512, value=32, step=1, label="Budget (tree nodes)", elem_id="ddv-budget-nodes")
                            block = gr.Slider(2, block_max, value=block_max, step=1, label="Block size", elem_id="ddv-block")
                            max_new = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="ddv-max-new")
                        with gr.Row():
                            verify = gr.Radio(list(VERIFY_LABELS), value="exact", label="Verification")
                            method = gr.Radio(list(METHODS), value="ddtree", label="Method")
                        with gr.Row(elem_id="ddv-sampling"):  # the target's choice: greedy, or position-keyed sampling
                            temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)",
                                                    elem_id="ddv-temperature")
                            top_p = gr.Slider(0.01, 1, value=1, step=0.01, label="Top-p (1 = off)", elem_id="ddv-top-p")
                            top_k = gr.Number(value=0, precision=0, minimum=0, label="Top-k (0 = off)", elem_id="ddv-top-k")
                            seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed",
                                             elem_id="ddv-seed")
                            seed_btn = gr.Button("New seed", size="sm", elem_id="ddv-new-seed")
                with gr.Row():
                    step_btn = gr.Button("Step", variant="primary", elem_id="ddv-step")
                    run_btn = gr.Button("Run", elem_id="ddv-run")
                    independent_btn = gr.Button("Check against transformers' forward", elem_id="ddv-check-transformers")
                    reset_btn = gr.Button("Reset", elem_id="ddv-reset")
                    back_btn = gr.Button("Back", elem_id="ddv-back")
                    fwd_btn = gr.Button("Forward", elem_id="ddv-forward")
                with gr.Row():
                    round_slider = gr.Slider(0, 1, value=0, step=1, label="Round", elem_id="ddv-round")
                    phase = gr.Radio(list(ui.PHASES), value="verified", label="Phase of the round")
                with gr.Accordion("Compare with a second configuration (B: same prompt, stepped in lockstep)", open=False,
                                  elem_id="ddv-compare-controls"):
                    with gr.Row():
                        compare_on = gr.Checkbox(value=False, label="Compare", elem_id="ddv-compare-on")
                        c_budget = gr.Slider(1, 512, value=16, step=1, label="B: budget", elem_id="ddv-compare-budget")
                        c_block = gr.Slider(2, block_max, value=block_max, step=1, label="B: block size")
                        c_method = gr.Radio(list(METHODS), value="ddtree", label="B: method", elem_id="ddv-compare-method")
                        c_verify = gr.Radio(list(VERIFY_LABELS), value="exact", label="B: verification",
                                            elem_id="ddv-compare-verify")
                        c_engine = gr.Dropdown([ui.SAME, *ENGINE_CHOICES], value=ui.SAME, label="B: engine")
                        c_dtype = gr.Dropdown([ui.SAME, *DTYPES], value=ui.SAME, label="B: dtype (another load of the models)")
                status = gr.Markdown(elem_id="ddv-status")
                prompt_view = gr.HTML(elem_id="ddv-prompt-view")  # the prompt as prefilled: templated, special tokens marked
                with gr.Row():
                    tree_plot = gr.Plot(label="Draft tree (accepted path highlighted; click a node to inspect it)",
                                        elem_id="ddv-tree")
                    tree_b = gr.Plot(label="B's draft tree", visible=False, elem_id="ddv-tree-b")
                compare_html = gr.HTML(visible=False, elem_id="ddv-compare")
                # why did this round stop there: the stop, the node inspector (click a node in the tree, or pick it), the grid
                stop_html = gr.HTML(elem_id="ddv-stop")
                with gr.Row():
                    inspect_dd = gr.Dropdown(choices=[], value=None, label="Inspect node (or click one in the tree)",
                                             elem_id="ddv-inspect", scale=1)
                    with gr.Column(scale=5):
                        inspector = gr.HTML(elem_id="ddv-inspector")
                inspect_click = gr.Textbox(elem_id="ddv-inspect-click", elem_classes=["ddv-hidden"], container=False)
                grid_plot = gr.Plot(label="Drafter's grid (depth × rank) the tree was built from", elem_id="ddv-grid")
                with gr.Row():
                    mask_plot = gr.Plot(label="Attention mask of the verify pass", elem_id="ddv-mask")
                    cache_plot = gr.Plot(label="Per-layer cache", elem_id="ddv-cache-chart")
                gr.Markdown("**Per-layer cache this round** (hover a layer in the strip for its details)")
                cache_df = gr.HTML(elem_id="ddv-cache")
                diff_html = gr.HTML(label="Output vs the target's own decoding (greedy, or sampled with the same seed)",
                                    elem_id="ddv-diff")
                with gr.Row():
                    accept_plot = gr.Plot(label="Acceptance per round", elem_id="ddv-acceptance")
                    depth_plot = gr.Plot(label="Acceptance by depth (session so far)", elem_id="ddv-depth")
                with gr.Row():
                    budget_plot = gr.Plot(label="The budget that would have done", elem_id="ddv-budget")
                    stats_md = gr.Markdown(elem_id="ddv-stats")
                divergence = gr.HTML(label="Where drafter and target disagree", elem_id="ddv-divergence")
                with gr.Row():
                    trace_in = gr.File(label=f"Replay a saved trace (.json, at most {ui.MAX_UPLOAD_BYTES // 2**20} MB)",
                                       file_types=[".json"], type="filepath", elem_id="ddv-upload")
                    trace_btn = gr.Button("Download trace (.json)", elem_id="ddv-download")
                    trace_file = gr.DownloadButton("Download trace file", visible=False, elem_id="ddv-download-file")
                with gr.Row(elem_id="ddv-export-row"):  # paper-ready export of the round on screen (ddtree_viz/render/export.py)
                    ex_format = gr.Dropdown(list(exporter.FORMATS), value="svg", label="Export format", elem_id="ddv-export-format")
                    ex_figure = gr.Dropdown(list(exporter.FIGURES), value="tree", label="Figure", elem_id="ddv-export-figure")
                    ex_show = gr.Radio(list(exporter.SHOW_CHOICES), value="text", label="Node labels", elem_id="ddv-export-show")
                    ex_colors = gr.Radio(["colorblind", "grayscale"], value="colorblind", label="Colours", elem_id="ddv-export-colors")
                    # text boxes, not gr.Number: an empty Number arrives as 0, and blank must mean "no filter"
                    ex_min_lp = gr.Textbox(label="Hide below log-prob", placeholder="blank: show all", max_lines=1,
                                           elem_id="ddv-export-minlp")
                    ex_depth = gr.Textbox(label="Max depth", placeholder="blank: all depths", max_lines=1, elem_id="ddv-export-depth")
                    ex_title = gr.Checkbox(value=True, label="Title", elem_id="ddv-export-title")
                    ex_button = gr.Button("Export figure", elem_id="ddv-export")
                    # filled by the export, then clicked by the page (one click for the user); stays as a fallback link
                    ex_file = gr.DownloadButton("Download export", visible=False, elem_id="ddv-export-file")

            with gr.Tab("Analyze", id="analyze", elem_id="ddv-tab-analyze"):
                # a report written by `analyze` (ddtree_viz/analyze.py): the same body as its report.html
                # (render/report.py), figures computed again from its validated traces; a round link opens that
                # round in the Step tab (a replay: no model needed)
                with gr.Row(equal_height=True):
                    report_path = gr.Textbox(label=dirs.label(), max_lines=1, interactive=dirs.allowed,
                                             placeholder="runs/heldout" if dirs.allowed else "upload the files below",
                                             elem_id="ddv-report-path", scale=4)
                    report_load = gr.Button("Load directory", elem_id="ddv-report-load", scale=1,
                                            interactive=dirs.allowed)
                report_upload = gr.File(
                    label=(f"…or upload its summary.json, prompts.json and traces/*.json (each at most "
                           f"{ui.MAX_UPLOAD_BYTES // 2**20} MB, together {ui.MAX_REPORT_BYTES // 2**20} MB)"),
                    file_count="multiple", file_types=[".json"], type="filepath", height=120,
                    elem_id="ddv-report-upload")
                with gr.Accordion("…or run a prompt set here, on the loaded model", open=False,
                                  elem_id="ddv-set-run"):
                    with gr.Row(equal_height=True):
                        set_source = gr.Dropdown(ui.prompt_sets(), value=ui.default_prompt_set(),
                                                 label="shipped prompt set", elem_id="ddv-set-source", scale=2)
                        set_upload = gr.File(label="…or a prompt file (text: blank-line-separated prompts; JSONL: "
                                             "{\"prompt\": ...} or {\"messages\": [...]} a line)",
                                             file_types=[".txt", ".jsonl"], type="filepath", height=120,
                                             elem_id="ddv-set-upload", scale=3)
                    with gr.Row(equal_height=True):
                        set_limit = gr.Number(8, label=f"prompts (first N, at most {ui.PAGE_SET_MAX_PROMPTS})",
                                              precision=0, minimum=1, maximum=ui.PAGE_SET_MAX_PROMPTS,
                                              elem_id="ddv-set-limit")
                        set_budget = gr.Number(32, label="budget (nodes)", precision=0, minimum=1,
                                               elem_id="ddv-set-budget")
                        set_max_new = gr.Number(32, label=f"max new tokens (at most {ui.PAGE_SET_MAX_TOKENS})",
                                                precision=0, minimum=1, maximum=ui.PAGE_SET_MAX_TOKENS,
                                                elem_id="ddv-set-max-new")
                        set_run = gr.Button("Run the set", variant="primary", elem_id="ddv-set-run-button")
                        set_stop = gr.Button("Stop", elem_id="ddv-set-stop")
                    gr.Markdown("DDTree (exact, greedy) on each prompt, checked against greedy, as `analyze` does; the "
                                "Step tab's chat switches apply. Other tabs' Steps go between its rounds. Stop keeps "
                                "the prompts done. For more prompts, or on several GPUs: `python -m ddtree_viz "
                                "analyze` (README).")
                report_md = gr.HTML(ui.report_status(None), elem_id="ddv-report-status")
                report_body = gr.HTML(elem_id="ddv-report")
                # a click on a round link writes 'file|round|nonce' here (the page's script)
                report_click = gr.Textbox(elem_id="ddv-report-click", elem_classes=["ddv-hidden"], container=False)

        # A tab's state lives at most STATE_TTL_S after its last change (then delete_callback frees it); a browser tab
        # that closes is freed at once (demo.unload below). Handlers change it in place (ui.TabState).
        tab = gr.State(lambda: ui.TabState(), time_to_live=STATE_TTL_S, delete_callback=ui.free_tab)  # a new one per tab
        tabs = ui.Tabs()
        settings = [prompt, budget, block, max_new, verify, method, temperature, top_p, top_k, seed, chat, system, thinking,
                    compare_on, c_budget, c_block, c_method, c_verify, c_engine, c_dtype]
        views = [status, tree_plot, mask_plot, cache_df, cache_plot, diff_html, accept_plot, stats_md, divergence, round_slider,
                 tree_b, compare_html, grid_plot, budget_plot, depth_plot, stop_html, inspector, inspect_dd, prompt_view]

        def show(t: ui.TabState, ph: str):
            # figures go out as FigureSpecs: gr.Plot sends their to_json(), no plotly validation on the way
            v = ui.render_views(host, t, ph)
            table = v.cache_html or v.layout_html
            slider = gr.Slider(minimum=0 if v.rounds <= 1 else 1, maximum=max(v.rounds, 1), value=v.view + 1 if v.rounds else 0, step=1)
            compare = v.tree_b_spec is not None
            return [v.status, v.tree_spec, v.mask_spec, table, v.cache_spec, v.diff_html, v.acceptance_spec, v.stats,
                    v.divergence, slider, gr.Plot(value=v.tree_b_spec, visible=compare),
                    gr.HTML(value=v.compare, visible=compare), v.grid_spec,
                    v.budget_spec, v.depth_spec, v.stop, v.inspector,
                    gr.Dropdown(choices=v.node_choices, value=v.inspect), v.prompt]

        def inspector_only(t: ui.TabState):
            html, choices, node = ui.inspector_view(t)
            return [html, gr.Dropdown(choices=choices, value=node)]

        @_errors
        def on_inspect(t, node):
            return [ui.inspect(t, node)] + inspector_only(t)

        @_errors
        def on_click_node(t, value):
            # '3:nonce' from the page's plotly_click hook (the bonus star's position is past the tree: ignored)
            return [ui.inspect(t, (value or "").partition(":")[0])] + inspector_only(t)

        # Step and Run show each round at once (check=False) and check it against the reference next (on_check,
        # chained with .then): the page answers at the round's speed, the comparison follows
        @_errors
        @_with_request(len(settings) + 2)
        def on_step(t, ph, *s, request=None):
            tabs.add(request.session_hash, t)
            return [ui.step(host, t, *s, check=False)] + show(t, ph)

        def show_check(t: ui.TabState, ph: str):
            v = ui.render_check(host, t, ph)
            return [t, v.status, v.diff_html, v.stats]

        @_errors
        def on_check(t, ph):
            return show_check(ui.check(host, t), ph)

        @_errors
        def on_independent(t, ph):
            return show_check(ui.check_transformers(host, t), ph)

        @_errors
        @_with_request(len(settings) + 2, progress=True)
        def on_run(t, ph, *s, request=None, progress=None):
            tabs.add(request.session_hash, t)
            # each round's views are made only while this Run is still the tab's (ui.run_rounds): a Reset is never
            # followed by a round it ended
            for out in ui.run_rounds(host, t, *s, check=False, min_interval=ui.RUN_REFRESH_S,
                                      views=lambda tab: [tab] + show(tab, ph)):
                session = t.session  # None once a Reset has cleared the tab
                if session is not None:
                    progress((len(session.generated), session.max_new_tokens), desc="decoding", unit="tokens")
                yield out

        def on_reset(t, ph):
            t = ui.reset(t)
            return [t] + show(t, ph)

        def on_move(t, ph, delta):
            t = ui.move(t, delta=delta)
            return [t] + show(t, ph)

        def on_slider(t, ph, value):
            t = ui.move(t, to=int(value) - 1)
            return [t] + show(t, ph)

        @_errors
        def on_upload(t, ph, path, request: gr.Request):
            if not path:
                return [t] + show(t, ph)
            tabs.add(request.session_hash, t)
            # messages name the file as uploaded, never the server's temporary path. The upload itself stays for
            # gradio's delete_cache (file_ttl): gradio gives identical uploads one path, which another tab may be
            # about to read.
            t = ui.load_replay(t, path, name=os.path.basename(path))
            return [t] + show(t, ph)

        # the Analyze tab: load a report (a directory on the server, or uploaded files); a round link opens that round
        # in the Step tab as a replay
        def report_views(t: ui.TabState):
            return [ui.report_status(t), ui.report_html(t)]

        @_errors
        def on_report_dir(t, text, request: gr.Request):
            tabs.add(request.session_hash, t)
            return [ui.load_report_dir(t, text, dirs)] + report_views(t)

        @_errors
        @_with_request(9)
        def on_set_run(t, source, upload, limit, budget_, max_new_, chat_, system_, thinking_, request=None):
            tabs.add(request.session_hash, t)
            for line in ui.run_prompt_set(host, t, source, upload, budget_, max_new_, limit, chat_, system_,
                                          thinking_):  # a line after each prompt, over the report
                yield [t, f'<p class="ddv-set-progress">Running the set: {html.escape(line)}</p>', gr.skip()]
            yield [t] + report_views(t)

        def on_set_stop(t):
            t.set_stop.set()

        @_errors
        def on_report_upload(t, paths, request: gr.Request):
            if not paths:
                return [t] + report_views(t)
            tabs.add(request.session_hash, t)
            return [ui.load_report_upload(t, paths)] + report_views(t)

        @_errors
        def on_report_round(t, ph, value, request: gr.Request):
            if not value:
                return [t] + show(t, ph) + [gr.Tabs()]
            tabs.add(request.session_hash, t)
            t = ui.open_report_click(t, value)
            return [t] + show(t, ph) + [gr.Tabs(selected="step")]

        @_errors
        def on_replay_file(t, ph, request: gr.Request):  # --replay FILE: read again at each page load
            tabs.add(request.session_hash, t)
            t = ui.load_replay(t, replay_path)
            return [t] + show(t, ph)

        @_errors
        def on_download(t):
            saved = ui.saved_trace(t)  # InputError when there is nothing yet
            kind = "compare" if t.other_trace is not None else "trace"
            path = t.new_folder("trace") / f"ddtree-{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
            try:
                saved.save(path)
            except (OSError, UnicodeError) as exc:
                raise ui.InputError(f"cannot write the trace: {exc}") from None
            return gr.DownloadButton(f"Download {path.name}", value=str(path), visible=True)

        @_errors
        def on_export(t, ph, fmt, figure, show, colors, min_lp, depth, title):
            if t.trace is None or not t.trace.steps:
                raise ui.InputError("nothing to export yet: step, run or replay a trace first")
            path = exporter.export_round_file(
                t.trace, t.view, fmt, directory=t.new_folder("export"), phase=ph, figure=figure, show=show, colors=colors,
                min_logprob=exporter.optional_number(min_lp, "hide below log-prob"),
                max_depth=exporter.optional_number(depth, "max depth", integer=True),
                show_title=bool(title))
            return gr.DownloadButton(f"Download {path.name}", value=str(path), visible=True)

        def chat_controls():
            """The chat switches once the tokenizer is known: on by default when it has a template, disabled
            with a note when it has none; thinking only where the template has the switch."""
            if not host.ready:
                return gr.Checkbox(info="no model loaded: prompts go in as raw text"), gr.Checkbox()
            if not host.has_chat_template:
                return (gr.Checkbox(value=False, interactive=False, info="this tokenizer has no chat template (the "
                                    "embedded pair has none): prompts go in as raw text"),
                        gr.Checkbox(interactive=False))
            return (gr.Checkbox(value=True, interactive=True, info="the prompt is sent as the user's message"),
                    gr.Checkbox(interactive=host.takes_thinking,
                                info="the template's thinking switch (enable_thinking)" if host.takes_thinking
                                else "this template has no thinking switch"))

        def on_unload(request: gr.Request):  # the browser tab closed (its heartbeat stopped)
            tabs.close(request.session_hash)
            _forget_session(demo, request.session_hash)

        def on_timer():
            if host.ready or host.error or host.replay_only:
                return (host.status_markdown(), ui.layout_html(host),
                        gr.Slider(maximum=host.pair.drafter.block_size, value=host.pair.drafter.block_size) if host.ready else gr.Slider(),
                        *chat_controls(), gr.Timer(active=False))
            return host.status_markdown(), gr.HTML(), gr.Slider(), gr.Checkbox(), gr.Checkbox(), gr.Timer(active=True)

        timer = gr.Timer(0.5)
        timer_outputs = [model_md, layout_df, block, chat, thinking, timer]
        timer.tick(on_timer, outputs=timer_outputs, concurrency_limit=None)
        demo.load(on_timer, outputs=timer_outputs)

        # Model work from several tabs may be in flight at once: they take turns on the model round by round
        # (ui.ModelHost.lock, granted in order), so one tab's Run does not hold up another tab's Step.
        model_events = dict(concurrency_id="model", concurrency_limit=MODEL_EVENTS)
        checked = [tab, status, diff_html, stats_md]
        step_btn.click(on_step, [tab, phase] + settings, [tab] + views, api_name="step", **model_events).then(
            on_check, [tab, phase], checked, api_name="check", **model_events)
        run_event = run_btn.click(on_run, [tab, phase] + settings, [tab] + views, api_name="run", **model_events)
        run_event.then(on_check, [tab, phase], checked, api_name="check_run", **model_events)
        independent_btn.click(on_independent, [tab, phase], checked, api_name="check_transformers", **model_events)
        # Reset stops this tab's Run: ui.reset ends it at its next round, and the Run's last output is the reset tab
        reset_btn.click(on_reset, [tab, phase], [tab] + views, api_name="reset")
        seed_btn.click(ui.new_seed, None, [seed], api_name="new_seed")
        back_btn.click(lambda t, ph: on_move(t, ph, -1), [tab, phase], [tab] + views, api_name="back")
        fwd_btn.click(lambda t, ph: on_move(t, ph, +1), [tab, phase], [tab] + views, api_name="forward")
        round_slider.release(on_slider, [tab, phase, round_slider], [tab] + views, api_name="goto_round")
        phase.change(lambda t, ph: [t] + show(t, ph), [tab, phase], [tab] + views, api_name="phase")
        trace_in.upload(on_upload, [tab, phase, trace_in], [tab] + views, api_name="replay")
        report_outputs = [tab, report_md, report_body]
        report_load.click(on_report_dir, [tab, report_path], report_outputs, api_name="report_dir")
        report_path.submit(on_report_dir, [tab, report_path], report_outputs)
        report_upload.upload(on_report_upload, [tab, report_upload], report_outputs, api_name="report_upload")
        set_run.click(on_set_run, [tab, set_source, set_upload, set_limit, set_budget, set_max_new, chat, system,
                                   thinking], report_outputs, api_name="prompt_set", **model_events)
        set_stop.click(on_set_stop, [tab], None, api_name="prompt_set_stop")
        report_click.change(on_report_round, [tab, phase, report_click], [tab] + views + [page_tabs],
                            api_name="report_round").success(None, js=SHOW_STATUS_JS)
        inspect_dd.input(on_inspect, [tab, inspect_dd], [tab, inspector, inspect_dd], api_name="inspect")
        inspect_click.change(on_click_node, [tab, inspect_click], [tab, inspector, inspect_dd], api_name="inspect_click")
        trace_btn.click(on_download, [tab], [trace_file], api_name="download").success(None, js=click_js("ddv-download-file"))
        ex_button.click(on_export, [tab, phase, ex_format, ex_figure, ex_show, ex_colors, ex_min_lp, ex_depth, ex_title],
                        [ex_file], api_name="export").success(None, js=click_js("ddv-export-file"))
        if replay_path:
            demo.load(on_replay_file, [tab, phase], [tab] + views)
        demo.unload(on_unload)
        demo.ddtree_tabs = tabs  # for tests and the memory benchmark
    return demo


def main(argv: list[str] | None = None, prog: str = "app.py") -> int:
    """Serve the page. A user error (a port in use, a bad --replay file) prints `error: ...` and returns 2."""
    args = build_parser(prog).parse_args(argv)
    try:
        import torch

        if args.threads is not None and args.threads < 1:
            raise ui.InputError(f"--threads must be at least 1, not {args.threads}")
        check_port(args.host, args.port)  # before the models load: a port in use is a clear error at once
        on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
        torch.set_num_threads(args.threads or ui.cpu_threads("cpu" if on_cpu else "cuda"))
        host = ui.ModelHost(args.target, args.draft, args.dtype, args.device, args.engine)
        if args.replay is None or args.target is not None:
            host.start(background=True)
        else:
            host.stage, host.replay_only = "not loaded", True
        demo = build_app(host, args.replay, file_ttl=args.file_ttl, dirs=report_dirs(args))
        _janitor(args.file_ttl)
        demo.queue(default_concurrency_limit=1)
        print(f"ddtree-viz: serving on http://{args.host}:{args.port} "
              f"({'public share link on' if args.share else 'local only'})", flush=True)
        try:
            # run_history off: Gradio 6 otherwise keeps every event's inputs and outputs (each Step's figures,
            # ~85 KB) in the browser's localStorage and rewrites the whole list after every event, so each Step got
            # slower with the session's length (0.5 s at round 1, 3 s at round 30); it would also keep prompts in
            # the browser
            demo.launch(server_name=args.host, server_port=args.port, share=args.share, js=KEYS_JS, css=CSS,
                        show_error=True, footer_links=[], max_file_size=ui.MAX_UPLOAD_BYTES,
                        state_session_capacity=STATE_SESSIONS, run_history=False)
        except OSError as exc:  # the port was taken between the check and the launch
            raise ui.InputError(f"cannot listen on {args.host}:{args.port}: {exc}; pick another with --port") from None
    except DDTreeVizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


"""The web UI: the Gradio page that steps through DDTree on a hybrid target in the browser.

Started by `python app.py`, `ddtree-viz app` or `python -m ddtree_viz app` (the same options: build_parser) and by
`ddtree-viz replay`. Listens on 127.0.0.1 only unless --host says otherwise; no public share link unless --share;
never trust_remote_code. The page's tabs are laid out and wired in step_tab.py and analyze_tab.py; this module
builds the app around them and serves it.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import gradio as gr

from ...errors import DDTreeVizError, InputError
from ..analyze_tab import ReportDirs
from ..host import ModelHost, cpu_threads
from ..state import MAX_UPLOAD_BYTES, TabState, Tabs, free_tab
from .analyze_tab import AnalyzeTab
from .args import FILE_TTL_S, build_parser, checked_args  # noqa: F401 - build_parser: the app's options (tests read them here)
from .script import CSS, KEYS_JS
from .step_tab import StepTab
from .tabfiles import file_guard
from .wiring import Page

STATE_TTL_S = 1800  # a tab left alone this long (with no browser heartbeat to say it closed) is freed
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


def _sweep_served_files(demo: gr.Blocks, age: float) -> None:
    """gradio's delete_cache sweep, run again from the janitor. gradio's own runs as one task on the server's event
    loop and walks each component's set of cached files while handler threads add to them: one "Set changed size
    during iteration" ends that task for good, and every file served after it stayed (CI met it: 5 files left 45 s
    after a --file-ttl of 8 s). A sweep that meets a changing set here is simply done again next time."""
    from gradio.route_utils import delete_files_created_by_app

    try:
        delete_files_created_by_app(demo, age)
    except RuntimeError:  # a set changed under the walk: the next sweep
        pass


def _janitor(demo: gr.Blocks, file_ttl: int) -> None:
    """Every min(60, file_ttl) seconds, for as long as the server runs: _sweep_upload_leftovers(file_ttl) and
    _sweep_served_files(demo, file_ttl)."""
    def loop():
        while True:
            time.sleep(min(60, file_ttl))
            _sweep_upload_leftovers(file_ttl)
            _sweep_served_files(demo, file_ttl)

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


def report_dirs(args: argparse.Namespace) -> ReportDirs:
    """Which report directories the Analyze tab may read when typed in: under --report-root, else any when the page
    listens on this machine only, else none (a page shared beyond it would let anyone probe the server's files)."""
    if args.report_root is not None:
        return ReportDirs(allowed=True, root=args.report_root)
    local = not args.share and args.host in ("127.0.0.1", "localhost", "::1")
    return ReportDirs(allowed=local)


def build_app(host: ModelHost, replay_path: str | None = None, file_ttl: int = FILE_TTL_S,
              dirs: ReportDirs | None = None) -> gr.Blocks:
    dirs = dirs or ReportDirs()
    # delete_cache: every minute, gradio deletes the uploads and the copies of downloads it made over file_ttl ago
    with gr.Blocks(title="ddtree-viz", delete_cache=(min(60, file_ttl), file_ttl)) as demo:
        gr.Markdown("# ddtree-viz — DDTree speculative decoding, step by step, on a hybrid target")
        model_md = gr.Markdown(host.status_markdown(), elem_id="ddv-model")
        with gr.Tabs(selected="step", elem_id="ddv-tabs") as selector:
            with gr.Tab("Step", id="step", elem_id="ddv-tab-step"):
                step = StepTab(host)
            with gr.Tab("Analyze", id="analyze", elem_id="ddv-tab-analyze"):
                analyze = AnalyzeTab(dirs)
        # A tab's state lives at most STATE_TTL_S after its last change (then delete_callback frees it); a browser tab
        # that closes is freed at once (demo.unload below). Handlers change it in place (state.TabState).
        tab = gr.State(lambda: TabState(), time_to_live=STATE_TTL_S, delete_callback=free_tab)  # a new one per tab
        page = Page(demo, host, tab, Tabs(), selector)
        _wire_loading(page, model_md, step)
        step.wire(page, replay_path)
        analyze.wire(page, step)

        def on_unload(request: gr.Request):  # the browser tab closed (its heartbeat stopped)
            page.tabs.close(request.session_hash)
            _forget_session(demo, request.session_hash)

        demo.unload(on_unload)
        demo.ddtree_tabs = page.tabs  # for tests and the memory benchmark
        demo.ddtree_files = page.files  # main's FileGuard: downloads and exports only to the browser that made them
    return demo


def _wire_loading(page: Page, model_md: gr.Markdown, step: StepTab) -> None:
    """The models load in the background: the page says how far, and once they are in, the block size slider's end
    and the chat switches follow the target's drafter and tokenizer."""
    host = page.host
    block, chat, thinking = (step.settings[name] for name in ("block_size", "chat", "thinking"))

    def chat_controls():
        """The chat switches once the tokenizer is known: on by default when it has a template, disabled
        with a note when it has none; thinking only where the template has the switch."""
        if not host.ready:
            return {chat: gr.Checkbox(info="no model loaded: prompts go in as raw text"), thinking: gr.Checkbox()}
        if not host.has_chat_template:
            return {chat: gr.Checkbox(value=False, interactive=False, info="this tokenizer has no chat template (the "
                                      "embedded pair has none): prompts go in as raw text"),
                    thinking: gr.Checkbox(value=False, interactive=False, info="no chat template: no thinking switch")}
        return {chat: gr.Checkbox(value=True, interactive=True, info="the prompt is sent as the user's message"),
                thinking: gr.Checkbox(value=host.takes_thinking, interactive=host.takes_thinking,
                                      info="the template's thinking switch (enable_thinking)" if host.takes_thinking
                                      else "this template has no thinking switch")}

    timer = gr.Timer(0.5)

    def on_timer():
        if host.ready or host.error or host.replay_only:
            size = host.pair.drafter.block_size if host.ready else None
            return {model_md: host.status_markdown(), step.controls["layout"]: host.layout_html(),
                    block: gr.Slider(maximum=size, value=size) if host.ready else gr.Slider(), **chat_controls(),
                    timer: gr.Timer(active=False)}
        return {model_md: host.status_markdown(), step.controls["layout"]: gr.HTML(), block: gr.Slider(),
                chat: gr.Checkbox(), thinking: gr.Checkbox(), timer: gr.Timer(active=True)}

    outputs = [model_md, step.controls["layout"], block, chat, thinking, timer]
    timer.tick(on_timer, outputs=outputs, concurrency_limit=None)
    page.demo.load(on_timer, outputs=outputs)


def main(argv: list[str] | None = None, prog: str = "app.py") -> int:
    """Serve the page. A user error (a port in use, a bad --replay file) prints `error: ...` and returns 2."""
    try:
        args = checked_args(argv, prog)  # before the models load: a port in use is a clear error at once
        import torch

        on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
        torch.set_num_threads(args.threads or cpu_threads("cpu" if on_cpu else "cuda"))
        host = ModelHost(args.target, args.draft, args.dtype, args.device, args.engine,
                         draft_weights=args.draft_weights, head_weights=args.head_weights)
        if args.replay is None or args.target is not None:
            host.start(background=True)
        else:
            host.stage, host.replay_only = "not loaded", True
        demo = build_app(host, args.replay, file_ttl=args.file_ttl, dirs=report_dirs(args))
        _janitor(demo, args.file_ttl)
        demo.queue(default_concurrency_limit=1)
        print(f"ddtree-viz: serving on http://{args.host}:{args.port} "
              f"({'public share link on' if args.share else 'local only'})", flush=True)
        try:
            # run_history off: Gradio 6 otherwise keeps every event's inputs and outputs (each Step's figures,
            # ~85 KB) in the browser's localStorage and rewrites the whole list after every event, so each Step got
            # slower with the session's length (0.5 s at round 1, 3 s at round 30); it would also keep prompts in
            # the browser
            demo.launch(server_name=args.host, server_port=args.port, share=args.share, js=KEYS_JS, css=CSS,
                        show_error=True, footer_links=[], max_file_size=MAX_UPLOAD_BYTES,
                        state_session_capacity=STATE_SESSIONS, run_history=False,
                        app_kwargs={"middleware": file_guard(demo.ddtree_files)})
        except OSError as exc:  # the port was taken between the check and the launch
            raise InputError(f"cannot listen on {args.host}:{args.port}: {exc}; pick another with --port") from None
    except DDTreeVizError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

"""The Analyze tab: its layout, and its events wired to the page's Analyze tab logic (page/analyze_tab.py).

A report written by `analyze` (ddtree_viz/analyze.py): the same body as its report.html (render/report.py), figures
computed again from its validated traces; a round link opens that round in the Step tab (a replay: no model
needed); its misses downloaded as misses.jsonl. Or a prompt set run here, on the loaded model."""

from __future__ import annotations

import html

import gradio as gr

from ..analyze_tab import (MAX_REPORT_BYTES, PAGE_SET_MAX_PROMPTS, PAGE_SET_MAX_TOKENS, SET_DONE, ReportDirs,
                           default_prompt_set, load_report_dir, load_report_upload, open_report_click, prompt_sets,
                           report_html, report_status, run_prompt_set, write_misses_file)
from ..state import MAX_UPLOAD_BYTES
from .script import SHOW_STATUS_JS, click_js
from .step_tab import StepTab
from .wiring import MODEL, REPORTS, Page, shows_errors

# The tab's views by name: what each shows of the tab's report
REPORT_VIEWS = {"status": report_status, "body": report_html}


class AnalyzeTab:
    """The Analyze tab's widgets by name, laid out in the tab being built (inside its gr.Tab)."""

    def __init__(self, dirs: ReportDirs):
        self.dirs = dirs
        c = self.controls = {}
        with gr.Row(equal_height=True):
            c["path"] = gr.Textbox(label=dirs.label(), max_lines=1, interactive=dirs.allowed,
                                   placeholder="runs/heldout" if dirs.allowed else "upload the files below",
                                   elem_id="ddv-report-path", scale=4)
            c["load"] = gr.Button("Load directory", elem_id="ddv-report-load", scale=1, interactive=dirs.allowed)
        c["upload"] = gr.File(
            label=(f"…or upload its summary.json, prompts.json and traces/*.json (each at most "
                   f"{MAX_UPLOAD_BYTES // 2**20} MB, together {MAX_REPORT_BYTES // 2**20} MB)"),
            file_count="multiple", file_types=[".json"], type="filepath", height=120, elem_id="ddv-report-upload")
        self.prompt_set: dict[str, gr.components.Component] = {}  # by run_prompt_set's parameter names
        self._prompt_set()
        self.views = {"status": gr.HTML(report_status(None), elem_id="ddv-report-status")}
        with gr.Row():  # the report's misses as analyze --misses writes them (docs/MISSES.md), for this browser only
            c["misses"] = gr.Button("Download misses (.jsonl)", elem_id="ddv-misses-download", size="sm", scale=0,
                                    min_width=220)
            c["misses_file"] = gr.DownloadButton("Download misses file", visible=False, elem_id="ddv-misses-file",
                                                 size="sm", scale=0, min_width=220)
        self.views["body"] = gr.HTML(elem_id="ddv-report")
        # a click on a round link writes 'file|round|nonce' here (the page's script)
        c["click"] = gr.Textbox(elem_id="ddv-report-click", elem_classes=["ddv-hidden"], container=False)

    def _prompt_set(self) -> None:
        s, c = self.prompt_set, self.controls
        with gr.Accordion("…or run a prompt set here, on the loaded model", open=False, elem_id="ddv-set-run"):
            with gr.Row(equal_height=True):
                s["source"] = gr.Dropdown(prompt_sets(), value=default_prompt_set(), label="shipped prompt set",
                                          elem_id="ddv-set-source", scale=2)
                s["upload"] = gr.File(label="…or a prompt file (text: blank-line-separated prompts; JSONL: "
                                      "{\"prompt\": ...} or {\"messages\": [...]} a line)",
                                      file_types=[".txt", ".jsonl"], type="filepath", height=120,
                                      elem_id="ddv-set-upload", scale=3)
            with gr.Row(equal_height=True):
                s["limit"] = gr.Number(8, label=f"prompts (first N, at most {PAGE_SET_MAX_PROMPTS})", precision=0,
                                       minimum=1, maximum=PAGE_SET_MAX_PROMPTS, elem_id="ddv-set-limit")
                s["budget"] = gr.Number(32, label="budget (nodes)", precision=0, minimum=1, elem_id="ddv-set-budget")
                s["max_new_tokens"] = gr.Number(32, label=f"max new tokens (at most {PAGE_SET_MAX_TOKENS})",
                                                precision=0, minimum=1, maximum=PAGE_SET_MAX_TOKENS,
                                                elem_id="ddv-set-max-new")
                c["set_run"] = gr.Button("Run the set", variant="primary", elem_id="ddv-set-run-button")
                c["set_stop"] = gr.Button("Stop", elem_id="ddv-set-stop")
            gr.Markdown("DDTree (exact, greedy) on each prompt, checked against greedy, as `analyze` does; the "
                        "Step tab's chat switches apply. Other tabs' Steps go between its rounds. Stop keeps "
                        "the prompts done. For more prompts, or on several GPUs: `python -m ddtree_viz "
                        "analyze` (README).")

    def show(self, t) -> dict:
        """The tab and the views of its report; the misses file of a report shown before, no longer offered."""
        return {self.page.tab: t, **{self.views[name]: view(t) for name, view in REPORT_VIEWS.items()},
                self.controls["misses_file"]: gr.DownloadButton(value=None, visible=False)}

    def wire(self, page: Page, step: StepTab) -> None:
        """Load a report (a directory on the server, or uploaded files); run a prompt set; a round link opens that
        round in the Step tab as a replay."""
        self.page = page
        host, tab, c = page.host, page.tab, self.controls
        shown = [tab, *self.views.values(), c["misses_file"]]
        # the prompt set's own controls, then the Step tab's chat switches
        prompt_set = {**self.prompt_set, **{name: step.settings[name] for name in ("chat", "system", "thinking")}}

        @shows_errors
        def on_report_dir(t, text, request: gr.Request):
            page.add(request, t)
            return self.show(load_report_dir(t, text, self.dirs))

        @shows_errors
        def on_report_upload(t, paths, request: gr.Request):
            if not paths:
                return self.show(t)
            page.files.check_inputs(paths, request)  # not another browser's download (tabfiles.py)
            page.add(request, t)
            return self.show(load_report_upload(t, paths))

        @shows_errors
        def on_set_run(t, request: gr.Request, **values):
            page.add(request, t)
            for line in run_prompt_set(host, t, **values):  # a line after each prompt, over the report
                if line.startswith(SET_DONE):  # the report and its status come together, below: no "done" before
                    continue  # them (a test read the old report's table under the new status, on a loaded machine)
                progress = f'<p class="ddv-set-progress">Running the set: {html.escape(line)}</p>'
                yield {tab: t, self.views["status"]: progress}
            yield self.show(t)

        @shows_errors
        def on_report_round(t, ph, value, request: gr.Request):
            if not value:
                return {**step.show(t, ph), page.selector: gr.Tabs()}
            page.add(request, t)
            return {**step.show_replay(open_report_click(t, value), ph), page.selector: gr.Tabs(selected="step")}

        @shows_errors
        def on_misses(t, request: gr.Request):
            path = write_misses_file(t)  # the tab's own folder; served to this browser only (tabfiles.py)
            return gr.DownloadButton(f"Download {path.name}", value=page.files.offer(c["misses_file"], path, request),
                                     visible=True)

        c["misses"].click(on_misses, [tab], [c["misses_file"]], api_name="download_misses", **REPORTS).success(
            None, js=click_js("ddv-misses-file"))
        c["load"].click(on_report_dir, [tab, c["path"]], shown, api_name="report_dir", **REPORTS)
        c["path"].submit(on_report_dir, [tab, c["path"]], shown, **REPORTS)
        c["upload"].upload(on_report_upload, [tab, c["upload"]], shown, api_name="report_upload", **REPORTS)
        c["set_run"].click(on_set_run, [tab], shown, inputs_kwargs=prompt_set, api_name="prompt_set", **MODEL)
        c["set_stop"].click(lambda t: t.set_stop.set(), [tab], None, api_name="prompt_set_stop")
        c["click"].change(on_report_round, [tab, step.controls["phase"], c["click"]],
                          [*step.shown_replay(), page.selector], api_name="report_round", **step.at_status,
                          **REPORTS).success(None, js=SHOW_STATUS_JS)

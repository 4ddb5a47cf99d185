"""The Step tab: its layout, and its events wired to the page's actions and views side by side.

Its widgets are kept by name: `settings` by state.SETTINGS' names (what Step and Run read), `views` by
views.VIEWS' names (what they show), `controls` for the rest. A handler's inputs arrive by those names
(inputs_kwargs) and it returns its outputs as a dict keyed by component, so nothing is paired by position."""

from __future__ import annotations

import os
import time

import gradio as gr

from ...options import (DRAFTER_FAMILIES, DTYPES, ENGINE_CHOICES, MARGINAL, MAX_SEED, METHODS, TREE_SCORINGS,
                        VERIFY_LABELS)
from ...prompts import DEFAULT_PROMPTS
from ...render import export as exporter
from ...render.layout import PHASES
from .. import actions
from ..host import ModelHost
from ..state import MAX_UPLOAD_BYTES, SAME, SETTINGS, read_settings
from ..views import (CHECKED, VIEWS, Views, change_note, first_status, inspector_view, render_check, render_views,
                     status_after_change)
from .script import click_js, stale_js
from .wiring import MODEL, Page, errors_in_status, shows_errors

DEFAULT_PROMPT = DEFAULT_PROMPTS[2]  # a few lines of code, like every bench prompt (prompts/__init__.py says why)
BLOCK_MAX = 16  # the block size sliders' end until the drafter's own is known (the page's timer sets it)

# Each panel's title: what it shows, in the words of someone reading the page (issue #65 item 7). A figure's own
# title inside the plot says which round and its figures; these say what the panel is.
TITLES = {
    "tree_spec": "Draft tree: the tokens the drafter proposed, the accepted path in vermillion (click a node to "
                 "inspect it)",
    "tree_b_spec": "Configuration B's draft tree: its accepted path in vermillion",
    "grid_spec": "What the drafter proposed at each depth, best first (log-prob by rank): the cells the tree took "
                 "outlined",
    "mask_spec": "What each tree position can see in the verify pass (attention mask)",
    "cache_chart_spec": "Cache size per layer (bytes) after this round",
    "acceptance_spec": "Tokens gained per round (accepted drafts + the bonus token)",
    "depth_spec": "How deep the drafts were accepted (this session so far)",
    "budget_spec": "Tokens other budgets would have gained (this round, and the session so far)",
}
# gr.HTML draws no label: those panels' headings are Markdown lines of their own (issue #26)
HEADINGS = {
    "cache_html": "**What each layer's cache holds after this round** (hover a layer in the strip for its details)",
    "diff_html": "**The output, token by token, against the target's own decoding** (greedy, or sampled with the "
                 "same seed)",
    "divergence": "**Where drafter and target disagree** (per round: where the walk stopped, the drafter's "
                  "candidates there)",
}
LAYOUT_TITLE = "What each layer caches: the model's cache layout (measured before the first step)"


def _round_slider(v: Views) -> gr.Slider:
    return gr.Slider(minimum=0 if v.rounds <= 1 else 1, maximum=max(v.rounds, 1), value=v.view + 1 if v.rounds else 0,
                     step=1)


# How a view's widget takes its value, where it is more than the value itself (a view's name -> its update)
FILL = {
    "cache_html": lambda v: v.cache_html or v.layout_html,  # the round's cache, else the layout measured at load
    "view": _round_slider,
    "tree_b_spec": lambda v: gr.Plot(value=v.tree_b_spec, visible=v.tree_b_spec is not None),
    "compare": lambda v: gr.HTML(value=v.compare, visible=v.tree_b_spec is not None),
    "inspect": lambda v: gr.Dropdown(choices=v.node_choices, value=v.inspect),
    "pays_spec": lambda v: gr.Plot(value=v.pays_spec, visible=v.pays_spec is not None),  # no costs: the words only
}


def compare_settings(s: dict) -> None:
    """The compare accordion's settings (B's), made into `s` by name, in the tab being built."""
    # two rows, each control wide enough for its label and values: nine in one row cut the Compare box's
    # label to "Comp" and B's budget's 512 to "51" at 1280x800 (issue #65)
    with gr.Accordion("Compare with a second configuration (B: same prompt, stepped in lockstep)", open=False,
                      elem_id="ddv-compare-controls"):
        with gr.Row():
            s["compare_on"] = gr.Checkbox(value=False, label="Compare", elem_id="ddv-compare-on", scale=0,
                                          min_width=130)
            s["compare_budget"] = gr.Slider(1, 512, value=16, step=1, label="B: budget",
                                            elem_id="ddv-compare-budget", min_width=220)
            s["compare_block_size"] = gr.Slider(2, BLOCK_MAX, value=BLOCK_MAX, step=1, label="B: block size",
                                                min_width=220)
            s["compare_method"] = gr.Radio(list(METHODS), value="ddtree", label="B: method",
                                           elem_id="ddv-compare-method", min_width=260)
        with gr.Row():
            s["compare_tree_scoring"] = gr.Dropdown(list(TREE_SCORINGS), value=MARGINAL, label="B: tree scoring",
                                                    elem_id="ddv-compare-tree-scoring")
            s["compare_verify"] = gr.Radio(list(VERIFY_LABELS), value="exact", label="B: verification",
                                           elem_id="ddv-compare-verify", min_width=300)
            s["compare_engine"] = gr.Dropdown([SAME, *ENGINE_CHOICES], value=SAME, label="B: engine")
            s["compare_dtype"] = gr.Dropdown([SAME, *DTYPES], value=SAME,
                                             label="B: dtype (another load of the models)")
            s["compare_drafter"] = gr.Dropdown([SAME, *DRAFTER_FAMILIES], value=SAME,
                                               label="B: drafter (beside the embedded target: its DFlash or "
                                                     "DFlash2 drafter)", elem_id="ddv-compare-drafter",
                                               min_width=260)


class StepTab:
    """The Step tab's widgets by name, laid out in the tab being built (inside its gr.Tab)."""

    def __init__(self, host: ModelHost):
        self.host = host
        self.settings: dict[str, gr.components.Component] = {}
        self.views: dict[str, gr.components.Component] = {}
        self.controls: dict[str, gr.components.Component] = {}
        # closed: open, its table pushed Step below the fold at 1500x1100 and 1280x800 (issue #26)
        with gr.Accordion(LAYOUT_TITLE, open=False):
            self.controls["layout"] = gr.HTML(host.layout_html(), elem_id="ddv-layout")
        with gr.Row():
            with gr.Column(scale=3):
                self._prompt()
                self._buttons()  # under the prompt, beside the settings: in view at 1280x800 (issue #26)
            with gr.Column(scale=2):
                self._decoding()
        self._rounds()
        compare_settings(self.settings)
        self._views()
        self._files()
        unpaired = (set(self.views) - set(VIEWS)) | (set(self.settings) ^ set(SETTINGS))
        if unpaired:
            raise ValueError(f"Step tab widgets with no view or setting of their name: {sorted(unpaired)}")

    def settings_by_name(self) -> dict:
        """The settings' widgets in state.SETTINGS' order (the order of the served /step and /run inputs)."""
        return {name: self.settings[name] for name in SETTINGS}

    def outputs(self, names=VIEWS) -> list:
        """The views' widgets, in VIEWS' order (the served API's outputs), those of `names` only."""
        return [self.views[name] for name in VIEWS if name in names and name in self.views]

    def fill(self, v: Views) -> dict:
        """The views `v` holds as updates of their widgets, by component."""
        return {widget: FILL[name](v) if name in FILL else v[name] for name, widget in self.views.items() if name in v}

    # -- layout -------------------------------------------------------------------------------------------------

    def _prompt(self) -> None:
        s = self.settings
        s["prompt"] = gr.Textbox(label="Prompt", lines=5, value=DEFAULT_PROMPT, elem_id="ddv-prompt",
                                 info="raw text to continue; with the chat template on, the user's message")
        # chat models and their drafters were trained on chat-formatted text (engine/prompts.py); the switches
        # follow the target's tokenizer once it has loaded (the page's timer)
        with gr.Row(elem_id="ddv-chat-row"):
            s["chat"] = gr.Checkbox(value=False, interactive=False, label="Chat template", elem_id="ddv-chat",
                                    info="waiting for the model's tokenizer")
            # unticked while disabled (a disabled box drawn ticked read as on); ticked once a template has the switch
            s["thinking"] = gr.Checkbox(value=False, interactive=False, label="Thinking", elem_id="ddv-thinking",
                                        info="the template's thinking switch (enable_thinking)")
        s["system"] = gr.Textbox(value="", label="System message (chat template only; blank: none)", lines=1,
                                 elem_id="ddv-system")

    def _decoding(self) -> None:
        s = self.settings
        with gr.Row():
            s["budget"] = gr.Slider(1, 512, value=32, step=1, label="Budget (tree nodes)", elem_id="ddv-budget-nodes")
            s["block_size"] = gr.Slider(2, BLOCK_MAX, value=BLOCK_MAX, step=1, label="Block size", elem_id="ddv-block")
            s["max_new_tokens"] = gr.Slider(1, 512, value=64, step=1, label="Max new tokens", elem_id="ddv-max-new")
        with gr.Row():
            s["verify"] = gr.Radio(list(VERIFY_LABELS), value="exact", label="Verification")
            s["method"] = gr.Radio(list(METHODS), value="ddtree", label="Method")
            s["tree_scoring"] = gr.Dropdown(list(TREE_SCORINGS), value=MARGINAL, elem_id="ddv-tree-scoring",
                                            label="Tree scoring (selector: a DFlash2 drafter's pair scores)")
        with gr.Row(elem_id="ddv-sampling"):  # the target's choice: greedy, or position-keyed sampling
            s["temperature"] = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)",
                                         elem_id="ddv-temperature")
            s["top_p"] = gr.Slider(0.01, 1, value=1, step=0.01, label="Top-p (1 = off)", elem_id="ddv-top-p")
            # text boxes: what was typed reaches read_settings, whose message names the field (a gr.Number refuses
            # "-1" or "abc" itself: "Value -1 is less than minimum value 0.")
            s["top_k"] = gr.Textbox(value="0", max_lines=1, label="Top-k (0 = off)", elem_id="ddv-top-k")
            s["seed"] = gr.Textbox(value="0", max_lines=1, label=f"Seed (0 to {MAX_SEED})", elem_id="ddv-seed")
            self.controls["new_seed"] = gr.Button("New seed", size="sm", elem_id="ddv-new-seed")

    def _buttons(self) -> None:
        c = self.controls
        with gr.Row():
            c["step"] = gr.Button("Step", variant="primary", elem_id="ddv-step")
            c["run"] = gr.Button("Run", elem_id="ddv-run")
            c["check_transformers"] = gr.Button("Check vs transformers",
                                                elem_id="ddv-check-transformers")
            # stops this tab's Run or check (actions.stop), which then says what it reached
            c["stop"] = gr.Button("Stop", elem_id="ddv-stop-button")
            c["reset"] = gr.Button("Reset", elem_id="ddv-reset")
            c["back"] = gr.Button("Back", elem_id="ddv-back")
            c["forward"] = gr.Button("Forward", elem_id="ddv-forward")

    def _rounds(self) -> None:
        c = self.controls
        with gr.Row():
            self.views["view"] = gr.Slider(0, 1, value=0, step=1, label="Round", elem_id="ddv-round")
            c["phase"] = gr.Radio(list(PHASES), value="verified", label="Phase of the round")
            # the tree's filters, for the tree on screen and its export alike (actions.tree_filter): a budget-512 tree
            # is a blob without them. Text boxes, not gr.Number: an empty Number arrives as 0, and blank means "off"
            c["depth"] = gr.Textbox(label="Max depth", placeholder="blank: all depths", max_lines=1,
                                    elem_id="ddv-tree-depth")
            c["min_lp"] = gr.Textbox(label="Hide below log-prob", placeholder="blank: show all", max_lines=1,
                                     elem_id="ddv-tree-minlp")

    def _views(self) -> None:
        v = self.views
        v["status"] = gr.Markdown(first_status(), elem_id="ddv-status")  # what to do, from the first load on
        v["prompt"] = gr.HTML(elem_id="ddv-prompt-view")  # the prompt as prefilled: templated, special tokens marked
        with gr.Row():
            v["tree_spec"] = gr.Plot(label=TITLES["tree_spec"], elem_id="ddv-tree")
            v["tree_b_spec"] = gr.Plot(label=TITLES["tree_b_spec"], visible=False, elem_id="ddv-tree-b")
        v["compare"] = gr.HTML(visible=False, elem_id="ddv-compare")
        # why did this round stop there: the stop, the node inspector (click a node in the tree, or pick it), the grid
        v["stop"] = gr.HTML(elem_id="ddv-stop")
        with gr.Row():
            v["inspect"] = gr.Dropdown(choices=[], value=None, label="Inspect node (or click one in the tree)",
                                       elem_id="ddv-inspect", scale=1)
            with gr.Column(scale=5):
                v["inspector"] = gr.HTML(elem_id="ddv-inspector")
        self.controls["inspect_click"] = gr.Textbox(elem_id="ddv-inspect-click", elem_classes=["ddv-hidden"],
                                                    container=False)
        v["grid_spec"] = gr.Plot(label=TITLES["grid_spec"], elem_id="ddv-grid")
        with gr.Row():
            v["mask_spec"] = gr.Plot(label=TITLES["mask_spec"], elem_id="ddv-mask")
            v["cache_chart_spec"] = gr.Plot(label=TITLES["cache_chart_spec"], elem_id="ddv-cache-chart")
        gr.Markdown(HEADINGS["cache_html"], elem_id="ddv-cache-heading")
        v["cache_html"] = gr.HTML(elem_id="ddv-cache")
        # gr.HTML draws no label: each panel's heading is a Markdown line of its own (issue #26)
        gr.Markdown(HEADINGS["diff_html"], elem_id="ddv-diff-heading")
        v["diff_html"] = gr.HTML(elem_id="ddv-diff")
        # the question a user came with (issue #65 item 6): the numbers beside the figure, the command that measures
        # this machine's costs where none are
        gr.Markdown("**Does the tree pay here? Speed-up over greedy by budget** (predicted from this session's "
                    "rounds and this machine's measured costs)", elem_id="ddv-pays-heading")
        with gr.Row(elem_id="ddv-pays-row"):
            v["pays_spec"] = gr.Plot(label="Speed-up over greedy by budget (predicted)", visible=False,
                                     elem_id="ddv-pays")
            v["pays_html"] = gr.HTML(elem_id="ddv-pays-text")
        with gr.Row():
            v["acceptance_spec"] = gr.Plot(label=TITLES["acceptance_spec"], elem_id="ddv-acceptance")
            v["depth_spec"] = gr.Plot(label=TITLES["depth_spec"], elem_id="ddv-depth")
        with gr.Row():
            v["budget_spec"] = gr.Plot(label=TITLES["budget_spec"], elem_id="ddv-budget")
            v["stats"] = gr.Markdown(elem_id="ddv-stats")
        gr.Markdown(HEADINGS["divergence"], elem_id="ddv-divergence-heading")
        v["divergence"] = gr.HTML(elem_id="ddv-divergence")

    def _files(self) -> None:
        c = self.controls
        with gr.Row():
            c["trace_in"] = gr.File(label=f"Replay a saved trace (.json, at most {MAX_UPLOAD_BYTES // 2**20} MB)",
                                    file_types=[".json"], type="filepath", elem_id="ddv-upload")
            c["download"] = gr.Button("Download trace (.json)", elem_id="ddv-download")
            c["download_file"] = gr.DownloadButton("Download trace file", visible=False, elem_id="ddv-download-file")
            # the whole session as one HTML file that steps through every round offline (render/supplement.py)
            c["download_session"] = gr.Button("Download session (.html)", elem_id="ddv-download-session")
            c["session_file"] = gr.DownloadButton("Download session file", visible=False, elem_id="ddv-session-file")
        with gr.Row(elem_id="ddv-export-row"):  # paper-ready export of the round on screen (render/export.py)
            c["fmt"] = gr.Dropdown(list(exporter.FORMATS), value="svg", label="Export format",
                                   elem_id="ddv-export-format")
            c["figure"] = gr.Dropdown(list(exporter.FIGURES), value="tree", label="Figure", elem_id="ddv-export-figure")
            c["show"] = gr.Radio(list(exporter.SHOW_CHOICES), value="text", label="Node labels",
                                 elem_id="ddv-export-show")
            c["colors"] = gr.Radio(["colorblind", "grayscale"], value="colorblind", label="Colours",
                                   elem_id="ddv-export-colors")
            c["title"] = gr.Checkbox(value=True, label="Title", elem_id="ddv-export-title")
            c["width"] = gr.Radio(list(exporter.PAPER_WIDTHS), value="column", label="Paper width",
                                  info=" · ".join(f"{name} {cm:g} cm" for name, cm in exporter.PAPER_WIDTHS_CM.items()),
                                  elem_id="ddv-export-width")
            c["export"] = gr.Button("Export figure", elem_id="ddv-export")
            # filled by the export, then clicked by the page (one click for the user); stays as a fallback link
            c["export_file"] = gr.DownloadButton("Download export", visible=False, elem_id="ddv-export-file")
        # the exported figure's print size, and what did not fit the width (render/paper.py)
        c["export_size"] = gr.Markdown(elem_id="ddv-export-size")

    # -- events -------------------------------------------------------------------------------------------------

    def wire(self, page: Page, replay_path: str | None = None) -> None:
        self.page = page
        self._wire_decoding(page)
        self._wire_rounds(page)
        self._wire_files(page, replay_path)

    def show(self, t, ph) -> dict:
        """The tab and every view of the round it shows (figures go out as FigureSpecs: gr.Plot sends their
        to_json(), no plotly validation on the way)."""
        t.notice = ""  # an error shown by the last action is gone once the tab is shown anew
        return {self.page.tab: t, **self.fill(render_views(self.host, t, ph))}

    def note(self, t, message: str) -> dict:
        """An action's error in the status line; every other panel stays as it was (wiring.errors_in_status)."""
        t.notice = message
        return {self.views["status"]: render_check(self.host, t)["status"]}

    @property
    def at_status(self) -> dict:
        """Where an event that redraws the round shows its progress: on the status line only. Gradio's default
        puts a spinner with a ticking timer over every output (about 15 panels), and those overlays' animation
        frames and repaints took most of the browser's time between a Step's click and its answer (issue #26)."""
        return dict(show_progress_on=[self.views["status"]])

    def shown(self) -> list:
        """What `show` fills: the tab's state and every view's widget."""
        return [self.page.tab, *self.outputs()]

    def show_replay(self, t, ph) -> dict:
        """`show` for a replay just loaded, with its prompt put in the Prompt box (what Reset then Step decodes)."""
        return {**self.show(t, ph), self.settings["prompt"]: actions.replay_prompt(t.trace)}

    def shown_replay(self) -> list:
        """What `show_replay` fills."""
        return [*self.shown(), self.settings["prompt"]]

    def noted(self, out: dict, t, values: dict, since: float) -> dict:
        """`out` with the note of a setting changed while its handler ran (its answer rewrites the status)."""
        out[self.views["status"]] += change_note(self.host, t, t.newest_settings(values, since))
        return out

    def _wire_decoding(self, page: Page) -> None:
        """Step, Run, the checks, Reset, New seed. Step and Run show each round at once (check=False) and check it
        against the reference next (on_check, chained with .then): the page answers at the round's speed."""
        host, tab, c = self.host, page.tab, self.controls
        phase, settings, shown = c["phase"], self.settings_by_name(), self.shown()
        checked = [tab, *self.outputs(CHECKED)]

        in_status = errors_in_status(self.note)

        def answered(out: dict, t, values: dict, since: float) -> dict:
            """A Step's or Run's answer, `noted`; the check chained after it reads the page's settings only once
            this answer is in (TabState.answered)."""
            out = self.noted(out, t, values, since)
            t.answered = time.monotonic()
            return out

        @in_status
        def on_step(t, ph, request: gr.Request, **values):
            page.add(request, t)
            since = time.monotonic()
            return answered(self.show(actions.step(host, t, read_settings(host, values), check=False), ph), t,
                            values, since)

        @in_status
        def on_run(t, ph, request: gr.Request, progress=gr.Progress(), **values):
            page.add(request, t)
            since = time.monotonic()
            # each round's views are made only while this Run is still the tab's (actions.run_rounds): a Reset is
            # never followed by a round it ended
            for out in actions.run_rounds(host, t, read_settings(host, values), check=False,
                                          min_interval=actions.RUN_REFRESH_S, views=lambda tab_: self.show(tab_, ph)):
                session = t.session  # None once a Reset has cleared the tab
                if session is not None:
                    progress((len(session.generated), session.max_new_tokens), desc="decoding", unit="tokens")
                yield answered(out, t, values, since)

        on_check, on_independent, on_settled = check_handlers(self, page)
        status = [self.views["status"]]
        at, settle = self.at_status, dict(inputs_kwargs=settings, show_progress="hidden", queue=False, api_name=False)
        # a Step clicked while the last one's check runs goes on (gradio's default, trigger_mode "once", dropped it
        # without a word until the whole chain had ended); one clicked while a Step is on its way is stopped and
        # said by the page's script ("Still working")
        c["step"].click(on_step, [tab, phase], shown, inputs_kwargs=settings, api_name="step", trigger_mode="multiple",
                        **at, **MODEL).then(
            on_check, [tab, phase], checked, inputs_kwargs=settings, api_name="check", **at, **MODEL).then(
            on_settled, [tab], status, **settle)
        run = c["run"].click(on_run, [tab, phase], shown, inputs_kwargs=settings, api_name="run", **at, **MODEL)
        run.then(on_check, [tab, phase], checked, inputs_kwargs=settings, api_name="check_run", **at, **MODEL).then(
            on_settled, [tab], status, **settle)
        c["check_transformers"].click(on_independent, [tab, phase], checked, inputs_kwargs=settings,
                                      api_name="check_transformers", **at, **MODEL).then(
            on_settled, [tab], status, **settle)
        # Stop: at once (no queue: the Run or check it stops holds the model's turn), nothing redrawn here: what it
        # stops says so in its own last answer
        c["stop"].click(lambda t: actions.stop(t) and None, [tab], None, queue=False, show_progress="hidden",
                        api_name="stop")
        # Reset stops this tab's Run: actions.reset ends it at its next round, and the Run's last output is the reset
        # tab
        c["reset"].click(lambda t, ph: self.show(actions.reset(t), ph), [tab, phase], shown, api_name="reset", **at)
        seeded = c["new_seed"].click(lambda: str(actions.new_seed()), None, [self.settings["seed"]],
                                     api_name="new_seed")
        self._wire_changes(page, settings, seeded)

    def _wire_changes(self, page: Page, settings: dict, seeded) -> None:
        """A changed setting (or prompt, or New seed's seed) says in the status whether the next Step starts a new
        session; the tab records the settings sent (TabState.edit) for the handlers that end after the change."""
        status = self.views["status"]

        @shows_errors
        def on_change(t, **values) -> dict:
            t.edit(values)
            return {status: status_after_change(self.host, t, values)}

        for name, widget in settings.items():
            if not name.startswith("compare_"):  # B's settings restart only B
                widget.input(on_change, [page.tab], [status], inputs_kwargs=settings, show_progress="hidden",
                             queue=False)
        seeded.then(on_change, [page.tab], [status], inputs_kwargs=settings, show_progress="hidden", queue=False)

    def _wire_rounds(self, page: Page) -> None:
        """Moving between rounds, the phase, the node inspector."""
        tab, c, v = page.tab, self.controls, self.views
        phase, shown = c["phase"], self.shown()
        inspected = [tab, *self.outputs(("inspector", "inspect"))]

        def show_inspector(t) -> dict:
            html, choices, node = inspector_view(t)
            return {tab: t, **self.fill(Views(inspector=html, node_choices=choices, inspect=node))}

        on_inspect = shows_errors(lambda t, node: show_inspector(actions.inspect(t, node)))
        # '3:nonce' from the page's plotly_click hook (the bonus star's position is past the tree: ignored)
        on_click_node = shows_errors(
            lambda t, value: show_inspector(actions.inspect(t, (value or "").partition(":")[0])))

        at = self.at_status
        c["back"].click(lambda t, ph: self.show(actions.move(t, delta=-1), ph), [tab, phase], shown, api_name="back",
                        **at)
        c["forward"].click(lambda t, ph: self.show(actions.move(t, delta=+1), ph), [tab, phase], shown,
                           api_name="forward", **at)
        v["view"].release(lambda t, ph, value: self.show(actions.move(t, to=int(value) - 1), ph),
                          [tab, phase, v["view"]], shown, api_name="goto_round", **at)
        phase.change(self.show, [tab, phase], shown, api_name="phase", **at)
        on_filter = errors_in_status(self.note)(
            lambda t, ph, min_lp, depth: self.show(actions.set_tree_filter(t, min_lp, depth), ph))
        for box in (c["min_lp"], c["depth"]):  # Enter, or leaving the box
            for event in (box.submit, box.blur):
                event(on_filter, [tab, phase, c["min_lp"], c["depth"]], shown, api_name=False, **at)
        v["inspect"].input(on_inspect, [tab, v["inspect"]], inspected, api_name="inspect")
        c["inspect_click"].change(on_click_node, [tab, c["inspect_click"]], inspected, api_name="inspect_click")

    def _wire_files(self, page: Page, replay_path: str | None) -> None:
        """A trace replayed (uploaded, or --replay FILE at each page load), the trace or the session's supplement
        downloaded, a figure exported."""
        host, tab, c = self.host, page.tab, self.controls
        phase, shown = c["phase"], self.shown()
        export = {name: c[name] for name in ("fmt", "figure", "show", "colors", "min_lp", "depth", "title", "width")}

        @errors_in_status(self.note)
        def on_upload(t, ph, path, request: gr.Request):
            if not path:
                return self.show(t, ph)
            page.files.check_inputs(path, request)  # not another browser's download (tabfiles.py)
            page.add(request, t)
            # messages name the file as uploaded, never the server's temporary path. The upload itself stays for
            # gradio's delete_cache (file_ttl): gradio gives identical uploads one path, which another tab may be
            # about to read.
            return self.show_replay(actions.load_replay(t, path, name=os.path.basename(path)), ph)

        @errors_in_status(self.note)
        def on_replay_file(t, ph, request: gr.Request):  # --replay FILE: read again at each page load
            page.add(request, t)
            return self.show_replay(actions.load_replay(t, replay_path), ph)

        def offered(button: gr.DownloadButton, path, request: gr.Request) -> gr.DownloadButton:
            """The file for this browser only (tabfiles.py: D13)."""
            return gr.DownloadButton(f"Download {path.name}", value=page.files.offer(button, path, request),
                                     visible=True)

        @shows_errors
        def on_download(t, request: gr.Request):
            return offered(c["download_file"], actions.write_trace(t), request)

        @shows_errors
        def on_session(t, request: gr.Request):
            return offered(c["session_file"], actions.write_supplement(t), request)

        @shows_errors
        def on_export(t, ph, request: gr.Request, **values):
            path, note = actions.export_round(t, ph, **values)
            return offered(c["export_file"], path, request), note

        c["trace_in"].upload(on_upload, [tab, phase, c["trace_in"]], self.shown_replay(), api_name="replay",
                             **self.at_status)
        c["download"].click(on_download, [tab], [c["download_file"]], api_name="download").success(
            None, js=click_js("ddv-download-file"))
        c["download_session"].click(on_session, [tab], [c["session_file"]], api_name="download_session").success(
            None, js=click_js("ddv-session-file"))
        c["export"].click(on_export, [tab, phase], [c["export_file"], c["export_size"]], inputs_kwargs=export,
                          api_name="export").success(None, js=click_js("ddv-export-file"))
        # the last export's file (and its size) stays offered only while the settings it was made with are shown
        stale = dict(fn=None, js=stale_js("ddv-export-file"), api_name=False)
        hide = dict(fn=lambda: (gr.DownloadButton(value=None, visible=False), ""), inputs=None,
                    outputs=[c["export_file"], c["export_size"]], queue=False, show_progress="hidden", api_name=False)
        c["export"].click(**stale)
        for widget in export.values():
            widget.change(**stale)
            widget.change(**hide)
        if replay_path:
            page.demo.load(on_replay_file, [tab, phase], self.shown_replay())


def check_handlers(view: StepTab, page: Page) -> tuple:
    """The Step tab's (`view`'s) handlers of a round's check (on_check, after a Step or Run), of the check against
    transformers (on_independent), and of what follows either (on_settled)."""
    host, tab = view.host, page.tab
    in_status = errors_in_status(view.note)

    def check_handler(independent: bool):
        """A check's handler (actions.check_rounds): its views as it goes (its progress on the status line and
        gradio's bar, as the Run's), and the status keeps the note of a setting changed since its inputs were
        read (TabState.newest_settings): after the Step or Run it follows answered, not when the server starts
        it, which under load comes after a change the page made meanwhile."""
        def on(t, ph, progress=gr.Progress(), **values):
            since = t.answered or time.monotonic()  # (an answer is never later than now)
            for _ in actions.check_rounds(host, t, independent=independent):
                p = t.checking
                if p is not None and p.running:
                    progress((p.done, p.total), desc=f"checking against {p.what}", unit="tokens")
                out = view.noted({tab: t, **view.fill(render_check(host, t, ph))}, t, values, since)
                t.settled = time.monotonic()
                yield out
        return in_status(on)

    @shows_errors
    def on_settled(t, **values) -> dict:
        """After a check's last answer: the status line anew, with the note of the page's settings as they are
        now. A setting changed while the check ran says so at once (on_change), but the check's answers come
        over the queue's stream and on_change's straight back: one made just before the change could arrive
        after it and take its note away (a CI failure). With nothing changed the text is the same: nothing
        moves on the page."""
        return {view.views["status"]: status_after_change(host, t, t.newest_settings(values, t.settled))}

    return check_handler(False), check_handler(True), on_settled

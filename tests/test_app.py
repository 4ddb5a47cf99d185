"""The page's logic, control by control, without a browser: ddtree_viz.page (what every callback calls) on real
tiny models, and the real Gradio app served on a free port and called through gradio_client."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddtree_viz.page import actions
from ddtree_viz.page.host import FairLock, ModelHost, cpu_threads
from ddtree_viz.page.state import TabState, Tabs, free_tab, read_settings, rounds_shown
from ddtree_viz.page.views import DIVERGENCE_ROUNDS, ROUND_VIEW_CACHE, inspector_view, render_check, render_views
from ddtree_viz.options import MAX_SEED
from ddtree_viz.errors import InputError, ModelLoadError, TraceError
from tests import tiny

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(prompt="def f(x):\n", budget=8, block_size=8, max_new_tokens=12, verify="exact", method="ddtree")


def args(**over):
    s = {**SETTINGS, **over}
    return [s[k] for k in ("prompt", "budget", "block_size", "max_new_tokens", "verify", "method")]


def settings(host, **over):
    """The Step tab's controls by name (SETTINGS, then `over`), read as Step and Run read them."""
    return read_settings(host, {**SETTINGS, **over})


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return tiny.save_pair(tiny.tiny_pair("hybrid", seed=0), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def host(model_dirs):
    # transformers' forward named: the page's default engine is now "auto" (the static runner on this hybrid), and
    # these tests (test_runner_engine_for_exact_rounds compares the two) keep the reference path as their host
    h = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="transformers")
    h.start(background=False)
    assert h.ready, h.error
    return h


def test_host_describes_the_models_and_cache_layout(host):
    md = host.status_markdown()
    assert "3 Gated DeltaNet" in md and "1 attention" in md and "float32" in md
    assert [r["type"] for r in host.layout] == ["GDN", "GDN", "GDN", "attention"]


def test_the_loaded_models_are_out_of_the_collectors_reach(host):
    """host.settle_heap at load: the models' objects frozen (gc.freeze), so no full collection scans them in a Step."""
    import gc

    assert gc.get_freeze_count() > 0
    tracked = {id(o) for o in gc.get_objects()}  # the collector's generations: frozen objects are not in them
    assert id(host.pair.target) not in tracked and id(host.pair.drafter.layers[0]) not in tracked


def test_step_back_forward_slider_phase_reset(host):
    tab = TabState()
    empty = render_views(host, tab)
    assert empty.tree is None and "Step" in empty.status and empty.cache_rows == host.layout
    for i in range(3):
        tab = actions.step(host, tab, settings(host))
        assert tab.view == i
    v = render_views(host, tab)
    assert v.rounds == 3 and v.view == 2 and "Round 3 of 3" in v.status
    assert len(v.cache_rows) == 4 and "identical to greedy" in v.diff_html
    assert v.tree.data and v.mask.data and v.acceptance.data
    tab = actions.move(tab, delta=-1)
    assert render_views(host, tab).view == 1
    tab = actions.move(tab, delta=+5)
    assert tab.view == 2
    tab = actions.move(tab, to=0)
    drafted = render_views(host, tab, "drafted")
    verified = render_views(host, tab, "verified")
    assert "Round 1 of 3" in drafted.status
    assert len(drafted.tree.data) <= len(verified.tree.data)  # no accepted/bonus marks before verification
    tab = actions.reset(tab)
    assert tab.session is None and render_views(host, tab).rounds == 0


def test_changed_settings_start_over(host):
    tab = actions.step(host, TabState(), settings(host))
    first = tab.session
    tab = actions.step(host, tab, settings(host, budget=4))
    assert tab.session is not first and tab.view == 0 and tab.session.budget == 4


def test_run_to_the_end_yields_every_round(host):
    views = [t.view for t in actions.run_rounds(host, TabState(), settings(host, max_new_tokens=10))]
    tabs = list(actions.run_rounds(host, TabState(), settings(host, max_new_tokens=10)))
    assert tabs and tabs[-1].session.done
    assert views == list(range(len(tabs)))
    v = render_views(host, tabs[-1])
    assert "Finished" in v.status and "identical to greedy for 10 tokens" in v.diff_html
    with pytest.raises(InputError, match="finished"):
        actions.step(host, tabs[-1], settings(host, max_new_tokens=10))


def test_naive_mode_is_labelled_and_shows_its_state_drift(host):
    tab = TabState()
    for _ in actions.run_rounds(host, tab, settings(host, verify="naive (known-wrong: flattened tree)",
                                                    max_new_tokens=24, budget=16)):
        pass
    v = render_views(host, tab)
    assert "known-wrong" in v.status and "known-wrong" in v.diff_html
    assert any(r.get("naive state error") not in (None, "", "–") for r in v.cache_rows if r["type"] == "GDN")


@pytest.mark.parametrize("over, words", [
    (dict(prompt=""), "prompt is empty"),
    (dict(budget=0), "budget"),
    (dict(budget=10**6), "budget"),
    (dict(max_new_tokens=0), "max new tokens"),
    (dict(block_size=1), "block size"),
    (dict(verify="sideways"), "verification mode"),
    (dict(method="beam"), "method"),
])
def test_bad_inputs_raise_clear_errors_and_lose_nothing(host, over, words):
    tab = actions.step(host, TabState(), settings(host))
    before = tab.session
    with pytest.raises(InputError, match=words):
        actions.step(host, tab, settings(host, **over))
    # the tab still works: its records are intact and a good step continues or restarts cleanly
    assert tab.trace is not None and len(tab.trace.steps) >= 1
    tab = actions.step(host, tab, settings(host))
    assert tab.session is not None and not (tab.session is before and len(tab.trace.steps) < 2)


def test_replay_a_saved_trace_without_a_model(host, tmp_path):
    tab = TabState()
    for tab in actions.run_rounds(host, tab, settings(host)):
        pass
    path = tmp_path / "t.json"
    tab.trace.save(path)
    no_model = ModelHost(None, None, "float32", "cpu")  # never started: nothing loaded
    replay = actions.load_replay(TabState(), str(path))
    live, again = render_views(host, tab), render_views(no_model, replay)
    assert again.rounds == live.rounds and "replay" in again.status
    assert again.diff_html.replace("replay", "") and again.cache_rows == live.cache_rows
    with pytest.raises(ModelLoadError):
        actions.step(no_model, TabState(), settings(no_model))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError):
        actions.load_replay(TabState(), str(bad))


def test_token_text_is_escaped_in_every_html_view(host):
    tab = TabState()
    hostile = '<script>alert(1)</script><img src=x onerror=alert(1)>'
    tab = actions.step(host, tab, settings(host, prompt=hostile))
    v = render_views(host, tab)
    for html in (v.diff_html, v.divergence, v.stats, v.status):
        assert "<script" not in html and "<img" not in html


def test_node_inspector_grid_budget_and_depth_views(host):
    tab = TabState()
    for _ in range(2):
        tab = actions.step(host, tab, settings(host, budget=8))
    step = tab.trace.steps[-1]
    v = render_views(host, tab)
    assert v.inspect == step.accepted[-1]  # by default: where the walk stopped
    assert f'data-node="{v.inspect}"' in v.inspector and "target&#x27;s top-5" in v.inspector
    assert [c[1] for c in v.node_choices] == list(range(len(step.nodes)))
    assert "stopped at depth" in v.stop and v.grid is not None and v.budget is not None and v.depth is not None
    assert list(v.budget.data[0].x) == list(range(1, 9)) and v.budget.data[0].y[-1] == step.acceptance
    other = next(n.id for n in step.nodes if n.parent == step.accepted[-1])  # rejected there: not the choice
    tab = actions.inspect(tab, v.node_choices[other][0])  # the selector's label
    html, _, shown = inspector_view(tab)
    assert shown == other and f'data-node="{other}"' in html and "Did the target want this token? no" in html
    tab = actions.inspect(tab, str(len(step.nodes) + 5))  # past the tree (the bonus star): ignored
    assert inspector_view(tab)[2] == other
    with pytest.raises(InputError, match="not a tree position"):
        actions.inspect(tab, "abc")
    tab = actions.move(tab, delta=-1)  # another round: back to its stopping node
    assert inspector_view(tab)[2] == tab.trace.steps[0].accepted[-1]


NO_CHAT = dict(chat=False, system="", thinking=True)  # chat template off, no system message, thinking default
COMPARE = dict(compare_on=True, compare_budget=4, compare_block_size=8, compare_method="dflash", compare_verify="exact",
               compare_engine="same", compare_dtype="same")


def test_compare_mode_steps_both_in_lockstep_and_replays(host, tmp_path):
    tab = actions.step(host, TabState(), settings(host, **sampled_args(temperature=0)))  # A alone first
    # B starts and catches up: lockstep
    tab = actions.step(host, tab, settings(host, **sampled_args(temperature=0), **NO_CHAT, **COMPARE))
    assert len(tab.other.history) == len(tab.session.history) == 2
    assert tab.other.method == "dflash" and tab.other.budget == 4
    v = render_views(host, tab)
    assert v.tree_b is not None and "Compare mode" in v.status and "DFlash chain" in v.status
    assert 'data-side="A"' in v.compare and 'data-side="B"' in v.compare
    assert "B: DFlash chain" in v.tree_b.layout.title.text
    # two lines: the configuration, then the round (one line ran past the half-width panel's edge)
    assert v.tree_b.layout.title.text.split("<br>")[1].startswith("round 2 · ")
    for tab in actions.run_rounds(host, tab, settings(host, **sampled_args(temperature=0), **NO_CHAT, **COMPARE)):
        pass
    assert tab.session.done and tab.other.done
    assert rounds_shown(tab) == max(len(tab.trace.steps), len(tab.other_trace.steps))
    v = render_views(host, tab)
    assert "identical to greedy" in v.compare and v.compare.count("identical to greedy") == 2
    path = tmp_path / "compare.json"
    actions.saved_trace(tab).save(path)
    replay = actions.load_replay(TabState(), str(path))
    again = render_views(ModelHost(None, None, "float32", "cpu"), replay)  # no model
    assert again.compare == v.compare and again.rounds == v.rounds and again.tree_b is not None
    # off again: B is dropped
    tab = actions.step(host, TabState(), settings(host, **sampled_args(temperature=0)))
    tab = actions.step(host, tab, settings(host, **sampled_args(temperature=0), **NO_CHAT,
                                                   **{**COMPARE, "compare_on": False}))
    assert tab.other is None and render_views(host, tab).tree_b is None


def test_compare_step_goes_on_with_b_once_a_has_finished():
    """#27 D9: Step said 'this session has finished ... press Reset' once A had finished while B had not (Run went
    on): Step goes on with B alone, showing B's rounds, until both are done. The embedded pair: DDTree's A (block
    16) finishes rounds before a two-token chain (B)."""
    h = ModelHost(None, None, "float32", "cpu", engine="transformers")
    h.start(background=False)
    s = settings(h, max_new_tokens=12, block_size=16, **dict(COMPARE, compare_block_size=2))
    tab = actions.step(h, TabState(), s)
    while not tab.session.done:
        tab = actions.step(h, tab, s)
    a_rounds = len(tab.session.history)
    assert not tab.other.done
    while not tab.other.done:
        tab = actions.step(h, tab, s)
        assert len(tab.session.history) == a_rounds and tab.view == len(tab.other.history) - 1
    with pytest.raises(InputError, match="has finished"):
        actions.step(h, tab, s)


def test_step_in_a_replay_goes_on_through_it_and_its_prompt_fills_the_box(host, tmp_path):
    """Issue #26.3: Step while a replay is shown shows its next round (no new live session from the Prompt box);
    at its last round it says how to go live; the replay's prompt is what the Prompt box gets."""
    tab = TabState()
    for tab in actions.run_rounds(host, tab, settings(host)):
        pass
    path = tmp_path / "t.json"
    tab.trace.save(path)
    n = len(tab.trace.steps)
    assert n >= 2
    replay = actions.move(actions.load_replay(TabState(), str(path)), to=0)
    other_prompt = settings(host, prompt="something else entirely")
    for k in range(1, n):
        replay = actions.step(host, replay, other_prompt)
        assert replay.replay and replay.session is None and replay.view == k
    assert render_views(host, replay).status.startswith(f"Round {n} of {n} (replay")
    with pytest.raises(InputError, match="last round.*Reset"):
        actions.step(host, replay, other_prompt)
    assert actions.replay_prompt(replay.trace) == SETTINGS["prompt"]
    actions.reset(replay)
    assert actions.step(host, replay, other_prompt).session is not None  # after Reset: live


def test_compare_replay_names_bs_tokens_from_bs_texts(host, tmp_path):
    """Issue #26.2: a compare trace replayed names the tokens only B produced from B's own texts (A's do not hold
    them), as the live page did."""
    import dataclasses

    from ddtree_viz.trace import CompareTrace

    tab = actions.step(host, TabState(), settings(host, **sampled_args(temperature=0), **NO_CHAT, **COMPARE))
    a, b = tab.trace, tab.other_trace
    # B's texts told apart from A's (B's row must read B's, as it reads ids A never produced)
    b = dataclasses.replace(b, token_texts={k: f"β{i}" for i, k in enumerate(b.token_texts)})
    path = tmp_path / "compare.json"
    CompareTrace(a, b).save(path)
    v = render_views(ModelHost(None, None, "float32", "cpu"), actions.load_replay(TabState(), str(path)))
    row_b = v.compare.split('data-side="B"')[1]
    assert all(f">β{list(b.token_texts).index(str(t))}<" in row_b for t in b.output_ids), row_b


def test_compare_naive_and_another_dtype(host):
    tab = TabState()
    naive = dict(COMPARE, compare_budget=8, compare_method="ddtree",
                 compare_verify="naive (known-wrong: flattened tree)", compare_dtype="bfloat16")
    tab = actions.step(host, tab, settings(host, **sampled_args(temperature=0), **NO_CHAT, **naive))
    assert tab.other.verify == "naive" and str(tab.other.pair.dtype) == "torch.bfloat16"
    assert tab.other.pair is host.pair_for("bfloat16")  # loaded once
    v = render_views(host, tab)
    assert "NAIVE" in v.tree_b.layout.title.text and "bfloat16" in v.status
    with pytest.raises(InputError, match="dtype"):
        actions.step(host, tab, settings(host, **sampled_args(temperature=0), **NO_CHAT,
                                         **dict(COMPARE, compare_budget=8, compare_method="ddtree",
                                                compare_dtype="float64")))


# ---------------------------------------------------------------------------------------------------------
# The real app over HTTP (gradio_client)
# ---------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*app_args: str, env: dict | None = None, log: Path | None = None, program: tuple[str, ...] = ()):
    """app.py on a free port; `env`: extra environment; `log`: where its output goes (default: a pipe); `program`:
    the Python arguments that serve it in place of app.py's path (app.py's options follow)."""
    port = free_port()
    out = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 - the child owns it
    program = program or (str(ROOT / "app.py"),)
    proc = subprocess.Popen([sys.executable, *program, "--port", str(port), *app_args], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited: {proc.stdout.read() if proc.stdout else log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("app.py did not start in time")


@pytest.fixture(scope="module")
def served(model_dirs, tmp_path_factory):
    """One app.py on the tiny pair for the served tests of this module, each of them its own client (tab). The
    transformers engine: test_served_page_interleaves_tabs... needs a Run long enough to still be going."""
    proc, url = serve("--target", str(model_dirs[0]), "--draft", str(model_dirs[1]), "--engine", "transformers",
                      log=tmp_path_factory.mktemp("served") / "app.log")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_served_app_steps_and_reports_errors_over_http(served):
    from gradio_client import Client

    client = Client(served, verbose=False)
    deadline = time.time() + 60
    while True:  # the models load in the background; stepping before that is a clear error (in the status)
        out = client.predict("verified", *args(), api_name="/step")
        if "Round 1 of 1" in out[0]:
            break
        assert "loading" in out[0] or time.time() < deadline, out[0]
        time.sleep(0.5)
    status = out[0]
    assert "Round 1 of 1" in status
    out = client.predict("verified", *args(), api_name="/step")
    assert "Round 2 of 2" in out[0]
    with pytest.raises(Exception, match="less than minimum"):  # the Budget slider's own range check
        client.predict("verified", *args(budget=0), api_name="/step")
    out = client.predict("verified", *args(), api_name="/step")  # still serving, same tab state
    assert "Round" in out[0]
    # #26.5: a user's error is the status line's first words (no error raised: the other panels keep their values)
    assert "prompt is empty" in client.predict("verified", *args(prompt=""), api_name="/step")[0]
    # #26.6: a round's check ends after the round is shown; a setting changed meanwhile keeps its note in the status
    # the check writes (the check read the old status and dropped the note: CI's browser test met it under load)
    from ddtree_viz.page.views import NEW_SESSION

    client.predict("verified", *args(), api_name="/step")
    assert NEW_SESSION not in client.predict("verified", *args(), api_name="/check")[0]
    assert NEW_SESSION in client.predict("verified", *args(budget=5), api_name="/check")[0]


def test_a_handler_that_ends_after_a_setting_changed_keeps_its_note(host):
    """#26.6 under load (CI's browser test): a round's check is chained after the Step, so its inputs are the
    page's settings when it started; a budget changed while it ran wrote the note, then the check's answer wrote
    the status without it. The page's change handler records the settings on the tab (TabState.edit) and the check
    (as the app wires it) reads the newest. Likewise where the change comes before the server starts the check but
    after the page read the check's inputs (CI's browser test again, a queued check)."""
    import gradio as gr

    from ddtree_viz.page.views import NEW_SESSION
    from ddtree_viz.page.web.app import build_app

    demo = build_app(host)
    fns = {f.api_name: f for f in demo.fns.values()}
    budget = next(b._id for b in demo.blocks.values() if getattr(b, "elem_id", None) == "ddv-budget-nodes")
    on_budget = next(f for f in demo.fns.values() if any(t[0] == budget and t[1] == "input" for t in f.targets))
    values = {**SETTINGS, **sampled_args(temperature=0.0, top_p=1.0, top_k=0, seed=0)}
    tab = actions.step(host, TabState(), settings(host), check=False)

    def status_of(out) -> str:  # a handler's answer (a generator's: its last, what the page shows at its end)
        out = list(out)[-1] if not isinstance(out, dict) else out
        return next(v for k, v in out.items() if getattr(k, "elem_id", "") == "ddv-status")

    assert NEW_SESSION not in status_of(fns["check"].fn(tab, "verified", **values))
    answers = []
    with host.lock:  # the check starts, with the old budget, and waits for the model
        waiting = host.lock._next + 1
        check = threading.Thread(target=lambda: answers.append(list(fns["check"].fn(tab, "verified", **values))))
        check.start()
        while host.lock._next < waiting:
            time.sleep(0.01)
        changed = on_budget.fn(tab, **{**values, "budget": 5})  # the page's own handler, as the browser calls it
        assert NEW_SESSION in next(iter(changed.values()))
    check.join(timeout=120)
    assert NEW_SESSION in status_of(answers[0]), status_of(answers[0])

    # the change comes after the Step answered and before the server starts the check chained after it (whose
    # inputs the page read at the answer): the check's answer keeps the note too
    tab = TabState()
    fns["step"].fn(tab, "verified", gr.Request(session_hash="t"), **values)
    on_budget.fn(tab, **{**values, "budget": 5})
    assert NEW_SESSION in status_of(fns["check"].fn(tab, "verified", **values))
    # a change back to the settings the session runs with: no note
    on_budget.fn(tab, **values)
    assert NEW_SESSION not in status_of(fns["check"].fn(tab, "verified", **values))

    # the check's last answer made just before a change, and the change's own answer shown first (it comes straight
    # back, the check's over the queue's stream): the status written once the check has ended (on_settled, chained
    # after it) has the note again, read from the page's settings then; changed back, none
    settled = next(f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "on_settled")
    tab = TabState()
    fns["step"].fn(tab, "verified", gr.Request(session_hash="t"), **values)
    assert NEW_SESSION not in status_of(fns["check"].fn(tab, "verified", **values))
    on_budget.fn(tab, **{**values, "budget": 5})
    assert NEW_SESSION in status_of(settled.fn(tab, **{**values, "budget": 5}))
    on_budget.fn(tab, **values)
    assert NEW_SESSION not in status_of(settled.fn(tab, **values))


def test_app_binds_localhost_and_does_not_share_by_default():
    from ddtree_viz.page.web import app

    args_ = app.build_parser().parse_args([])
    assert args_.host == "127.0.0.1" and args_.share is False


def test_runner_engine_for_exact_rounds(model_dirs, host):
    """app.py --engine runner: exact rounds go through the static runner with the same records; naive rounds
    stay on transformers' forward."""
    fast = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="runner")
    fast.start(background=False)
    assert "runner engine" in fast.status_markdown()
    tab, ref = TabState(), TabState()
    for _ in range(3):
        tab = actions.step(fast, tab, settings(fast))
        ref = actions.step(host, ref, settings(host))
    assert tab.session.engine == "runner" and ref.session.engine == "transformers"
    assert [r.accepted for r in tab.trace.steps] == [r.accepted for r in ref.trace.steps]
    assert tab.trace.output_ids == ref.trace.output_ids
    assert "identical to greedy" in render_views(fast, tab).diff_html
    naive = actions.step(fast, TabState(), settings(fast, verify="naive (known-wrong: flattened tree)"))
    assert naive.session.engine == "transformers"


SAMPLING = dict(temperature=1.0, top_p=0.9, top_k=20, seed=4)


def sampled_args(**over):
    return {**SAMPLING, **over}


def test_sampling_controls_decode_the_targets_own_sample(host, tmp_path):
    """Temperature / top-p / top-k / seed on the page: the rounds equal the target's own position-keyed sampling,
    the status names the settings and how to reproduce them, the hover shows the sample and its probability, a
    new seed starts over, and the saved trace replays with the same words."""
    from ddtree_viz.engine.sampling import Sampler
    from ddtree_viz.engine.reference import greedy_decode

    tab = TabState()
    for tab in actions.run_rounds(host, tab, settings(host, **sampled_args(max_new_tokens=16))):
        pass
    pair = host.pair
    ids = pair.tokenizer(SETTINGS["prompt"], add_special_tokens=False)["input_ids"]
    reference = greedy_decode(pair.target, ids, 16, pair.eos_token_ids, Sampler(1.0, 20, 0.9, 4)).ids
    assert tuple(tab.session.generated) == reference
    v = render_views(host, tab)
    assert "sampling (T 1, top-k 20, top-p 0.9, seed 4)" in v.status
    assert "--temperature 1 --top-k 20 --top-p 0.9 --seed 4" in v.status
    assert "identical to sampled reference for 16 tokens" in v.diff_html
    hover = " ".join(str(h) for trace in v.tree.data for h in (trace.hovertext or ()))
    assert "target sample: id" in hover and "(p 0." in hover and "its sample, p" in hover
    first = tab.session
    tab = actions.step(host, tab, settings(host, **sampled_args(max_new_tokens=16, seed=5)))
    assert tab.session is not first and tab.session.sampler.seed == 5 and tab.view == 0
    path = tmp_path / "sampled.json"
    tab.trace.save(path)
    replay = render_views(ModelHost(None, None, "float32", "cpu"), actions.load_replay(TabState(), str(path)))
    assert "replay" in replay.status and "seed 5" in replay.status and "--seed 5" in replay.status
    seeds = {actions.new_seed() for _ in range(20)}
    assert len(seeds) > 1 and all(0 <= s <= MAX_SEED for s in seeds)


@pytest.mark.parametrize("over, words", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top-p"),
    (dict(top_k=-3), "top-k"),
    (dict(top_k=2.5), "top-k"),
    (dict(seed=2**32), "seed"),
    # #26.5: top-k and seed are text boxes, so what was typed reaches the check that names the field
    (dict(seed="-1"), "seed must be between 0 and"),
    (dict(top_k="abc"), "top-k must be a whole number, not 'abc'"),
])
def test_bad_sampling_inputs_are_clear_errors(host, over, words):
    with pytest.raises(InputError, match=words):
        actions.step(host, TabState(), settings(host, **sampled_args(**over)))


def test_typed_top_k_and_seed_read_as_numbers(host):
    s = settings(host, **sampled_args(top_k=" 20 ", seed="7"))
    assert (s.decode.top_k, s.decode.seed) == (20, 7)
    assert settings(host, **sampled_args(top_k="", seed="")).decode.seed == 0  # blank: off / 0


def test_an_error_is_the_status_lines_first_words_and_the_round_stays(host):
    """#26.5: an action's error goes to the tab's notice, first in the status line; the round shown stays; the next
    view of the tab drops it."""
    tab = actions.step(host, TabState(), settings(host))
    before = render_views(host, tab)
    tab.notice = "seed must be between 0 and 4294967295, not -1 <b>*x*</b>"
    after = render_views(host, tab)
    assert after.status.startswith("**⚠ seed must be between 0 and 4294967295, not -1 &#60;b&#62;&#42;x&#42;")
    assert after.status.endswith(before.status) and after.tree == before.tree
    assert render_check(host, TabState(notice="prompt is empty")).status.startswith("**⚠ prompt is empty")


# ---------------------------------------------------------------------------------------------------------
# Hostile and clumsy use of the page (issue #19)
# ---------------------------------------------------------------------------------------------------------


def _run_in_thread(host, tab, **over):
    """Run to the end in a thread (as the page's Run handler does); returns the thread and the rounds it showed."""
    import threading

    shown = []
    started = threading.Event()

    def go():
        for t in actions.run_rounds(host, tab, settings(host, **over)):
            shown.append(len(t.trace.steps) if t.trace is not None else 0)
            started.set()
        started.set()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    assert started.wait(120)
    return thread, shown


def test_reset_during_run_stops_it_within_one_round(host):
    """Reset was undone: the Run held its own copy of the tab, carried on to the end and showed it again."""
    tab = TabState()
    # 'import sys' runs 500 tokens before the tiny target's end of text ('def f(x):' ends after 42, so a fast
    # engine could finish the whole Run before the Reset and the bound below would not say anything)
    thread, shown = _run_in_thread(host, tab, prompt="import sys\n", max_new_tokens=500, budget=1)
    actions.reset(tab)
    at_reset = len(shown)
    thread.join(60)
    assert not thread.is_alive()
    assert len(shown) <= at_reset + 1 < 400  # at most the round already under way; far from the end
    assert tab.trace is None and tab.session is None
    assert "Type a prompt" in render_views(host, tab).status


def test_a_new_prompt_stops_a_run_within_one_round(host):
    tab = TabState()
    thread, shown = _run_in_thread(host, tab, prompt="import sys\n", max_new_tokens=500, budget=1)
    actions.step(host, tab, settings(host, prompt="class Point:\n"))
    at_step = len(shown)
    thread.join(60)
    assert not thread.is_alive() and len(shown) <= at_step + 1 < 400
    assert tab.session.prompt == "class Point:\n" and len(tab.trace.steps) == 1


def test_run_on_a_finished_session_leaves_the_tab_as_it_was(host):
    """Run on a finished session yielded nothing, which blanked the whole page."""
    tab = TabState()
    for tab in actions.run_rounds(host, tab, settings(host, max_new_tokens=6)):
        pass
    before, view = tab.trace, tab.view
    with pytest.raises(InputError, match="finished"):
        next(actions.run_rounds(host, tab, settings(host, max_new_tokens=6)))
    assert tab.trace is before and tab.view == view
    assert "Finished" in render_views(host, tab).status


def _free(lock, seconds: float = 10.0) -> bool:
    """Whether another thread takes `lock` (the tab's RLock or the model's FairLock) within `seconds`."""
    took = threading.Event()

    def take():
        with lock:
            took.set()
    threading.Thread(target=take, daemon=True).start()
    return took.wait(seconds)


def _yields_on_threads(gen, host, tab) -> int:
    """Drive a page generator as gradio does: each next() on a worker thread of its own (kept alive, as a pool's
    are), and at every yield both locks free for a third thread. Returns the yields."""
    done, keep, n = object(), threading.Event(), 0
    while True:
        got = []

        def resume():
            got.append(next(gen, done))
            keep.wait()
        threading.Thread(target=resume, daemon=True).start()
        while not got:
            time.sleep(0.001)
        if got[0] is done:
            keep.set()
            return n
        n += 1
        assert _free(tab.lock) and _free(host.lock), f"a lock held at yield {n}"


def test_the_pages_generators_hold_no_lock_at_a_yield_and_go_on_from_any_thread(host):
    """CI froze a tab: the check chained after a Run that a Reset ended yielded while holding the tab's RLock;
    gradio resumed it on another worker thread, the release raised, and the lock stayed held by the first thread:
    the next Run's check waited for it for ever (the status said 'Checking against the reference next'). Every
    generator the page drives is resumed here on a new thread each time, and at each yield another thread takes
    both locks."""
    tab = TabState()
    assert _yields_on_threads(actions.check_rounds(host, tab), host, tab) == 1  # nothing to check: a Reset's tab
    run = actions.run_rounds(host, tab, settings(host, prompt="import sys\n", max_new_tokens=16, budget=2),
                             check=False, min_interval=0.0)
    assert _yields_on_threads(run, host, tab) >= 2
    assert tab.trace.reference_pending
    assert _yields_on_threads(actions.check_rounds(host, tab, min_interval=0.0), host, tab) >= 2
    assert not tab.trace.reference_pending and tab.trace.first_divergence is None and tab.checking is None
    assert _yields_on_threads(actions.check_rounds(host, tab, independent=True, min_interval=0.0), host, tab) >= 1
    assert "equal" in tab.independent or "identical" in tab.independent, tab.independent


def _arrive(lock: FairLock, work, order: list | None = None, name: str = "") -> threading.Thread:
    """A thread that asks for `lock` (then notes `name` in `order` while it holds it), or runs `work` (which asks for
    it itself); returned once it has asked (its ticket taken), so the order of arrival is the order of the calls."""
    asked = lock._next + 1
    if work is None:
        def work():
            with lock:
                order.append(name)
    t = threading.Thread(target=work)
    t.start()
    while lock._next < asked:
        time.sleep(0.001)
    return t


def test_model_turns_are_granted_in_arrival_order_and_a_holder_asking_again_goes_behind():
    """The model lock goes to whoever asked first, in the order they asked; a holder that releases it and asks again
    at once (a Run between two rounds, a check between two turns) goes behind every waiter (a Step of another tab),
    where threading.Lock lets it take the lock straight back (the loop below with a threading.Lock, its waiter
    blocked 10 ms before the release: the holder went first in 59 of 60 trials on the development machine)."""
    lock, order = FairLock(), []
    lock.__enter__()  # tab A's Run, a round
    waiting = [_arrive(lock, None, order, name) for name in ("step of tab B", "step of tab C", "check of tab D")]
    lock.__exit__()  # A's round done: it asks again at once for its next round
    with lock:
        order.append("run of tab A, next round")
    for t in waiting:
        t.join(10)
    assert order == ["step of tab B", "step of tab C", "check of tab D", "run of tab A, next round"]
    for _ in range(20):
        order = []
        lock.__enter__()
        waiter = _arrive(lock, None, order, "waiter")
        lock.__exit__()
        with lock:
            order.append("holder again")
        waiter.join(10)
        assert order == ["waiter", "holder again"]
    with lock:  # and with no one waiting, the holder takes it again at once
        pass
    assert lock._next == lock._serving


def test_a_check_takes_the_model_a_round_at_a_time_and_another_tabs_step_goes_between(host):
    """Tab A's check after a long Run takes the model about one round's time at a time (progress.turn_tokens): each
    turn decodes no more tokens than about a round's time at the reference's pace, and tab B's Step, asked for
    during A's first turn, is served right after it, not after A's whole check (a check that took 0.5 s of tokens
    a turn held the model 2.2 s at once on a loaded machine, and B's Step waited for it). Both tabs' results stay
    their own and exact."""
    a, b = TabState(), TabState()
    for a in actions.run_rounds(host, a, settings(host, prompt="import sys\n", max_new_tokens=60, budget=2),
                                check=False):
        pass
    session, turns, stepping = a.session, [], []  # per turn of A's check: B's rounds by then, tokens it decoded
    greedy = session.greedy

    def turn(*args, **kwargs):
        had = len(session.check_reference().ids) if session.check_reference() is not None else 0
        if len(turns) == 1:  # B's Step asks for the model now, while A holds it for its second turn
            stepping.append(_arrive(host.lock, lambda: actions.step(host, b, settings(host, prompt="class P:\n"))))
        result = greedy(*args, **kwargs)
        turns.append((len(b.session.history) if b.session is not None else 0, len(result.ids) - had))
        return result

    session.greedy = turn
    try:
        actions.check(host, a)
    finally:
        del session.greedy
    stepping[0].join(60)
    rounds = [r for r, _ in turns]
    assert rounds[1] == 0 and rounds[2] == 1, turns  # B's round came right after the turn it asked during
    ref = session.check_reference()
    token_s = ref.token_seconds / (len(ref.ids) - 1)
    round_s = sum(sum(r.timings_ms.values()) for r in session.history) / len(session.history) / 1e3
    most = 2 * max(1, round_s / token_s) + 1  # (the pace and a round's time vary a little over the check)
    assert max(n for _, n in turns) <= most, (turns, round_s, token_s)
    assert not a.trace.reference_pending and a.trace.first_divergence is None
    assert a.trace.output_ids == a.trace.greedy_ids and len(a.trace.output_ids) == 60
    b = actions.check(host, b)
    assert b.trace.prompt == "class P:\n" and len(b.trace.steps) == 1
    assert b.trace.first_divergence is None and b.trace.greedy_ids == b.trace.output_ids


def test_compare_mode_catches_b_up_and_checks_it_in_turns_another_tabs_step_between(host, monkeypatch):
    """Compare mode switched on mid-session: B catches up with A's rounds a round a turn of the model, and B's
    reference is decoded in the check's turns (after A's), not in the Step's turn: another tab's Step goes in
    between (B caught up 12 rounds, and its reference every token, in the Step's one turn)."""
    from ddtree_viz.engine.session import DecodeSession

    a, c = TabState(), TabState()
    for _ in range(12):
        a = actions.step(host, a, settings(host, max_new_tokens=40, budget=2, block_size=2), check=False)
    order, stepping = [], []
    real = DecodeSession.step

    def step(self):
        order.append("A" if self is a.session else "C" if self is c.session else "B")
        if order.count("B") == 2 and not stepping:  # tab C's Step asks while B catches up
            stepping.append(_arrive(host.lock, lambda: actions.step(host, c, settings(host, prompt="class P:\n"))))
        return real(self)

    monkeypatch.setattr(DecodeSession, "step", step)
    on = settings(host, max_new_tokens=40, budget=2, block_size=2, compare_on=True, compare_budget=4,
                  compare_block_size=2)  # (at most 2 tokens a round: neither finishes)
    a = actions.step(host, a, on, check=False)
    stepping[0].join(60)
    at = order.index("C")
    assert "B" in order[:at] and order[at + 1:].count("B") >= 2 and order.count("B") == 13, order  # C between
    assert order[-2:] == ["A", "B"] and len(a.other.history) == len(a.session.history) == 13
    assert a.other_trace.reference_pending  # B's reference: the check's
    b_ref = a.other.check_reference()
    assert b_ref is None or len(b_ref.ids) < len(a.other.generated)
    a = actions.check(host, a)
    assert not a.other_trace.reference_pending and a.other_trace.greedy_ids[:len(a.other.generated)] == tuple(
        a.other.generated) and a.other_trace.first_divergence is None


def test_replay_of_a_trace_with_no_rounds_says_so(tmp_path):
    from ddtree_viz.engine.session import DecodeSession

    session = DecodeSession.of(tiny.tiny_pair("hybrid"), budget=2, max_new_tokens=4)
    session.prefill("a")
    path = tmp_path / "zero.json"
    session.to_trace().save(path)
    tab = actions.load_replay(TabState(), str(path))
    status = render_views(ModelHost(None, None, "float32", "cpu"), tab).status
    assert "no rounds" in status and "Type a prompt" not in status


def test_replay_mode_says_no_model_rather_than_a_failed_load():
    host = ModelHost(None, None, "float32", "cpu")
    host.replay_only = True
    assert "Replay mode (no model)" in host.status_markdown() and "failed" not in host.status_markdown()
    with pytest.raises(ModelLoadError, match="replay mode \\(no model\\)"):
        host.require()


def test_a_tab_that_goes_away_is_freed_with_its_files(host, tmp_path):
    tab = actions.step(host, TabState(), settings(host))
    folder = tab.new_folder("trace")
    (folder / "t.json").write_text("{}")
    again = tab.new_folder("trace")  # a second download replaces the first
    assert again == folder and not (folder / "t.json").exists()
    tabs = Tabs()
    tabs.add("session-1", tab)
    assert tabs.close("session-1") and not tabs.close("session-1")
    assert tab.trace is None and tab.session is None and not folder.exists()
    free_tab(TabState())  # gradio's delete_callback: nothing to free is fine


def test_served_page_interleaves_tabs_reset_stops_run_and_hides_server_paths(served, tmp_path):
    """Over HTTP: another tab's Step goes in while one tab's Run is under way (it waited for the whole Run), Reset
    stops the Run, Run on a finished session is an error that changes nothing, and a bad upload's message names the
    file, not the server's temporary path."""
    from gradio_client import Client, handle_file

    # the transformers engine (served) and a long Run: tab A's Run must still be going when tab B's Step is answered
    a, b = Client(served, verbose=False), Client(served, verbose=False)
    deadline = time.time() + 60
    while True:  # the models load in the background
        try:
            b.predict("verified", *args(), api_name="/step")
            break
        except Exception as exc:  # noqa: BLE001
            assert "loading" in str(exc) and time.time() < deadline, exc
            time.sleep(0.5)
    # 'import sys' runs 500 tokens before the tiny target's end of text ('def f(x):' ends after 42)
    run = a.submit("verified", *args(prompt="import sys\n", max_new_tokens=500, budget=1), api_name="/run")
    while not run.outputs():  # its first round is on screen
        assert not run.done(), run.exception()
        time.sleep(0.1)
    start = time.time()
    out = b.predict("verified", *args(), api_name="/step")  # tab B's Step, while tab A runs
    assert "Round 2 of 2" in out[0] and not run.done(), "tab B waited for tab A's whole Run"
    step_s = time.time() - start
    a.predict("verified", api_name="/reset")
    deadline = time.time() + 30
    while not run.done():
        assert time.time() < deadline, "Reset did not stop the Run"
        time.sleep(0.1)
    assert "Type a prompt" in a.predict("verified", api_name="/phase")[0]  # and it stays reset
    assert step_s < 30
    # Run on a finished session: an error, and the page keeps what it showed
    for _ in b.submit("verified", *args(max_new_tokens=6), api_name="/run"):
        pass
    shown = b.predict("verified", api_name="/phase")[0]
    assert "finished" in b.predict("verified", *args(max_new_tokens=6), api_name="/run")[0]  # in the status
    assert b.predict("verified", api_name="/phase")[0] == shown and "Finished" in shown
    # a bad upload names the file as uploaded, never the server's temporary folder
    bad = tmp_path / "my-trace.json"
    bad.write_bytes(b'{"schema_version": 1, "prompt": "\xff\xfe"}')  # not UTF-8: a message that names the file
    said = b.predict("verified", handle_file(str(bad)), api_name="/replay")[0]  # the status line
    assert "cannot read trace file my-trace.json" in said
    assert "/tmp" not in said and "gradio" not in said


def test_abandoned_tabs_leave_memory_and_temp_files_bounded(tmp_path):
    """20 browser tabs each replay a 1.2 MB trace (every fifth also downloads it and exports a figure) and go away.
    A tab's records, files and gradio session are freed when it closes (gradio's unload); uploads and gradio's copies
    of what it served go after --file-ttl (with the empty temp files gradio's upload parser leaves, one an upload): the
    server's memory stays where it was after the first 6 tabs, and the temp folders empty. (Before: every tab's
    records and gradio's copy of its figures stayed for an hour, ~5 MB a tab.) 14 tabs after the first 6 are
    enough to tell (it was 40, then 20): a tab kept is ~5 MB, so 14 kept add ~70 MB, 30 MB over the 40 MB bound,
    where 20 freed tabs grew the server by 14 MB; the first 6 warm the server (its caches, gradio's queue) so that
    what grows after them is what the tabs leave."""
    import json
    import re
    from concurrent.futures import ThreadPoolExecutor

    from gradio_client import Client, handle_file

    from tests.test_hostile import many_rounds_trace

    session = __import__("ddtree_viz.engine.session", fromlist=["x"]).DecodeSession.of(
        tiny.tiny_pair("hybrid"), budget=4, max_new_tokens=6)
    session.prefill("def f(x):\n")
    session.run()
    big = tmp_path / "session.json"
    big.write_text(json.dumps(many_rounds_trace(json.loads(session.to_trace().to_json()), 300, 16)))
    gradio_tmp, sys_tmp = tmp_path / "gradio", tmp_path / "tmp"
    gradio_tmp.mkdir()
    sys_tmp.mkdir()
    env = {"GRADIO_TEMP_DIR": str(gradio_tmp), "TMPDIR": str(sys_tmp), "GRADIO_HEARTBEAT_INTERVAL": "0.5"}
    proc, url = serve("--replay", str(big), "--file-ttl", "8", env=env, log=tmp_path / "app.log")

    def rss_mb() -> float:
        return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{proc.pid}/status").read_text()).group(1)) / 1024

    def files(root: Path) -> list[Path]:
        return [p for p in root.rglob("*") if p.is_file()]

    def abandoned_tab(i):
        # a generous read timeout: four tabs at once on a loaded 2-core machine (CI with other work, or the suite's
        # other worker) can keep a replay's answer past httpx's default 5 s; the test is about memory, not speed
        client = Client(url, verbose=False, httpx_kwargs={"timeout": 180})
        out = client.predict("verified", handle_file(str(big)), api_name="/replay")
        assert "Round 300 of 300" in out[0]
        if i % 5 == 0:
            client.predict(api_name="/download")
            client.predict("verified", "json", "tree", "text", "colorblind", "", "", True, api_name="/export")
        client.close()  # the tab goes away: its heartbeat stops

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(abandoned_tab, range(6)))
            time.sleep(3)
            warm = rss_mb()
            list(pool.map(abandoned_tab, range(6, 20)))
        time.sleep(3)
        after = rss_mb()
        deadline = time.time() + 40
        while (files(gradio_tmp) or files(sys_tmp)) and time.time() < deadline:
            time.sleep(1)
        left = files(gradio_tmp) + files(sys_tmp)
        print(f"\n20 abandoned tabs: server memory {warm:.0f} MB after 6 tabs, {after:.0f} MB after 20; "
              f"temp files left {len(left)}")
        # each tab held ~5 MB (its records, gradio's copy of its figures): kept, 14 more tabs would add ~70 MB
        assert after - warm < 40, (warm, after)
        assert left == [], left
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_step_shows_the_round_first_and_the_check_follows(model_dirs):
    """The page's Step: the round without extending the reference (check=False), then `check`: the comparison
    covers only what the reference has reached until then, and everything after. A new prompt with the same
    settings keeps the tab's engines (the runner and the reference's runner: no new state, no graph capture).
    The check against transformers' forward reports agreement and its own time."""
    fast = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="runner")
    fast.start(background=False)
    tab = actions.step(fast, TabState(), settings(fast), check=False)
    tab = actions.step(fast, tab, settings(fast), check=False)
    trace = tab.trace
    assert trace.reference_pending and len(trace.greedy_ids) < len(trace.output_ids)
    v = render_views(fast, tab)
    assert "Checking against the reference" in v.status and "checked so far" in v.diff_html
    assert "not checked against the greedy reference yet" in v.diff_html
    checked = render_check(fast, actions.check(fast, tab))
    assert not tab.trace.reference_pending and tab.trace.greedy_ids == tab.trace.output_ids
    assert "identical to greedy for" in checked.diff_html and "Checking" not in checked.status
    assert "the runner (one-node trees on a second static runner)" in checked.stats
    assert "reference: the runner" in checked.diff_html and "numerical noise" in checked.diff_html
    engine, reference, runners = (tab.session.target_engine, tab.session.reference_engine,
                                  (tab.session.target_engine.runner, tab.session.reference_engine.runner))
    first = tab.session
    tab = actions.step(fast, tab, settings(fast, prompt="class Point:\n"), check=False)
    assert tab.session is not first and tab.session.target_engine is engine
    assert tab.session.reference_engine is reference
    assert (engine.runner, reference.runner) == runners
    tab = actions.check_transformers(fast, tab)  # the session's reference has not checked these tokens yet
    assert "**agrees**" in tab.independent and "not compared with it" in tab.independent
    tab = actions.check_transformers(fast, actions.check(fast, tab))
    assert "**agrees**" in tab.independent and "ms in all" in tab.independent
    assert "agrees with it" in tab.independent and tab.independent in render_check(fast, tab).stats
    tab = actions.step(fast, tab, settings(fast, prompt="class Point:\n", budget=4))  # other settings: new engines
    assert tab.session.target_engine is not engine and tab.independent == ""


def test_a_divergence_on_the_page_carries_its_verdict(host):
    """Naive verification on the hybrid: the comparison names the first divergence and its verdict (the run's
    measured noise is far below greedy's margin there), and the statistics say so too."""
    tab = TabState()
    naive = dict(prompt="def f(x):\n", verify="naive (known-wrong: flattened tree)", max_new_tokens=40, budget=16)
    for tab in actions.run_rounds(host, tab, settings(host, **naive), check=False):
        pass
    v = render_check(host, actions.check(host, tab))
    assert tab.trace.divergence_verdict == "mismatch"
    assert "beyond numerical noise: mismatch (margin" in v.diff_html and "beyond numerical noise" in v.stats


# ---------------------------------------------------------------------------------------------------------
# Chat template, system message, thinking
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_host(tmp_path_factory):
    target, draft = tiny.save_pair(tiny.chat_pair(seed=4), tmp_path_factory.mktemp("chat-models"))
    h = ModelHost(str(target), str(draft), "float32", "cpu")
    h.start(background=False)
    assert h.ready, h.error
    return h


def chat_args(chat=True, system="", thinking=True, **over):
    return {**sampled_args(temperature=0.0, top_p=1.0, top_k=0, seed=0, **over), "chat": chat, "system": system,
            "thinking": thinking}


def test_chat_template_switch_system_and_thinking(chat_host):
    """The page's chat controls: the prefill is the templated conversation (apply_chat_template's ids), the
    thinking switch and system message change it (a new session), the view shows the templated prompt with its
    special tokens marked and the user's text escaped, and the trace records how the prompt was given."""
    from ddtree_viz.engine.prompts import PromptSpec, encode

    assert chat_host.has_chat_template and chat_host.takes_thinking
    assert "chat template: yes, with a thinking switch" in chat_host.status_markdown()
    hostile = "Say <script>alert(1)</script> & stop"
    tab = actions.step(chat_host, TabState(),
                       settings(chat_host, **chat_args(prompt=hostile, system="Be brief.", thinking=False)))
    expected = encode(chat_host.pair.tokenizer, PromptSpec(text=hostile, chat=True, system="Be brief.", thinking=False))
    assert tuple(tab.session.prompt_ids) == expected.ids
    v = render_views(chat_host, tab)
    assert '<b class="ddv-special">&lt;|im_start|&gt;</b>' in v.prompt and "&lt;/think&gt;" in v.prompt
    assert "<script" not in v.prompt and "&lt;script&gt;" in v.prompt
    assert "chat template on: 2 messages (system, user), thinking off" in v.prompt
    assert tab.trace.chat_template and tab.trace.thinking is False and tab.trace.messages[0]["content"] == "Be brief."
    first = tab.session
    tab = actions.step(chat_host, tab, settings(chat_host, **chat_args(prompt=hostile, system="Be brief.",
                                                                       thinking=True)))
    assert tab.session is not first and tab.session.prompt_ids != list(expected.ids)
    for tab in actions.run_rounds(chat_host, tab, settings(chat_host, **chat_args(prompt=hostile, system="Be brief.",
                                                                                  thinking=True))):
        pass
    assert "identical to greedy" in render_views(chat_host, tab).diff_html
    # chat off: the same box is raw text; the system message is not used
    raw = actions.step(chat_host, TabState(),
                       settings(chat_host, **chat_args(chat=False, prompt="def f():", system="ignored")))
    assert raw.session.prompt == "def f():" and "raw text (no chat template)" in render_views(chat_host, raw).prompt


def test_chat_template_off_and_refused_without_a_template(host):
    assert not host.has_chat_template and "no chat template" in host.status_markdown()
    with pytest.raises(InputError, match="no chat template"):
        actions.step(host, TabState(), settings(host, **chat_args(chat=True)))
    # thinking unused without chat
    tab = actions.step(host, TabState(), settings(host, **chat_args(chat=False, thinking=False)))
    assert tab.trace.chat_template is False and tab.trace.thinking is None


# Issue #17: what the page costs, and what its figures say
# ---------------------------------------------------------------------------------------------------------


def test_page_threads_leave_a_core_to_the_server_and_browser():
    assert cpu_threads("cpu", cores=2) == 1 and cpu_threads("cpu", cores=1) == 1
    assert cpu_threads("cpu", cores=16) == 15 and cpu_threads("cuda", cores=16) == 1
    from ddtree_viz.page.web import app as web

    parsed = web.build_parser().parse_args([])
    assert parsed.engine == "auto" and parsed.threads is None


def test_default_engine_on_the_page_is_auto_and_named(model_dirs):
    """Issue #17, point 4: the page runs exact rounds on the fastest exact engine (auto: the runner on a hybrid), says
    so, and names the engine that ran in the stats; naive rounds stay on transformers."""
    auto = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu")
    auto.start(background=False)
    assert auto.engine == "auto" and auto.exact_engine == "runner"
    assert "exact rounds on the runner engine (auto: the fastest exact engine" in auto.status_markdown()
    tab = actions.step(auto, TabState(), settings(auto))
    assert tab.session.engine == "runner"
    v = render_views(auto, tab)
    assert "| engine | runner |" in v.stats
    assert actions.step(auto, TabState(),
                        settings(auto, verify="naive (known-wrong: flattened tree)")).session.engine == "transformers"


def test_the_exact_engine_is_chosen_once_per_pair(model_dirs, monkeypatch):
    """The views of every Step ask which engine runs exact rounds (the budget panel's costs); the choice walks the
    target's modules (~1,000 at 64 layers: 2 ms of a 6 ms render on a CPU), so the host makes it once per loaded
    pair, and again for a new pair."""
    import dataclasses

    from ddtree_viz.page import host as host_module

    auto = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu")
    auto.start(background=False)
    asked = []
    monkeypatch.setattr(host_module, "default_engine", lambda target: asked.append(target) or "runner")
    tab = TabState()
    for _ in range(3):
        tab = actions.step(auto, tab, settings(auto))
        render_views(auto, tab)
    assert asked == [auto.pair.target] and auto.exact_engine == "runner"
    auto.pair = dataclasses.replace(auto.pair)  # another pair (a reload): asked again
    assert auto.exact_engine == "runner" and len(asked) == 2


def test_stats_say_what_each_time_measures(host):
    """Issue #17, point 3: engine time per round, the Step's wall time on the server split into its parts, and both
    tokens/s measured the same way (model time only)."""
    tab = TabState()
    for _ in range(2):
        tab = actions.step(host, tab, settings(host))
    stats = render_views(host, tab).stats
    for label in ("engine time per round, mean (draft + tree + verify + commit)",
                  "greedy tokens/s (the reference's model time, prefill included)",
                  "DDTree tokens/s (engine time, prefill included)",
                  "speedup over greedy (both model time only, none of the page's own work)",
                  "last Step on the server, wall time (not the browser's drawing)", "| engine | transformers |"):
        assert label in stats, label
    t = tab.timing
    assert t["n_rounds"] == 1 and t["rounds"] == sum(tab.trace.steps[-1].timings_ms.values())
    assert t["reference"] > 0 and t["step"] >= t["rounds"] + t["reference"] - 1e-6 and t["views"] > 0


def test_greedy_and_ddtree_tokens_per_second_count_the_prefill_alike(model_dirs):
    """The page's speed ratio on the runner: the reference starts from a copy of the session's prefilled state, so
    its own time has no prefill; the page counts the session's prefill on the greedy side too (DDTree's figure has
    it), and shows no greedy figure while the check is still to come (it read 0.0 tokens/s after a Run)."""
    fast = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="runner")
    fast.start(background=False)
    tab = actions.step(fast, TabState(), settings(fast), check=False)
    tab = actions.step(fast, tab, settings(fast), check=False)
    assert tab.trace.reference_pending
    pending = render_views(fast, tab).stats
    assert "| greedy tokens/s (the reference's model time, prefill included) | – |" in pending
    assert "| speedup over greedy (both model time only, none of the page's own work) | – |" in pending
    tab = actions.check(fast, tab)
    assert tab.session.reference_shares_prefill and not tab.trace.reference_pending
    greedy = len(tab.trace.greedy_ids) / (tab.greedy_s + tab.trace.prefill_ms / 1e3)
    stats = render_views(fast, tab).stats
    assert f"| greedy tokens/s (the reference's model time, prefill included) | {greedy:.1f} |" in stats
    reference = ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="transformers")
    reference.start(background=False)
    tab = actions.step(reference, TabState(), settings(reference))  # transformers' reference makes its own prefill
    assert not tab.trace.reference_pending and not tab.session.reference_shares_prefill
    greedy = len(tab.trace.greedy_ids) / tab.greedy_s
    assert f"| greedy tokens/s (the reference's model time, prefill included) | {greedy:.1f} |" in (
        render_views(reference, tab).stats)


def test_run_redraws_at_a_bounded_rate_and_the_reference_keeps_up(host):
    """Run with min_interval: fewer redraws than rounds, the last one finished, and every redraw's records carry
    the greedy reference up to the tokens generated so far."""
    every = list(t.view for t in actions.run_rounds(host, TabState(), settings(host, max_new_tokens=24)))
    tab, seen = TabState(), []
    for tab in actions.run_rounds(host, tab, settings(host, max_new_tokens=24), min_interval=3600):
        seen.append(len(tab.trace.steps))
        assert len(tab.trace.greedy_ids) == len(tab.trace.output_ids)
    assert seen == [len(every)] and tab.session.done  # one redraw: at the end
    assert tab.timing["n_rounds"] == len(every)


def test_long_session_views_are_cached_per_round_and_bounded(host):
    """Issue #17, point 5: a round's views are built once per tab (scrubbing back reuses them), the disagreement
    table shows at most DIVERGENCE_ROUNDS rounds, and the session's records are not re-walked per Step."""
    tab = TabState()
    for tab in actions.run_rounds(host, tab, settings(host, max_new_tokens=48, budget=4, block_size=3)):
        pass
    n = len(tab.trace.steps)
    assert n > DIVERGENCE_ROUNDS + 2
    v = render_views(host, tab)
    assert v.divergence.count("<tr>") == DIVERGENCE_ROUNDS + 1  # header + the last 20 rounds
    assert f"rounds {n - DIVERGENCE_ROUNDS + 1}–{n} of {n}" in v.divergence
    tab = actions.move(tab, to=3)
    first = render_views(host, tab)
    assert first.divergence.count("<tr>") == 5 and "scrub back" not in first.divergence
    again = render_views(host, actions.move(tab, to=3))
    assert again.tree_spec is first.tree_spec and again.cache_html is first.cache_html  # built once
    assert render_views(host, tab, "drafted").tree_spec is not first.tree_spec
    assert len(tab.views.rounds) <= ROUND_VIEW_CACHE
    s = tab.session  # the trace's token texts, gathered round by round, name every id the records hold
    ids = set(s.prompt_ids) | set(s.generated) | set(tab.trace.greedy_ids)
    for r in s.history:
        ids |= set(r.target_argmax) | set(r.target_choice) | {node.token_id for node in r.nodes}
        ids |= {t for row in r.target_top_ids + r.draft_top_ids for t in row}
    assert set(map(int, tab.trace.token_texts)) == ids


def test_report_loads_take_no_turn_in_the_one_at_a_time_queue():
    """#27 'Also': a report of 4,096 traces took 42 s in gradio's default one-at-a-time group, so other tabs'
    events (and loads) waited: report loads and their round links have a group of their own, several at once."""
    from ddtree_viz.page.web.app import build_app
    from ddtree_viz.page.web.wiring import REPORT_EVENTS

    demo = build_app(ModelHost(None, None, "float32", "cpu"))
    fns = {f.api_name: f for f in demo.fns.values()}
    for name in ("report_dir", "report_upload", "report_round", "download_misses"):
        assert fns[name].concurrency_id == "reports" and fns[name].concurrency_limit == REPORT_EVENTS > 1


def test_first_screen_words_max_new_tokens_one_and_a_changed_setting(host):
    """#26.6: the status says what to do before anything is stepped; max new tokens 1 finishes at the prefill and
    says so (not 'this session has finished'); a changed setting says the next Step starts a new session."""
    from ddtree_viz.page.views import NEW_SESSION, first_status, status_after_change

    assert "press **Step**" in first_status() and render_views(host, TabState()).status == first_status()
    tab = actions.step(host, TabState(), settings(host, max_new_tokens=1))
    v = render_views(host, tab)
    assert "prefill's token is the whole output" in v.status and "max new tokens 1" in v.status
    assert "finished" not in v.status and len(tab.trace.output_ids) == 1
    assert [x for x in actions.run_rounds(host, TabState(), settings(host, max_new_tokens=1))][-1].trace.steps == ()
    tab = actions.step(host, TabState(), settings(host))
    same = {**SETTINGS, **sampled_args(temperature=0.0, top_p=1.0, top_k=0, seed=0)}
    assert NEW_SESSION not in status_after_change(host, tab, same)
    assert NEW_SESSION in status_after_change(host, tab, {**same, "budget": 5})
    assert NEW_SESSION in status_after_change(host, tab, {**same, "prompt": "x = 1\n"})

"""The page's logic, control by control, without a browser: ddtree_viz.ui (what every callback calls) on real
tiny models, and the real Gradio app served on a free port and called through gradio_client."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_viz import ui
from ddtree_viz.errors import InputError, ModelLoadError, TraceError
from tests import tiny

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(prompt="def f(x):\n", budget=8, block_size=8, max_new_tokens=12, verify="exact", method="ddtree")


def args(**over):
    s = {**SETTINGS, **over}
    return [s[k] for k in ("prompt", "budget", "block_size", "max_new_tokens", "verify", "method")]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return tiny.save_pair(tiny.tiny_pair("hybrid", seed=0), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def host(model_dirs):
    # transformers' forward named: the page's default engine is now "auto" (the static runner on this hybrid), and
    # these tests (test_runner_engine_for_exact_rounds compares the two) keep the reference path as their host
    h = ui.ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="transformers")
    h.start(background=False)
    assert h.ready, h.error
    return h


def test_host_describes_the_models_and_cache_layout(host):
    md = host.status_markdown()
    assert "3 Gated DeltaNet" in md and "1 attention" in md and "float32" in md
    assert [r["type"] for r in host.layout] == ["GDN", "GDN", "GDN", "attention"]


def test_step_back_forward_slider_phase_reset(host):
    tab = ui.TabState()
    empty = ui.render_views(host, tab)
    assert empty.tree is None and "Step" in empty.status and empty.cache_rows == host.layout
    for i in range(3):
        tab = ui.step(host, tab, *args())
        assert tab.view == i
    v = ui.render_views(host, tab)
    assert v.rounds == 3 and v.view == 2 and "Round 3 of 3" in v.status
    assert len(v.cache_rows) == 4 and "identical to greedy" in v.diff_html
    assert v.tree.data and v.mask.data and v.acceptance.data
    tab = ui.move(tab, delta=-1)
    assert ui.render_views(host, tab).view == 1
    tab = ui.move(tab, delta=+5)
    assert tab.view == 2
    tab = ui.move(tab, to=0)
    drafted = ui.render_views(host, tab, "drafted")
    verified = ui.render_views(host, tab, "verified")
    assert "Round 1 of 3" in drafted.status
    assert len(drafted.tree.data) <= len(verified.tree.data)  # no accepted/bonus marks before verification
    tab = ui.reset(tab)
    assert tab.session is None and ui.render_views(host, tab).rounds == 0


def test_changed_settings_start_over(host):
    tab = ui.step(host, ui.TabState(), *args())
    first = tab.session
    tab = ui.step(host, tab, *args(budget=4))
    assert tab.session is not first and tab.view == 0 and tab.session.budget == 4


def test_run_to_the_end_yields_every_round(host):
    views = [t.view for t in ui.run_rounds(host, ui.TabState(), *args(max_new_tokens=10))]
    tabs = list(ui.run_rounds(host, ui.TabState(), *args(max_new_tokens=10)))
    assert tabs and tabs[-1].session.done
    assert views == list(range(len(tabs)))
    v = ui.render_views(host, tabs[-1])
    assert "Finished" in v.status and "identical to greedy for 10 tokens" in v.diff_html
    with pytest.raises(InputError, match="finished"):
        ui.step(host, tabs[-1], *args(max_new_tokens=10))


def test_naive_mode_is_labelled_and_shows_its_state_drift(host):
    tab = ui.TabState()
    for _ in ui.run_rounds(host, tab, *args(verify="naive (known-wrong: flattened tree)", max_new_tokens=24, budget=16)):
        pass
    v = ui.render_views(host, tab)
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
    tab = ui.step(host, ui.TabState(), *args())
    before = tab.session
    with pytest.raises(InputError, match=words):
        ui.step(host, tab, *args(**over))
    # the tab still works: its records are intact and a good step continues or restarts cleanly
    assert tab.trace is not None and len(tab.trace.steps) >= 1
    tab = ui.step(host, tab, *args())
    assert tab.session is not None and not (tab.session is before and len(tab.trace.steps) < 2)


def test_replay_a_saved_trace_without_a_model(host, tmp_path):
    tab = ui.TabState()
    for tab in ui.run_rounds(host, tab, *args()):
        pass
    path = tmp_path / "t.json"
    tab.trace.save(path)
    no_model = ui.ModelHost(None, None, "float32", "cpu")  # never started: nothing loaded
    replay = ui.load_replay(ui.TabState(), str(path))
    live, again = ui.render_views(host, tab), ui.render_views(no_model, replay)
    assert again.rounds == live.rounds and "replay" in again.status
    assert again.diff_html.replace("replay", "") and again.cache_rows == live.cache_rows
    with pytest.raises(ModelLoadError):
        ui.step(no_model, ui.TabState(), *args())
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError):
        ui.load_replay(ui.TabState(), str(bad))


def test_token_text_is_escaped_in_every_html_view(host):
    tab = ui.TabState()
    hostile = '<script>alert(1)</script><img src=x onerror=alert(1)>'
    tab = ui.step(host, tab, *args(prompt=hostile))
    v = ui.render_views(host, tab)
    for html in (v.diff_html, v.divergence, v.stats, v.status):
        assert "<script" not in html and "<img" not in html


def test_node_inspector_grid_budget_and_depth_views(host):
    tab = ui.TabState()
    for _ in range(2):
        tab = ui.step(host, tab, *args(budget=8))
    step = tab.trace.steps[-1]
    v = ui.render_views(host, tab)
    assert v.inspect == step.accepted[-1]  # by default: where the walk stopped
    assert f'data-node="{v.inspect}"' in v.inspector and "target&#x27;s top-5" in v.inspector
    assert [c[1] for c in v.node_choices] == list(range(len(step.nodes)))
    assert "stopped at depth" in v.stop and v.grid is not None and v.budget is not None and v.depth is not None
    assert list(v.budget.data[0].x) == list(range(1, 9)) and v.budget.data[0].y[-1] == step.acceptance
    other = next(n.id for n in step.nodes if n.parent == step.accepted[-1])  # rejected there: not the choice
    tab = ui.inspect(tab, v.node_choices[other][0])  # the selector's label
    html, _, shown = ui.inspector_view(tab)
    assert shown == other and f'data-node="{other}"' in html and "Did the target want this token? no" in html
    tab = ui.inspect(tab, str(len(step.nodes) + 5))  # past the tree (the bonus star): ignored
    assert ui.inspector_view(tab)[2] == other
    with pytest.raises(InputError, match="not a tree position"):
        ui.inspect(tab, "abc")
    tab = ui.move(tab, delta=-1)  # another round: back to its stopping node
    assert ui.inspector_view(tab)[2] == tab.trace.steps[0].accepted[-1]


COMPARE = (True, 4, 8, "dflash", "exact", "same", "same")


def test_compare_mode_steps_both_in_lockstep_and_replays(host, tmp_path):
    tab = ui.step(host, ui.TabState(), *sampled_args(temperature=0))  # A alone first
    tab = ui.step(host, tab, *sampled_args(temperature=0), *COMPARE)  # B starts and catches up: lockstep
    assert len(tab.other.history) == len(tab.session.history) == 2
    assert tab.other.method == "dflash" and tab.other.budget == 4
    v = ui.render_views(host, tab)
    assert v.tree_b is not None and "Compare mode" in v.status and "DFlash chain" in v.status
    assert 'data-side="A"' in v.compare and 'data-side="B"' in v.compare
    assert "B: DFlash chain" in v.tree_b.layout.title.text
    for tab in ui.run_rounds(host, tab, *sampled_args(temperature=0), *COMPARE):
        pass
    assert tab.session.done and tab.other.done
    assert ui.rounds_shown(tab) == max(len(tab.trace.steps), len(tab.other_trace.steps))
    v = ui.render_views(host, tab)
    assert "identical to greedy" in v.compare and v.compare.count("identical to greedy") == 2
    path = tmp_path / "compare.json"
    ui.saved_trace(tab).save(path)
    replay = ui.load_replay(ui.TabState(), str(path))
    again = ui.render_views(ui.ModelHost(None, None, "float32", "cpu"), replay)  # no model
    assert again.compare == v.compare and again.rounds == v.rounds and again.tree_b is not None
    # off again: B is dropped
    tab = ui.step(host, ui.TabState(), *sampled_args(temperature=0))
    tab = ui.step(host, tab, *sampled_args(temperature=0), False, 4, 8, "dflash", "exact", "same", "same")
    assert tab.other is None and ui.render_views(host, tab).tree_b is None


def test_compare_naive_and_another_dtype(host):
    tab = ui.TabState()
    naive = (True, 8, 8, "ddtree", "naive (known-wrong: flattened tree)", "same", "bfloat16")
    tab = ui.step(host, tab, *sampled_args(temperature=0), *naive)
    assert tab.other.verify == "naive" and str(tab.other.pair.dtype) == "torch.bfloat16"
    assert tab.other.pair is host.pair_for("bfloat16")  # loaded once
    v = ui.render_views(host, tab)
    assert "NAIVE" in v.tree_b.layout.title.text and "bfloat16" in v.status
    with pytest.raises(InputError, match="dtype"):
        ui.step(host, tab, *sampled_args(temperature=0), True, 8, 8, "ddtree", "exact", "same", "float64")


# ---------------------------------------------------------------------------------------------------------
# The real app over HTTP (gradio_client)
# ---------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*app_args: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *app_args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited: {proc.stdout.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("app.py did not start in time")


def test_served_app_steps_and_reports_errors_over_http(model_dirs):
    from gradio_client import Client

    proc, url = serve("--target", str(model_dirs[0]), "--draft", str(model_dirs[1]))
    try:
        client = Client(url, verbose=False)
        deadline = time.time() + 60
        while True:  # the models load in the background; stepping before that is a clear error
            try:
                out = client.predict("verified", *args(), api_name="/step")
                break
            except Exception as exc:  # noqa: BLE001
                assert "loading" in str(exc) or time.time() < deadline, exc
                time.sleep(0.5)
        status = out[0]
        assert "Round 1 of 1" in status
        out = client.predict("verified", *args(), api_name="/step")
        assert "Round 2 of 2" in out[0]
        with pytest.raises(Exception, match="less than minimum"):  # the Budget slider's own range check
            client.predict("verified", *args(budget=0), api_name="/step")
        out = client.predict("verified", *args(), api_name="/step")  # still serving, same tab state
        assert "Round" in out[0]
        with pytest.raises(Exception, match="prompt is empty"):
            client.predict("verified", *args(prompt=""), api_name="/step")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_app_binds_localhost_and_does_not_share_by_default():
    from ddtree_viz import web as app

    args_ = app.build_parser().parse_args([])
    assert args_.host == "127.0.0.1" and args_.share is False


def test_runner_engine_for_exact_rounds(model_dirs, host):
    """app.py --engine runner: exact rounds go through the static runner with the same records; naive rounds
    stay on transformers' forward."""
    fast = ui.ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu", engine="runner")
    fast.start(background=False)
    assert "runner engine" in fast.status_markdown()
    tab, ref = ui.TabState(), ui.TabState()
    for _ in range(3):
        tab = ui.step(fast, tab, *args())
        ref = ui.step(host, ref, *args())
    assert tab.session.engine == "runner" and ref.session.engine == "transformers"
    assert [r.accepted for r in tab.trace.steps] == [r.accepted for r in ref.trace.steps]
    assert tab.trace.output_ids == ref.trace.output_ids
    assert "identical to greedy" in ui.render_views(fast, tab).diff_html
    naive = ui.step(fast, ui.TabState(), *args(verify="naive (known-wrong: flattened tree)"))
    assert naive.session.engine == "transformers"


SAMPLING = dict(temperature=1.0, top_p=0.9, top_k=20, seed=4)


def sampled_args(**over):
    s = {**SETTINGS, **SAMPLING, **over}
    return args(**s) + [s[k] for k in ("temperature", "top_p", "top_k", "seed")]


def test_sampling_controls_decode_the_targets_own_sample(host, tmp_path):
    """Temperature / top-p / top-k / seed on the page: the rounds equal the target's own position-keyed sampling,
    the status names the settings and how to reproduce them, the hover shows the sample and its probability, a
    new seed starts over, and the saved trace replays with the same words."""
    from ddtree_viz.engine.sampling import Sampler
    from ddtree_viz.engine.session import greedy_decode

    tab = ui.TabState()
    for tab in ui.run_rounds(host, tab, *sampled_args(max_new_tokens=16)):
        pass
    pair = host.pair
    ids = pair.tokenizer(SETTINGS["prompt"], add_special_tokens=False)["input_ids"]
    reference = greedy_decode(pair.target, ids, 16, pair.eos_token_ids, Sampler(1.0, 20, 0.9, 4)).ids
    assert tuple(tab.session.generated) == reference
    v = ui.render_views(host, tab)
    assert "sampling (T 1, top-k 20, top-p 0.9, seed 4)" in v.status
    assert "--temperature 1 --top-k 20 --top-p 0.9 --seed 4" in v.status
    assert "identical to sampled reference for 16 tokens" in v.diff_html
    hover = " ".join(str(h) for trace in v.tree.data for h in (trace.hovertext or ()))
    assert "target sample: id" in hover and "(p 0." in hover and "its sample, p" in hover
    first = tab.session
    tab = ui.step(host, tab, *sampled_args(max_new_tokens=16, seed=5))
    assert tab.session is not first and tab.session.sampler.seed == 5 and tab.view == 0
    path = tmp_path / "sampled.json"
    tab.trace.save(path)
    replay = ui.render_views(ui.ModelHost(None, None, "float32", "cpu"), ui.load_replay(ui.TabState(), str(path)))
    assert "replay" in replay.status and "seed 5" in replay.status and "--seed 5" in replay.status
    seeds = {ui.new_seed() for _ in range(20)}
    assert len(seeds) > 1 and all(0 <= s <= ui.MAX_SEED for s in seeds)


@pytest.mark.parametrize("over, words", [
    (dict(temperature=-1), "temperature"),
    (dict(top_p=0), "top-p"),
    (dict(top_k=-3), "top-k"),
    (dict(top_k=2.5), "top-k"),
    (dict(seed=2**32), "seed"),
])
def test_bad_sampling_inputs_are_clear_errors(host, over, words):
    with pytest.raises(InputError, match=words):
        ui.step(host, ui.TabState(), *sampled_args(**over))


# ---------------------------------------------------------------------------------------------------------
# Issue #17: what the page costs, and what its figures say
# ---------------------------------------------------------------------------------------------------------


def test_page_threads_leave_a_core_to_the_server_and_browser():
    assert ui.cpu_threads("cpu", cores=2) == 1 and ui.cpu_threads("cpu", cores=1) == 1
    assert ui.cpu_threads("cpu", cores=16) == 15 and ui.cpu_threads("cuda", cores=16) == 1
    from ddtree_viz import web

    parsed = web.build_parser().parse_args([])
    assert parsed.engine == "auto" and parsed.threads is None


def test_default_engine_on_the_page_is_auto_and_named(model_dirs):
    """Issue #17, point 4: the page runs exact rounds on the fastest exact engine (auto: the runner on a hybrid), says
    so, and names the engine that ran in the stats; naive rounds stay on transformers."""
    auto = ui.ModelHost(str(model_dirs[0]), str(model_dirs[1]), "float32", "cpu")
    auto.start(background=False)
    assert auto.engine == "auto" and auto.exact_engine == "runner"
    assert "exact rounds on the runner engine (auto: the fastest exact engine" in auto.status_markdown()
    tab = ui.step(auto, ui.TabState(), *args())
    assert tab.session.engine == "runner"
    v = ui.render_views(auto, tab)
    assert "| engine | runner |" in v.stats
    assert ui.step(auto, ui.TabState(), *args(verify="naive (known-wrong: flattened tree)")).session.engine == "transformers"


def test_stats_say_what_each_time_measures(host):
    """Issue #17, point 3: engine time per round, the Step's wall time on the server split into its parts, and both
    tokens/s measured the same way (model time only)."""
    tab = ui.TabState()
    for _ in range(2):
        tab = ui.step(host, tab, *args())
    stats = ui.render_views(host, tab).stats
    for label in ("engine time per round, mean (draft + tree + verify + commit)",
                  "greedy tokens/s (the reference's model time, prefill included)",
                  "DDTree tokens/s (engine time, prefill included)",
                  "speedup over greedy (both model time only, none of the page's own work)",
                  "last Step on the server, wall time (not the browser's drawing)", "| engine | transformers |"):
        assert label in stats, label
    t = tab.timing
    assert t["n_rounds"] == 1 and t["rounds"] == sum(tab.trace.steps[-1].timings_ms.values())
    assert t["reference"] > 0 and t["step"] >= t["rounds"] + t["reference"] - 1e-6 and t["views"] > 0


def test_run_redraws_at_a_bounded_rate_and_the_reference_keeps_up(host):
    """Run with min_interval: fewer redraws than rounds, the last one finished, and every redraw's records carry
    the greedy reference up to the tokens generated so far."""
    every = list(t.view for t in ui.run_rounds(host, ui.TabState(), *args(max_new_tokens=24)))
    tab, seen = ui.TabState(), []
    for tab in ui.run_rounds(host, tab, *args(max_new_tokens=24), min_interval=3600):
        seen.append(len(tab.trace.steps))
        assert len(tab.trace.greedy_ids) == len(tab.trace.output_ids)
    assert seen == [len(every)] and tab.session.done  # one redraw: at the end
    assert tab.timing["n_rounds"] == len(every)


def test_long_session_views_are_cached_per_round_and_bounded(host):
    """Issue #17, point 5: a round's views are built once per tab (scrubbing back reuses them), the disagreement
    table shows at most DIVERGENCE_ROUNDS rounds, and the session's records are not re-walked per Step."""
    tab = ui.TabState()
    for tab in ui.run_rounds(host, tab, *args(max_new_tokens=48, budget=4, block_size=3)):
        pass
    n = len(tab.trace.steps)
    assert n > ui.DIVERGENCE_ROUNDS + 2
    v = ui.render_views(host, tab)
    assert v.divergence.count("<tr>") == ui.DIVERGENCE_ROUNDS + 1  # header + the last 20 rounds
    assert f"rounds {n - ui.DIVERGENCE_ROUNDS + 1}–{n} of {n}" in v.divergence
    tab = ui.move(tab, to=3)
    first = ui.render_views(host, tab)
    assert first.divergence.count("<tr>") == 5 and "scrub back" not in first.divergence
    again = ui.render_views(host, ui.move(tab, to=3))
    assert again.tree_spec is first.tree_spec and again.cache_html is first.cache_html  # built once
    assert ui.render_views(host, tab, "drafted").tree_spec is not first.tree_spec
    assert len(tab.views.rounds) <= ui.ROUND_VIEW_CACHE
    s = tab.session  # the trace's token texts, gathered round by round, name every id the records hold
    ids = set(s.prompt_ids) | set(s.generated) | set(tab.trace.greedy_ids)
    for r in s.history:
        ids |= set(r.target_argmax) | set(r.target_choice) | {node.token_id for node in r.nodes}
        ids |= {t for row in r.target_top_ids + r.draft_top_ids for t in row}
    assert set(map(int, tab.trace.token_texts)) == ids

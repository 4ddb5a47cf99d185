"""What the page costs, next to what the engine costs: `python -m ddtree_viz.benchmarks.page [--browser | --two-tabs] [--json FILE]`.

Measured side by side in one process, on the page's own code path (ddtree_viz/page/, what its callbacks call):

- per round of a Step on the default prompt (64 new tokens): the round's **engine time** (draft + tree + verify +
  commit, as the records time it), the **Step's server time** without the views (the round, the greedy reference
  extended to the same tokens, the bookkeeping), **render_views** (every view of the new round, built for the
  first time) and the views' **JSON** (what gradio sends: each figure's to_json, the HTML as is). For
  comparison, the same figures built as checked plotly go.Figures and serialised by plotly (the page's path
  before issue #17): the ratio is measured in the same run, round by round.
- a long session (max new tokens 512, block size 4 by default so that it has over 100 rounds): the Step's
  server time (actions.step + render_views + JSON) at round 5 and at round 100.
- `--browser`: the page itself, served by `python app.py` and driven in headless Chromium (Playwright, Debian's
  chromium): wall time from the click on Step until the status says the new round and the browser has drawn
  two frames, medians of rounds 2-11 and 91-100 of a 512-token session (each Step clicked once the last round's
  check has answered); then Run on the default prompt and the
  page's own stats table (engine time per round, greedy and DDTree tokens/s, speedup).
- `--two-tabs` (only these figures): two tabs of the served page, tab A running --long-tokens tokens (then its check
  against the reference) while tab B steps its own session (--prompt-b): each of B's Steps, click to round drawn and
  to its check answered, alone and while A runs or checks; A's rounds, wall time and engine time per round
  (docs/PERFORMANCE.md section 39).

The server's times are taken by the benchmarks' one harness (benchmarks/harness.py: timed_call); the browser's by
performance.now in the page (STEP_JS and its kin: no Python clock sees the frame that paints). No timed assertions
anywhere: these are figures to read (docs/PERFORMANCE.md, "The page"). The process uses the
page's torch threads (page.host.cpu_threads) unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

from ..options import ENGINE_CHOICES
from ..page import actions
from ..page.host import ModelHost, cpu_threads
from ..page.state import TabState, read_settings
from ..page.views import Views, render_views
from ..prompts import DEFAULT_PROMPTS
from ..words import plural
from .harness import clock, median_ms, no_sync, timed_call

DEFAULT_PROMPT = DEFAULT_PROMPTS[2]  # the page's default prompt (page/web/step_tab.py: DEFAULT_PROMPT)


def _payload_ms(views: Views) -> tuple[float, int]:
    """Serialise the views as gradio sends them: figures through to_json, text as is. (ms, bytes)."""
    def payload() -> list[str]:
        return [*(s.to_json() for s in _specs(views) if s), views.status, views.cache_html, views.diff_html,
                views.stats, views.divergence, views.stop, views.inspector, views.compare]

    parts, ms = timed_call(payload, no_sync)
    return ms, sum(len(p) for p in parts)


def _specs(views: Views) -> tuple:
    return (views.tree_spec, views.mask_spec, views.cache_chart_spec, views.acceptance_spec, views.grid_spec,
            views.budget_spec, views.depth_spec, views.tree_b_spec)


def _checked_ms(views: Views) -> float:
    """The same figures as checked plotly go.Figures, serialised by plotly (the path before issue #17)."""
    return timed_call(lambda: [spec.figure().to_json() for spec in _specs(views) if spec is not None], no_sync)[1]


def step_figures(host: ModelHost, prompt: str, budget: int, block_size: int, max_new_tokens: int,
                 checked: bool = True) -> list[dict]:
    """One actions.step per round to the end; per round: engine, step, views, json and (checked) go.Figure ms."""
    tab, out = TabState(), []
    values = dict(prompt=prompt, budget=budget, block_size=block_size, max_new_tokens=max_new_tokens, verify="exact",
                  method="ddtree")
    while tab.session is None or not tab.session.done:
        tab, step_ms = timed_call(lambda: actions.step(host, tab, read_settings(host, values)), no_sync)
        views, views_ms = timed_call(lambda: render_views(host, tab), no_sync)
        json_ms, nbytes = _payload_ms(views)
        row = {"round": views.view + 1, "engine_ms": sum(tab.trace.steps[-1].timings_ms.values()),
               "step_ms": step_ms, "reference_ms": tab.timing.get("reference"), "views_ms": views_ms,
               "json_ms": json_ms, "json_bytes": nbytes, "server_ms": step_ms + views_ms + json_ms}
        if checked:
            row["checked_figures_ms"] = _checked_ms(views)
        out.append(row)
    return out


def _median(rows: list[dict], key: str) -> float | None:
    return median_ms(r.get(key) for r in rows)


def _at(rows: list[dict], round_no: int) -> dict | None:
    return next((r for r in rows if r["round"] == round_no), None)


# ------------------------------------------------------------------------------------------------------------
# In the browser
# ------------------------------------------------------------------------------------------------------------

STEP_JS = """
async (arg) => {
  // click Step, wait until the status names round k of k, then two animation frames (the browser has drawn what
  // is in view: the page draws figures off screen right after, ALL_DRAWN_JS waits for those too); arg: k, or
  // [k, the deadline in ms] (120 s unless said)
  const [k, deadline] = Array.isArray(arg) ? arg : [arg, 120000];
  const status = document.querySelector('#ddv-status');
  const want = `Round ${k} of ${k} `;
  const t0 = performance.now();
  window._ddvStepT0 = t0;
  document.getElementById('ddv-step').click();
  await new Promise((done, fail) => {
    // a click the page never answers is an error after the deadline that says what the status showed, not a wait
    // without end (page.evaluate has no timeout)
    const late = setTimeout(() => {
      obs.disconnect();
      fail(new Error(`no '${want}' ${deadline / 1000} s after the click; the status: ${status.innerText}`));
    }, deadline);
    const check = () => { if (status.innerText.includes(want)) { clearTimeout(late); obs.disconnect(); done(); } };
    const obs = new MutationObserver(check);
    obs.observe(status, {childList: true, subtree: true, characterData: true});
  });
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  return performance.now() - t0;
}
"""

# after STEP_JS: until no figure waits to be drawn (the page's script counts them), then two frames; ms since the click
ALL_DRAWN_JS = """
async () => {
  const frame = () => new Promise((r) => requestAnimationFrame(r));
  while (window.Plotly && window.Plotly._ddvPending) await frame();
  await frame(); await frame();
  return performance.now() - window._ddvStepT0;
}
"""


# after ALL_DRAWN_JS: ms from the click to the start of the frame that painted the new tree (the page's script notes
# it), null when no new tree was drawn
TREE_DRAWN_JS = """
() => { const P = window.Plotly; const t = P && P._ddvTreeFrame;
        return t && t > window._ddvStepT0 ? t - window._ddvStepT0 : null; }
"""


# between Steps (not timed): the round's check against the reference has answered. The Step after it waits for the
# check on the server (one model at a time): a click the moment the last figure is drawn timed the check too, and
# more of it the sooner the figures were drawn
CHECKED_JS = "!document.querySelector('#ddv-status').innerText.includes('Checking against the reference')"


@contextlib.contextmanager
def _served(args, turns: str | None = None):
    """The page served by `python -m ddtree_viz app` on a free port (the models loading in the background): its
    URL, and the app ended after. `turns`: a file where the app notes every turn of its model lock (`timed_app`)."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = ["-m", "ddtree_viz", "app"] if turns is None else ["-c", TIMED_APP, turns]
    app = [sys.executable, *serve, "--port", str(port), "--engine", args.engine]
    if args.threads:
        app += ["--threads", str(args.threads)]
    for opt in ("target", "draft"):
        if getattr(args, opt):
            app += [f"--{opt}", getattr(args, opt)]
    proc = subprocess.Popen(app, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the app did not start") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# the app with its model lock timed (timed_app): `python -c TIMED_APP FILE APP-OPTIONS...`
TIMED_APP = "import sys; from ddtree_viz.benchmarks.page import timed_app; sys.exit(timed_app(sys.argv[1], sys.argv[2:]))"


def timed_app(turns: str, argv: list[str]) -> int:
    """Serve the page (the options of app.py) with its model lock (page.host.ModelHost.lock) timed: every turn a
    JSON line of `turns`: [asked, granted, released] (perf_counter seconds: one clock for every process), the function
    that took it and the id of its tab (page.state.TabState; 0: none)."""
    from ..page import host
    from ..page.web import app

    out = open(turns, "a", buffering=1, encoding="utf-8")  # a line a turn (the app is ended by a signal)

    class TimedLock(host.FairLock):
        def __enter__(self):
            asked, caller = clock(), sys._getframe(1)
            who, tab = caller.f_code.co_name, id(caller.f_locals.get("tab") or 0)
            super().__enter__()
            self._turn = (asked, clock(), who, tab)  # (only the holder writes or reads it)
            return self

        def __exit__(self, *exc):
            asked, granted, who, tab = self._turn
            released = clock()
            super().__exit__(*exc)
            out.write(json.dumps([asked, granted, released, who, tab]) + "\n")

    host.FairLock = TimedLock
    return app.main(argv, prog="timed_app")


def read_turns(path: str, since: float | None = None) -> list[list]:
    """The turns timed_app noted (those asked for at `since`, perf_counter seconds, or later)."""
    with open(path, encoding="utf-8") as f:
        turns = [json.loads(line) for line in f if line.strip()]
    return [t for t in turns if since is None or t[0] >= since]


def turn_figures(turns: list[list]) -> dict:
    """Model lock turns (read_turns): how many; their holds (granted to released) at the median, p90 and most, the
    longest one's holder; the longest wait (asked to granted) and who waited; the longest hold by each function."""
    if not turns:
        return {"turns": 0}
    holds = sorted((t[2] - t[1]) * 1e3 for t in turns)
    held = max(turns, key=lambda t: t[2] - t[1])
    waited = max(turns, key=lambda t: t[1] - t[0])
    by: dict[str, list[float]] = {}
    for t in turns:
        by.setdefault(t[3], []).append((t[2] - t[1]) * 1e3)
    return {"turns": len(turns), "hold_ms_median": statistics.median(holds),
            "hold_ms_p90": holds[int(0.9 * (len(holds) - 1))], "hold_ms_max": holds[-1], "longest_hold_by": held[3],
            "wait_ms_max": (waited[1] - waited[0]) * 1e3, "longest_wait_by": waited[3],
            "hold_ms_max_by": {who: round(max(h), 1) for who, h in by.items()},
            "turns_by": {who: len(h) for who, h in by.items()}}


def _open(browser, url: str):
    """A new browser tab (its own context: a new gradio session) on the page, its models loaded."""
    page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
    page.goto(url)
    page.wait_for_function("(document.querySelector('#ddv-model')?.innerText || '').includes('Model:')",
                           timeout=180_000)
    return page


def _settings(page, prompt: str, budget: int, max_new: int, block: int) -> None:
    page.locator("#ddv-prompt textarea").fill(prompt)
    for elem, value in (("ddv-max-new", max_new), ("ddv-block", block), ("ddv-budget-nodes", budget)):
        box = page.locator(f"#{elem} input[type=number]")
        box.fill(str(value))
        box.press("Enter")


def browser_figures(args, chromium: str) -> dict:
    """Serve the page (python app.py) and drive it in headless Chromium: Step wall times, then Run's stats."""
    from playwright.sync_api import sync_playwright

    with _served(args) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = _open(browser, url)
        _settings(page, args.prompt, args.budget, args.long_tokens, args.long_block_size)
        # the window as a person stepping has it: the Step button at its top, the status and the tree below it
        page.evaluate("document.getElementById('ddv-step').scrollIntoView({block: 'start'})")
        steps, alls, trees = [], [], []
        for k in range(1, args.long_rounds + 1):
            steps.append(page.evaluate(STEP_JS, k))
            alls.append(page.evaluate(ALL_DRAWN_JS))
            trees.append(page.evaluate(TREE_DRAWN_JS))
            page.wait_for_function(CHECKED_JS, timeout=120_000)
        early, late = steps[1:11], steps[-10:]  # round 1 also prefills: left out
        trees = [t for t in trees[1:] if t is not None]
        page.get_by_role("button", name="Reset", exact=True).click()
        page.wait_for_function("document.querySelector('#ddv-status').innerText.includes('Type a prompt')",
                               timeout=60_000)
        _settings(page, args.prompt, args.budget, args.max_new_tokens, args.block_size or 16)
        page.get_by_role("button", name="Run", exact=True).click()
        # the Run, then its check against the reference (a second event): the stats' greedy figure follows it
        page.wait_for_function(f"(s => s.includes('Finished') && {NOT_CHECKING})"
                               "(document.querySelector('#ddv-status').innerText)", timeout=300_000)
        page.wait_for_timeout(500)
        stats = page.locator("#ddv-stats").inner_text()
        browser.close()
    return {"step_wall_ms": steps, "rounds_stepped": len(steps), "step_wall_ms_median_rounds_2_11": statistics.median(early),
            "step_wall_ms_median_last_10": statistics.median(late),
            "all_drawn_ms_median_rounds_2_11": statistics.median(alls[1:11]),
            "all_drawn_ms_median_last_10": statistics.median(alls[-10:]),
            "tree_drawn_ms_median_rounds_2_11": median_ms(trees[:10]),
            "tree_drawn_ms_median_last_10": median_ms(trees[-10:]), "run_stats_table": stats}


# ------------------------------------------------------------------------------------------------------------
# Two tabs: a Step in one while the other runs
# ------------------------------------------------------------------------------------------------------------

NOT_CHECKING = "!s.includes('Checking against the reference')"

# click Step, then ms until the status names round k of k, until the frame that paints its tree starts (the page's
# script notes it: tree) and until its check has answered (checked)
TAB_STEP_JS = f"""
async (k) => {{
  const status = document.querySelector('#ddv-status');
  const want = `Round ${{k}} of ${{k}} `;
  const t0 = performance.now();
  let drawn = null, tree = null, late = null, over = false;
  const frame = () => {{
    const P = window.Plotly;
    if (tree === null && drawn !== null && P && P._ddvTreeFrame > t0) tree = P._ddvTreeFrame - t0;
    if (!over) requestAnimationFrame(frame);
  }};
  document.getElementById('ddv-step').click();
  requestAnimationFrame(frame);
  await new Promise((done) => {{
    setTimeout(() => {{ late = status.innerText; obs.disconnect(); done(); }}, 300000);  // a Step that never answers
    const check = () => {{
      const s = status.innerText;
      if (!s.includes(want)) return;
      if (drawn === null) drawn = performance.now() - t0;
      if ({NOT_CHECKING}) {{ obs.disconnect(); done(); }}
    }};
    const obs = new MutationObserver(check);
    obs.observe(status, {{childList: true, subtree: true, characterData: true}});
  }});
  const checked = performance.now() - t0;
  while (tree === null && late === null && performance.now() - t0 < checked + 2000)
    await new Promise((r) => requestAnimationFrame(r));
  over = true;
  return late === null ? {{drawn, tree, checked}} : {{drawn, tree, checked: null, late}};
}}
"""

# a tab's state from its status line: the round it shows, and whether its Run has finished, its check still going
TAB_STATE_JS = f"""
() => {{
  const s = document.querySelector('#ddv-status').innerText;
  const m = /Round (\\d+) of (\\d+)/.exec(s);
  return {{round: m ? +m[2] : 0, finished: s.includes('Finished'), checking: !({NOT_CHECKING})}};
}}
"""


def _tab_step(page, k: int) -> dict:
    clicked = clock()  # (about the click: the same clock as timed_app's turns)
    step = page.evaluate(TAB_STEP_JS, k)
    if step["checked"] is None:
        raise RuntimeError(f"Step {k} did not answer in 300 s; the status: {step['late']!r}")
    return {**step, "clicked": clicked}


def _step_parts(step: dict, turns: list[list]) -> dict | None:
    """Where a Step's click to its tree went, from its turn of the model (the first `step` turn asked after the
    click): to the lock (gradio, the handler), waiting for it, holding it (the round), then the rest (its views,
    their way to the browser, the browser's drawing)."""
    mine = [t for t in turns if t[3] == "step" and t[0] >= step["clicked"]]
    if not mine or step["tree"] is None:
        return None
    asked, granted, released = mine[0][:3]
    return {"to_lock_ms": (asked - step["clicked"]) * 1e3, "wait_ms": (granted - asked) * 1e3,
            "held_ms": (released - granted) * 1e3, "after_ms": step["tree"] - (released - step["clicked"]) * 1e3}


def two_tab_figures(args, chromium: str) -> dict:
    """Two tabs of one served page: tab B steps its own session (prompt B, each Step clicked once its last check has
    answered), first alone, then all the while tab A runs `long_tokens` tokens and checks them. Per Step of B: the
    ms from its click until its round is on the status line, until its tree is painted and until its check has
    answered, A's phase at the click and the rounds A's status went on meanwhile; A's Run and check, wall time
    (from its click to the first look that finds it checked) and its engine time per round (its stats). The model
    lock's turns (timed_app) from A's click on: every turn's hold, B's longest wait for a turn."""
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, _served(args, turns=f"{tmp}/turns.jsonl") as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        a, b = _open(browser, url), _open(browser, url)
        _settings(a, args.prompt, args.budget, args.long_tokens, args.long_block_size)
        _settings(b, args.prompt_b, args.budget, args.long_tokens, args.long_block_size)
        alone = [_tab_step(b, k) for k in range(1, 7)]
        start = clock()
        a.get_by_role("button", name="Run", exact=True).click()
        a.wait_for_function("/Round [0-9]+ of/.test(document.querySelector('#ddv-status').innerText)",
                            timeout=60_000)
        during, k = [], len(alone)
        while True:
            before = a.evaluate(TAB_STATE_JS)
            if (before["finished"] and not before["checking"]) or b.evaluate(TAB_STATE_JS)["finished"]:
                break
            k += 1
            step = _tab_step(b, k)
            after = a.evaluate(TAB_STATE_JS)
            during.append({**step, "a_phase": "check" if before["finished"] else "run", "a_round": before["round"],
                           "a_rounds_meanwhile": after["round"] - before["round"]})
        total_s = clock() - start
        stats = a.locator("#ddv-stats").inner_text()
        rounds = a.evaluate(TAB_STATE_JS)["round"]
        browser.close()
        turns = read_turns(f"{tmp}/turns.jsonl", since=start)
    for d in during:
        d["parts"] = _step_parts(d, turns)
    engine = next((line.split("\t")[-1] for line in stats.splitlines() if line.startswith("engine time per round")),
                  None)
    b_tab = next((t[4] for t in turns if t[3] == "step"), None)  # (A only runs)
    worst = max(during, key=lambda d: d["tree"] or d["drawn"]) if during else None
    return {"b_alone": alone[1:], "b_during": during, "a_rounds": rounds, "a_run_and_check_s": total_s,
            "a_engine_ms_per_round": engine,
            "b_alone_tree_ms_median": statistics.median(d["tree"] or d["drawn"] for d in alone[1:]),
            "b_during_tree_ms_worst": worst and (worst["tree"] or worst["drawn"]), "b_during_worst": worst,
            "b_during_tree_ms_median": (statistics.median(d["tree"] or d["drawn"] for d in during)
                                        if during else None),
            "b_during_checked_ms_worst": max(d["checked"] for d in during) if during else None,
            "model_turns": turn_figures(turns), "a_turns": turn_figures([t for t in turns if t[4] != b_tab]),
            "b_turns": turn_figures([t for t in turns if t[4] == b_tab])}


def _print_two_tabs(t: dict) -> None:
    during = t["b_during"]
    if not during:
        print("tab B stepped no round while tab A ran (A finished first, or B's session did)")
        return
    print(f"tab A: {plural(t['a_rounds'], 'round')} run, then checked, in {t['a_run_and_check_s']:.1f} s "
          f"({t['a_run_and_check_s'] * 1e3 / max(t['a_rounds'], 1):.0f} ms a round, wall); engine time per round "
          f"{t['a_engine_ms_per_round']}")
    print(f"tab B, a Step (click to its tree painted): alone, median {t['b_alone_tree_ms_median']:.0f} ms; "
          f"while A runs and checks ({plural(len(during), 'Step')}), median {t['b_during_tree_ms_median']:.0f} ms, worst "
          f"{t['b_during_tree_ms_worst']:.0f} ms (to its check answered, worst {t['b_during_checked_ms_worst']:.0f} ms)")
    for phase in ("run", "check"):
        some = [d for d in during if d["a_phase"] == phase]
        if some:
            w = max(some, key=lambda d: d["tree"] or d["drawn"])
            parts = w["parts"] and ", ".join(f"{k[:-3].replace('_', ' ')} {v:.0f}" for k, v in w["parts"].items())
            print(f"  during A's {phase}: {plural(len(some), 'Step')}, worst {w['tree'] or w['drawn']:.0f} ms to the tree "
                  f"(status at {w['drawn']:.0f} ms, checked at {w['checked']:.0f} ms; A's status went on "
                  f"{plural(w['a_rounds_meanwhile'], 'round')} meanwhile; in ms: {parts})")
    a, b = t["a_turns"], t["b_turns"]
    if a["turns"] and b["turns"]:
        print(f"the model lock from A's click on: A's {plural(a['turns'], 'turn')} held {a['hold_ms_median']:.0f} ms at the "
              f"median, {a['hold_ms_p90']:.0f} ms p90, {a['hold_ms_max']:.0f} ms at most ({a['longest_hold_by']}); "
              f"by function {a['hold_ms_max_by']}")
        print(f"  B's {plural(b['turns'], 'turn')}: the longest wait for one {b['wait_ms_max']:.0f} ms "
              f"({b['longest_wait_by']}); "
              f"held {b['hold_ms_max']:.0f} ms at most")


# ------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree_viz.benchmarks.page", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="target model (default: the embedded pair)")
    p.add_argument("--draft", help="drafter (default: the embedded pair's)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--budget", type=int, default=32)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--long-tokens", type=int, default=512, help="max new tokens of the long session (default 512)")
    p.add_argument("--long-block-size", type=int, default=4,
                   help="block size of the long session (default 4: at most 4 tokens a round, over 100 rounds)")
    p.add_argument("--long-rounds", type=int, default=100, help="rounds to step in the long session (default 100)")
    p.add_argument("--engine", default="auto", choices=ENGINE_CHOICES)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the page's, cpu_threads)")
    p.add_argument("--browser", action="store_true", help="also measure the served page in headless Chromium")
    p.add_argument("--browser-only", action="store_true", help="only the browser's figures")
    p.add_argument("--two-tabs", action="store_true",
                   help="only the two tabs' figures: a Step in one tab while another runs --long-tokens tokens")
    p.add_argument("--prompt-b", default=DEFAULT_PROMPTS[3], help="the stepping tab's prompt (--two-tabs)")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--json", metavar="FILE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    if args.two_tabs:
        t = two_tab_figures(args, args.chromium)
        _print_two_tabs(t)
        _write_json(args.json, t)
        return 0
    if args.browser_only:
        b = browser_figures(args, args.chromium)
        print(json.dumps({k: v for k, v in b.items() if k != "step_wall_ms"}, indent=1))
        _write_json(args.json, {"settings": _run_settings(args, args.block_size), "browser": b})
        return 0
    torch.set_num_threads(args.threads or cpu_threads("cpu"))
    host = ModelHost(args.target, args.draft, "float32", "cpu", args.engine)
    host.start(background=False)
    if not host.ready:
        print(f"error: {host.error}", file=sys.stderr)
        return 2
    block = args.block_size or host.pair.drafter.block_size
    print(f"{host.pair.describe()}; exact rounds on the {host.exact_engine} engine; "
          f"{plural(torch.get_num_threads(), 'torch thread')}", flush=True)
    step_figures(host, args.prompt, args.budget, block, 8)  # warm-up: first calls, caches
    rows = step_figures(host, args.prompt, args.budget, block, args.max_new_tokens)
    keys = ("engine_ms", "step_ms", "reference_ms", "views_ms", "json_ms", "checked_figures_ms", "server_ms")
    med = {k: _median(rows, k) for k in keys}
    print(f"\ndefault prompt, {args.max_new_tokens} new tokens, budget {args.budget}, block size {block}: "
          f"{plural(len(rows), 'round')} (medians per round)")
    for k in keys:
        print(f"  {k:<20} {med[k]:8.1f} ms")
    ratio = med["checked_figures_ms"] / max(med["views_ms"] + med["json_ms"], 1e-9)
    print(f"  render_views + JSON vs checked go.Figures + plotly JSON of the same figures: 1 : {ratio:.1f}")

    long = step_figures(host, args.prompt, args.budget, args.long_block_size, args.long_tokens, checked=False)
    at5, at100 = _at(long, 5), _at(long, args.long_rounds) or long[-1]
    print(f"\nlong session: {args.long_tokens} new tokens, block size {args.long_block_size}: {plural(len(long), 'round')}")
    for label, r in (("round 5", at5), (f"round {at100['round']}", at100)):
        print(f"  {label:<10} server time per Step {r['server_ms']:7.1f} ms (engine {r['engine_ms']:.1f}, step "
              f"{r['step_ms']:.1f}, views {r['views_ms']:.1f}, json {r['json_ms']:.1f} ms, {plural(r['json_bytes'], 'byte')})")
    result = {"model": host.pair.describe(), "engine": host.exact_engine, "torch_threads": torch.get_num_threads(),
              "settings": _run_settings(args, block),
              "per_round_median_ms": med, "rounds": rows, "long_rounds": len(long), "long_round_5": at5,
              "long_round_last": at100}
    if args.browser:
        print("\nin the browser (python app.py + headless Chromium, 1500x1100) ...", flush=True)
        b = browser_figures(args, args.chromium)
        result["browser"] = b
        n = b["rounds_stepped"]
        print(f"  Step wall time (click to drawn in view), median of rounds 2-11: "
              f"{b['step_wall_ms_median_rounds_2_11']:.0f} ms; of rounds {n - 9}-{n}: {b['step_wall_ms_median_last_10']:.0f} ms")
        if b["tree_drawn_ms_median_rounds_2_11"] is not None:
            print(f"  click to the frame that paints the new tree: {b['tree_drawn_ms_median_rounds_2_11']:.0f} ms; "
                  f"{b['tree_drawn_ms_median_last_10']:.0f} ms")
        print(f"  click to every figure drawn: {b['all_drawn_ms_median_rounds_2_11']:.0f} ms; "
              f"{b['all_drawn_ms_median_last_10']:.0f} ms")
        print("  after Run, the page's stats table:")
        for line in b["run_stats_table"].splitlines():
            print("    " + line)
    _write_json(args.json, result)
    return 0


def _run_settings(args, block: int | None) -> dict:
    """The run's settings, as its JSON names them (block None: the drafter's)."""
    return {"prompt": args.prompt, "budget": args.budget, "block_size": block, "max_new_tokens": args.max_new_tokens,
            "long_tokens": args.long_tokens, "long_block_size": args.long_block_size, "long_rounds": args.long_rounds}


def _write_json(path: str | None, figures: dict) -> None:
    """The figures to `path` (--json; every mode writes them), and a line that says so."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)
        print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())

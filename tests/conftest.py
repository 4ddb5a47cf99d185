import os
from pathlib import Path

import torch

# The test models are tiny: one thread is fastest and keeps OpenMP from spin-waiting against other processes
# (the app under test, CLI subprocesses) on a 2-core machine. A machine with many cores (the GPU machine, whose
# test files build many CPU models) may give more: DDTREE_TEST_THREADS=8.
torch.set_num_threads(int(os.environ.get("DDTREE_TEST_THREADS", "1")))
# speed-up cost tables (ddtree_viz/speedup.py) go to a folder of this run, never the user's ~/.cache
if "DDTREE_VIZ_CACHE" not in os.environ:
    import tempfile

    os.environ["DDTREE_VIZ_CACHE"] = tempfile.mkdtemp(prefix="ddtree-viz-test-cache-")


# The slowest test files, slowest first (about their seconds in a CI run on 2 cores, where each file runs whole on
# one worker: .ci/run's `-n 2 --dist loadfile --no-loadscope-reorder`). They run first and the many small files
# fill in after them, so that the two workers end together; xdist's default order (files with the most tests
# first) left a slow file of few tests (test_gpu_bench.py, test_analyze.py) to run alone at the end.
SLOWEST_FILES = ("test_browser.py", "test_analyze.py", "test_app.py", "test_export.py", "test_sampling.py",
                 "test_hostile.py", "test_analyze_page.py", "test_gpu_bench.py", "test_runner.py",
                 "test_draft_runner.py", "test_dflash2.py", "test_cli.py", "test_fp8.py", "test_speedup.py")


def pytest_collection_modifyitems(config, items):
    """The slowest files first (SLOWEST_FILES), each file's tests in their own order; the rest as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_terminal_summary(terminalreporter):
    """The seconds of each of the slowest test files (setup + call + teardown, on whichever worker ran it): what
    SLOWEST_FILES is ordered by, printed after --durations' tests. Nothing for a run of one file."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(getattr(report, "duration", None), float) and getattr(report, "when", None):
                name = report.nodeid.split("::")[0]
                totals[name] = totals.get(name, 0.0) + report.duration
    if len(totals) > 1:
        slowest = sorted(totals.items(), key=lambda kv: -kv[1])[:12]
        terminalreporter.write_line("seconds per file: " + ", ".join(f"{Path(n).name} {s:.0f}" for n, s in slowest))

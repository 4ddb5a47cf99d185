"""The 4-bit GEMM's measured launches (engine/kernels/int4_gemm/table.py): a tune's report made into a table (the
fastest launch that ran, one slice for a verify's rows of a wide weight), looked up by band of rows and shape, and what gpu_bench
--int4-table does with a file. Plain data: no Triton, no GPU."""

import json

import pytest

from ddtree_viz.engine.kernels.int4_gemm import table


def tune_report(shape=(5120, 6144)) -> dict:
    """A gpu_bench --int4-tune part as benchmarks/gpu/int4.py writes it: cells with microseconds (or an error) and
    their launch's fields."""
    def cell(us, split, **more):
        return {"us": us, "config": {"block_n": 32, "block_k": 256, "split_k": split, **more}} if us else {
            "error": "OutOfResources", "config": {"split_k": split}}

    return {"gemms": {"down": {"shape": list(shape), "bytes": 1, "bound_us": 1.0, "copies": 3,
                               "1": {"cells": {"a": cell(20.0, 4, gemv=True), "b": cell(15.0, 8, gemv=True),
                                               "c": cell(None, 1)}},
                               "65": {"cells": {"split": cell(50.0, 2, words=True), "one": cell(60.0, 1, words=True)}},
                               "129": {"cells": {"broken": cell(None, 1), "split": cell(40.0, 4, swap=True),
                                                 "one": cell(45.0, 1, swap=True)}}}}}


def test_a_tune_becomes_the_fastest_launch_that_ran_one_slice_for_a_wide_verify():
    made = table.from_tune(tune_report(), "NVIDIA H100 80GB HBM3")
    assert made["device"] == "NVIDIA H100 80GB HBM3"
    assert made["launches"]["1:5120x6144"] == {"block_n": 32, "block_k": 256, "split_k": 8, "gemv": True}
    # a narrow weight's verify may split its input (table.NARROW: small partials), a wide one's may not
    assert made["launches"]["65:5120x6144"]["split_k"] == 2 and made["us"]["65:5120x6144"] == 50.0
    # budget 128's rows in one slice, even for a narrow weight (its slices took a 24 GB card past its cap)
    assert made["launches"]["129:5120x6144"]["split_k"] == 1 and made["us"]["129:5120x6144"] == 45.0
    broken = tune_report()
    broken["gemms"]["down"]["129"]["cells"] = {"broken": {"error": "OutOfResources", "config": {"split_k": 1}}}
    assert "129:5120x6144" not in table.from_tune(broken, "H100")["launches"]  # nothing ran: the rules decide there
    wide = table.from_tune(tune_report((table.NARROW + 1, 5120)), "NVIDIA H100 80GB HBM3")
    assert wide["launches"][f"65:{table.NARROW + 1}x5120"]["split_k"] == 1 and wide["us"][f"65:{table.NARROW + 1}x5120"] == 60.0


@pytest.mark.parametrize("rows, name", [(1, "1"), (2, "16"), (16, "16"), (17, "65"), (65, "65"), (128, "65"),
                                        (129, "129"), (4096, "129")])
def test_rows_fall_in_the_band_of_the_row_count_measured_for_them(rows, name):
    assert table.band(rows) == name


def test_lookup_reads_the_table_in_use_and_the_shipped_one_after(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "int4_tune": tune_report((7, 9))}))
    try:
        table.use(table.load(path))
        assert table.current()["device"] == "NVIDIA H200"
        assert table.lookup(1, 7, 9)["split_k"] == 8 and table.lookup(2, 7, 9) is None
        assert table.lookup(1, 9, 7) is None
    finally:
        table.use(None)
    assert table.lookup(1, 7, 9) is None  # the shipped table has no 7 x 9 weight


def test_a_partial_tune_keeps_the_shipped_launches_it_did_not_measure(tmp_path):
    """A sweep of some row counts or GEMMs (--int4-tune-rows, --int4-tune-narrow) read as --int4-table: its launches
    where it measured, the shipped table's elsewhere, its card named."""
    if not table.SHIPPED.is_file():
        pytest.skip("no measured table shipped")
    shipped = table.load(table.SHIPPED)
    some = next(name for name in shipped["launches"]  # a narrow weight's verify: its split taken (from_tune)
                if name.startswith("65:") and int(name.split(":")[1].split("x")[0]) <= table.NARROW)
    n, k = map(int, some.split(":")[1].split("x"))
    report = tune_report((n, k))
    del report["gemms"]["down"]["1"]
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "int4_tune": report}))
    merged = table.load(path)
    assert merged["device"] == "NVIDIA H200"
    assert merged["launches"][some] == {"block_n": 32, "block_k": 256, "split_k": 2, "words": True} != shipped["launches"][some]
    measured = {some, f"129:{n}x{k}"}
    assert {name: launch for name, launch in merged["launches"].items() if name not in measured} == {
        name: launch for name, launch in shipped["launches"].items() if name not in measured}


def test_the_shipped_table_is_a_tune_of_the_27bs_gemms():
    """tuned.json (when shipped): a card named, every launch a known form's (the one-row form, the word form, the
    swapped verify form), a verify's in one slice."""
    if not table.SHIPPED.is_file():
        pytest.skip("no measured table shipped")
    shipped = table.load(table.SHIPPED)
    assert shipped["device"] and shipped["launches"]
    for name, launch in shipped["launches"].items():
        rows = name.split(":")[0]
        assert sum(bool(launch.get(form)) for form in ("gemv", "words", "swap")) == 1, name
        assert rows in ("1", "16") or launch["split_k"] == 1 or int(name.split(":")[1].split("x")[0]) <= table.NARROW, name


def test_gpu_bench_refuses_a_table_that_is_not_one(tmp_path):
    from ddtree_viz.benchmarks import gpu

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"speed": {}}))
    with pytest.raises(SystemExit, match="neither a 4-bit launch table"):
        gpu.main(["--smoke", "--fast", "--fast-only", "--int4", "--int4-table", str(bad)])
    with pytest.raises(SystemExit):  # argparse: a file that is not there
        gpu.main(["--smoke", "--fast", "--fast-only", "--int4", "--int4-table", str(tmp_path / "none.json")])

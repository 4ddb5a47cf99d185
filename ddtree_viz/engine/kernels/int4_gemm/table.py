"""The 4-bit GEMM's measured launches: for each GEMM shape of the 27B and each band of rows, the fastest launch
`gpu_bench --int4-tune` timed (benchmarks/gpu/int4.py). triton_gemm.choose looks here first and falls back to its
rules for shapes the table lacks (other models, the tests' small weights).

tuned.json beside this file is the table shipped (made by `from_tune` from a tune's JSON, the card named in it);
`gpu_bench --int4-table PATH` uses another for one run (a tune's JSON or a table), so a sweep and the figures it
chooses for can come from one call of a GPU (a partial tune's over the shipped table: `over`). A verify's rows
take a one-slice launch but a narrow weight's at budget 64 (`sliceable`): slices at every GEMM, gate + up's
partials of 129 x 34,816 floats among them, took a 24 GB card past its cap at budget 128 (docs/lab/NOTEBOOK.md
section 39), and so did slices of the narrow weights at 129 rows (section 52).

No Triton here: the table is plain data, read on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

SHIPPED = Path(__file__).with_name("tuned.json")
BANDS = ((1, "1"), (16, "16"), (128, "65"))  # rows up to the first -> the row count measured for them
# output rows up to which a verify's launch may split its input (sliceable): the narrow GEMMs (o_proj, out_proj,
# down_proj: 5,120), whose 64-row tiles are 80 programs on an H100's 132 SMs (down_proj at 65 rows took 10.4x its
# bound, section 51); their float32 partials, at most 4 x 128 x 8,192 x 4 bytes = 17 MB a GEMM, freed before the next
NARROW = 8192
LAST_BAND = "129"

_table: dict | None = None


def band(rows: int) -> str:
    """The measured row count that stands for `rows`: 1 (a decode step), 16 (a DFlash block), 65 / 129 (a verify at
    budget 64 / 128: up to 128 rows, and past)."""
    return next((name for top, name in BANDS if rows <= top), LAST_BAND)


def key(rows: int, n: int, k: int) -> str:
    return f"{band(rows)}:{n}x{k}"


def sliceable(rows: int, n: int) -> bool:
    """Whether a launch at `rows` of an n-output weight may split its input: a step's or a block's always; a
    verify's at budget 64 for a narrow weight (NARROW) alone. Budget 128's narrow launches in 4 slices (a few µs
    faster) took the runner's capture of its 129-row graphs past a 24 GB card's cap where one slice fits (section
    52): why is not known."""
    return rows <= 16 or (n <= NARROW and band(rows) != LAST_BAND)


def from_tune(tune: dict, device: str) -> dict:
    """A table from `gpu_bench --int4-tune`'s report part (int4_tune: per GEMM its [n, k] shape and per row count
    each candidate's microseconds and launch): the fastest launch that ran and matched, in one slice where
    `sliceable` says so."""
    launches, timed = {}, {}
    for row in tune["gemms"].values():
        n, k = row["shape"]
        for rows, cell in row.items():
            if not rows.isdigit():
                continue
            usable = {label: c for label, c in cell["cells"].items() if isinstance(c.get("us"), float)
                      and "config" in c and (c["config"].get("split_k", 1) == 1 or sliceable(int(rows), n))}
            if usable:
                best = min(usable, key=lambda label: usable[label]["us"])
                launches[key(int(rows), n, k)] = usable[best]["config"]
                timed[key(int(rows), n, k)] = usable[best]["us"]
    return {"device": device, "launches": launches, "us": timed}


def over(tuned: dict, base: dict) -> dict:
    """`tuned`'s launches, and `base`'s for the shapes and bands `tuned` did not measure (a sweep of some row counts
    or GEMMs: --int4-tune-rows, --int4-tune-narrow); the card is `tuned`'s."""
    return {"device": tuned["device"], "launches": {**base["launches"], **tuned["launches"]},
            "us": {**base.get("us", {}), **tuned.get("us", {})}}


def load(path: str | Path) -> dict:
    """A table from a file: a table itself, or a gpu_bench report with an --int4-tune part (its launches over the
    shipped table's, so that a partial sweep keeps the shapes it skipped)."""
    data = json.loads(Path(path).read_text())
    if "launches" in data:
        return data
    if "int4_tune" in data and "gemms" in data["int4_tune"]:
        tuned = from_tune(data["int4_tune"], data.get("device", "unknown"))
        return over(tuned, load(SHIPPED)) if SHIPPED.is_file() else tuned
    raise ValueError(f"{path}: neither a 4-bit launch table nor a gpu_bench --int4-tune report")


def use(table: dict | None) -> None:
    """Set the table choose reads (None: the shipped one again)."""
    global _table
    _table = table


def current() -> dict:
    global _table
    if _table is None:
        _table = load(SHIPPED) if SHIPPED.is_file() else {"device": None, "launches": {}}
    return _table


def lookup(rows: int, n: int, k: int) -> dict | None:
    """The measured launch's fields for an [rows, k] x [n, k]^T product, or None where the table lacks the shape."""
    return current()["launches"].get(key(rows, n, k))

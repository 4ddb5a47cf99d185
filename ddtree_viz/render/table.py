"""The papers' table (DDTree's shape): rows benchmark x method (greedy, the DFlash chain, DDTree at its best
budget), columns speed-up and tau, the settings in a caption line. LaTeX (booktabs: \\toprule / \\midrule /
\\bottomrule; a `table` float to \\input, or a standalone document that compiles alone) and CSV. Benchmark names
and settings are user input: every cell goes through tikz.latex_text (each TeX special escaped)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from .tikz import DDTUNI, latex_text

CSV_FIELDS = ("benchmark", "method", "speedup", "tau", "measured")


def table_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "speedup": _num(r["speedup"], 3), "tau": _num(r["tau"], 3),
                         "measured": "yes" if r["measured"] else "predicted"})
    return buf.getvalue()


def _num(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table_latex(rows: Sequence[dict[str, Any]], caption: str, *, label: str = "tab:ddtree-speedup",
                standalone: bool = False) -> str:
    """A booktabs table: one block of rows per benchmark (its name in the first row only), a rule between blocks;
    a predicted (not measured) figure is marked with a dagger, explained under the table."""
    lines = [r"\begin{tabular}{llrr}", r"\toprule", r"Benchmark & Method & Speed-up & $\tau$ \\", r"\midrule"]
    last = None
    for r in rows:
        if last is not None and r["benchmark"] != last:
            lines.append(r"\midrule")
        name = latex_text(r["benchmark"]) if r["benchmark"] != last else ""
        mark = "" if r["measured"] else r"$^\dagger$"
        lines.append(f"{name} & {latex_text(r['method'])} & {_num(r['speedup'])}$\\times${mark} & "
                     f"{_num(r['tau'])}{mark} \\\\")
        last = r["benchmark"]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if any(not r["measured"] for r in rows):
        lines.append(r"\\[2pt]{\footnotesize $^\dagger$ predicted from measured costs and exact counterfactuals, "
                     r"not run.}")
    body = [DDTUNI, r"\begin{table}[t]", r"\centering", *lines, rf"\caption{{{latex_text(caption)}}}",
            rf"\label{{{label}}}", r"\end{table}"]
    if not standalone:
        return "% needs \\usepackage{booktabs}\n" + "\n".join(body) + "\n"
    return "\n".join([r"\documentclass{article}", r"\usepackage{booktabs}", r"\begin{document}", *body,
                      r"\end{document}"]) + "\n"

"""A notebook's own functions, run in this process: for a test of one of them, or a benchmark that must train with
exactly what the notebook trains with (benchmarks/gpt_oss_speed.py). Only the standard library: it also runs on the
GPU machine."""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def notebook_cells(notebook: str | Path, *wanted: str) -> dict:
    """The namespace of a notebook's imports cell (the code cell after `parameters`) and of its cells that define
    `wanted` (functions, with the constants beside them), executed in that order."""
    cells = ["".join(c["source"]) for c in json.loads((REPO / notebook).read_text())["cells"] if c["cell_type"] == "code"]
    namespace = {}
    for cell in [cells[1], *(c for c in cells if any(f"def {name}(" in c for name in wanted))]:
        exec(compile(cell, str(notebook), "exec"), namespace)
    return namespace

"""nbval (lax) opens the getting-started notebook and runs it cell by cell, as a user would.

nbval runs cells with store_history=False, so this also checks that read_parameters() finds the parameters
cell without IPython's input history."""
import os
import shutil
import subprocess
import sys

from harness import REPO


def test_getting_started_runs_cell_by_cell_under_nbval(tmp_path):
    notebook = shutil.copy(REPO / "notebooks" / "00_getting_started.ipynb", tmp_path)  # its outputs land here
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(notebook)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COOKBOOK_ROOT": str(tmp_path)},  # its default output_dir, runs/..., starts there
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout

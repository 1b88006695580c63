"""`run_command`: run a command line (torchrun, `axolotl train`, ...) from a notebook cell, its output in the cell.

    result = run_command(["torchrun", "--nproc-per-node=2", "train.py"])   # raises if it fails
    result.stdout                                                           # everything it printed

A child process writing to its own stdout would reach the kernel's terminal, not the cell: here its output
(stdout and stderr together) is printed into the cell line by line as it comes. When the command ends, fails, or
the cell is interrupted, whatever it left running is ended too, in any process group or session (a training
process that crashes leaves its DataLoader workers behind, in the session torchrun gave it): every process the
command starts inherits the tag NBHELPERS_LAUNCH_ID, by which they are found.
"""
from __future__ import annotations

import os
import subprocess
import threading
import uuid

from nbhelpers.launch.processes import stop_launch_processes

STOP_GRACE_S = 60.0  # after an interrupt: how long SIGTERM may take (torchrun stops its workers on it)


def run_command(command: list[str], *, env: dict | None = None, cwd=None, check: bool = True,
                shown_as: str | None = None) -> subprocess.CompletedProcess:
    """Run `command`, printing its output as it comes; return it as a CompletedProcess (`stdout`: all it printed).

    env: its environment (default: this process's). check: raise RuntimeError, with the exit code, if it fails.
    shown_as: the command line to print first (default: the command itself).
    """
    launch_id = f"command-{uuid.uuid4().hex}"
    environment = {**(os.environ if env is None else env), "NBHELPERS_LAUNCH_ID": launch_id, "PYTHONUNBUFFERED": "1"}
    print("$", shown_as or " ".join(map(str, command)), flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=environment, cwd=cwd, start_new_session=True)
    lines = []

    def echo():
        for line in process.stdout:
            lines.append(line)
            print(line, end="", flush=True)

    echoing = threading.Thread(target=echo, name="nbhelpers-command-output", daemon=True)
    echoing.start()
    try:
        returncode = process.wait()
    except BaseException:  # an interrupt: SIGTERM first (torchrun stops its workers on it), then the rest
        process.terminate()
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
        raise
    finally:
        stop_launch_processes(launch_id, grace=2.0)  # whatever it left running
        echoing.join(timeout=60)
    if check and returncode != 0:
        raise RuntimeError(f"{shown_as or command[0]} failed with exit code {returncode} (its output is above)")
    return subprocess.CompletedProcess(command, returncode, stdout="".join(lines))

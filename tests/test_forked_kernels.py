"""The tests' kernels forked from a zygote (forked_kernels.py) start as Jupyter starts a kernel, or are started by it."""
import asyncio
import json
import os

import forked_kernels
from jupyter_client.manager import AsyncKernelManager

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
# What a notebook's code could tell about the process it runs in.
PROCESS = """
import json, os, re, signal, sys, threading
print(json.dumps({"session_leader": os.getsid(0) == os.getpid(), "argv0": os.path.basename(sys.argv[0]),
                  "path": sys.path, "cwd": os.getcwd(), "env": dict(os.environ), "stdin": sys.stdin.read(),
                  "sigint": repr(signal.getsignal(signal.SIGINT)), "executable": sys.executable, "flags": repr(sys.flags),
                  # an unnamed thread's number counts the Thread objects made before it, in the zygote too
                  "threads": sorted(re.sub(r"Thread-\\d+", "Thread-N", t.name) for t in threading.enumerate())}))
"""


def run_in_kernel(manager_class, code: str, env: dict) -> tuple[dict, object]:
    """Start a kernel with `manager_class` in the notebooks' folder with environment `env`, run `code`, return (its
    JSON output, the process its provisioner manages)."""
    async def run():
        manager = manager_class(kernel_name="python3")
        await manager.start_kernel(cwd=NOTEBOOKS, env=env)
        client = manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=60)
            out = []
            await client.execute_interactive(code, timeout=60, output_hook=lambda msg: out.append(msg))
            process = manager.provisioner.process
        finally:
            client.stop_channels()
            await manager.shutdown_kernel()
        text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
        return json.loads(text), process

    return asyncio.run(run())


def test_a_forked_kernel_runs_in_a_process_like_the_one_jupyter_starts():
    zygote = forked_kernels.start("python3")  # (its environment: this process's when it started, tests before changed)
    fresh, fresh_process = run_in_kernel(AsyncKernelManager, PROCESS, zygote.env)
    forked, forked_process = run_in_kernel(forked_kernels.ForkedKernelManager, PROCESS, zygote.env)
    assert type(forked_process).__name__ == "_ForkedProcess" and type(fresh_process).__name__ == "Popen"
    ignored = {"JPY_SESSION_NAME", "PYTEST_CURRENT_TEST"}  # the connection differs; the test's name is pytest's
    # the forked kernel's libraries are imported: what they set in the environment (Lightning, PEFT, MLflow) is set
    expected_env = {**fresh.pop("env"), **zygote.set_by_imports}
    forked_env = forked.pop("env")
    assert {k: (forked_env.get(k), expected_env.get(k)) for k in set(forked_env) | set(expected_env)
            if forked_env.get(k) != expected_env.get(k) and k not in ignored} == {}
    assert forked == fresh
    assert fresh["session_leader"] and fresh["cwd"] == NOTEBOOKS and forked_env["JPY_PARENT_PID"] == str(os.getpid())


def test_a_kernel_whose_environment_differs_from_the_zygotes_is_started_by_jupyter():
    zygote = forked_kernels.start("python3")
    seen, process = run_in_kernel(forked_kernels.ForkedKernelManager,
                                  "import json, os; print(json.dumps(os.environ.get('COOKBOOK_CPU_FIXES')))",
                                  {**zygote.env, "COOKBOOK_CPU_FIXES": "0"})  # sitecustomize.py reads it at a start
    assert seen == "0" and type(process).__name__ == "Popen"

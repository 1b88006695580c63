"""In every Python process started with this folder first on PYTHONPATH (the tests' harness puts it there for
the notebooks' kernels and the recipes' processes): the CPU fixes of accelerate, DeepSpeed and the TRL notebooks' refusal (cpu_fixes.py:
they act only without a visible GPU, and not where COOKBOOK_CPU_FIXES=0), and the test hooks named in
COOKBOOK_TEST_HOOKS (cookbook_hooks.py).

Python imports one module named sitecustomize, the first on sys.path: this one then runs the one it
shadows, if there is one, so the environment's own start-up code still runs.
"""
import os
import sys

from after_import import when_imported

# cpu_fixes (it imports torch: only once a module it patches is imported); the names are cpu_fixes.FIXES' keys.
# COOKBOOK_CPU_FIXES=0 leaves them out: a notebook run as a user's, with test hooks only (harness.hooks_in_kernel)
if os.environ.get("COOKBOOK_CPU_FIXES") != "0":
    for _module in ("accelerate.state", "nbhelpers.training.needs_gpu", "deepspeed.comm.torch"):
        when_imported(_module, lambda module: __import__("cpu_fixes").apply_without_gpus(module))

if os.environ.get("COOKBOOK_TEST_HOOKS"):
    import cookbook_hooks

    cookbook_hooks.install(os.environ["COOKBOOK_TEST_HOOKS"])

_here = os.path.dirname(os.path.abspath(__file__))
for _folder in sys.path:
    _shadowed = os.path.join(_folder, "sitecustomize.py")
    if _folder and os.path.abspath(_folder) != _here and os.path.isfile(_shadowed):
        with open(_shadowed) as _file:
            exec(compile(_file.read(), _shadowed, "exec"), {"__name__": "sitecustomize", "__file__": _shadowed})
        break

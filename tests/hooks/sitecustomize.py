"""Installs the test hooks named in COOKBOOK_TEST_HOOKS (see cookbook_hooks.py) in every Python process
started with this folder first on PYTHONPATH; does nothing when the variable is unset or empty.

Python imports one module named sitecustomize, the first on sys.path: this one then runs the one it
shadows, if there is one, so the environment's own start-up code still runs.
"""
import os
import sys

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

"""Run a function right after a module is imported, in this process and in every process forked from it.

    when_imported("accelerate.state", fix)   # fix(module) runs once accelerate.state has loaded

How the tests' CPU fixes of TRL, accelerate and DeepSpeed (cpu_fixes.py) and the test hooks (cookbook_hooks.py)
reach every rank: a finder first on `sys.meta_path` wraps the loader of each watched module. A module already
imported gets the function at once. Only processes of the tests have it (tests/hooks/sitecustomize.py).
"""
from __future__ import annotations

import importlib.abc
import sys
import threading


def when_imported(name: str, function) -> None:
    """Call `function(module)` once module `name` has been imported (now, if it already has been)."""
    with _Finder.lock:
        if name not in sys.modules:
            _finder().waiting.setdefault(name, []).append(function)
            return
    function(sys.modules[name])


class _Finder(importlib.abc.MetaPathFinder):
    lock = threading.RLock()

    def __init__(self):
        self.waiting = {}  # module name -> functions to call after it is imported

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self, name)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, finder, name):
        self.loader, self.finder, self.name = loader, finder, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader  # tracebacks and get_source see the real loader
        self.loader.exec_module(module)
        with _Finder.lock:
            functions = self.finder.waiting.pop(self.name, [])
        for function in functions:
            function(module)

    def __getattr__(self, attribute):  # get_source, get_filename, is_package, ...
        return getattr(self.loader, attribute)


def _finder() -> _Finder:
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return finder
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return finder

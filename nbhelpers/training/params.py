"""`read_parameters()`: a notebook's settings as one namespace, checked before anything starts.

    args = read_parameters()        # the first code cell after the imports
    train.distributed(args)         # ranks read args.learning_rate, as a torchrun script reads argparse's

The values are those of the notebook's `parameters` cell, overridden by the cell papermill injects after it
(`papermill ... -p learning_rate 0.01`). A name the parameters cell does not define, or a value whose type
differs from its default's, is an error here, naming the parameter, the expected type and the notebook's
parameters. Type rules: the default's type; an int is accepted for a float (and becomes one); a None
default accepts anything; an annotation (`max_ratings: int | None = 100000  # ...`) states the types
accepted where the default alone cannot.

A relative `output_dir` (the notebooks' defaults, "runs/ddp_mlp") starts at the cookbook's root, not at the folder the
kernel runs in (JupyterLab runs it in the notebook's own folder, papermill in the caller's): so every notebook's
outputs and the one MLflow store, runs/mlflow.db, are in the same place however a notebook is opened. The root is
$COOKBOOK_ROOT if set, else the repository this nbhelpers was installed from (`pip install -e .`), else the current
folder (see `cookbook_root`).

How the cells are found: the code cells this kernel ran, in order, from IPython's input history (`In`), or,
where a runner does not store history (nbval runs cells with store_history=False), from the sources
IPython's compiler keeps for tracebacks. The parameters cell is the latest cell made only of literal
assignments; when that is papermill's injected cell (it starts with "# Parameters"), the cell run just
before it.
"""
from __future__ import annotations

import ast
import difflib
import linecache
import os
import types
from pathlib import Path

INJECTED_HEADER = "# Parameters"
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict, "tuple": tuple,
          "None": type(None)}


class ParameterError(ValueError):
    """A papermill parameter the notebook does not have, or a value of the wrong type."""


def read_parameters() -> types.SimpleNamespace:
    """The notebook's parameters (the `parameters` cell, then papermill's injected values), checked.

    Precondition: runs in the notebook's Jupyter kernel, after the parameters cell. Raises ParameterError
    for an unknown name or a wrong type.
    """
    try:
        shell = get_ipython()  # noqa: F821  (a builtin inside IPython only)
    except NameError:
        raise RuntimeError(
            "read_parameters() reads a notebook's `parameters` cell, so it runs in a Jupyter kernel. In a "
            "script, parse the same names with argparse (`--learning_rate 0.01`), as the recipes do."
        ) from None
    args = parameters_from_cells(_cells_run(shell))
    if isinstance(getattr(args, "output_dir", None), str):
        args.output_dir = str(in_cookbook(args.output_dir))
    return args


ROOT_VARIABLE = "COOKBOOK_ROOT"


def cookbook_root() -> Path:
    """Where relative output paths start: $COOKBOOK_ROOT if set, else the repository this package lies in (a checkout,
    installed with `pip install -e .`: the folder with pyproject.toml and notebooks/), else the current folder."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE]).expanduser().resolve()
    repository = Path(__file__).resolve().parents[2]  # nbhelpers/training/params.py: the checkout above nbhelpers
    if (repository / "pyproject.toml").is_file() and (repository / "notebooks").is_dir():
        return repository
    return Path.cwd()


def in_cookbook(path) -> Path:
    """`path` as an absolute path: a relative one under cookbook_root(), whichever folder this process runs in."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else cookbook_root() / path


def _cells_run(shell) -> list[str]:
    history = list(shell.user_ns.get("In", []))
    if len(history) > 1:
        return history
    compiled = sorted(shell.compile._filename_map.items(), key=lambda item: item[1])  # stable: run order
    return ["".join(linecache.cache[name][2]) for name, _ in compiled if name in linecache.cache]


def parameters_from_cells(cells: list[str]) -> types.SimpleNamespace:
    """The parameters as read_parameters() finds them in `cells` (the sources run, oldest first)."""
    found = [(i, assignments) for i, cell in enumerate(cells) if (assignments := _literal_assignments(cell))]
    if not found:
        raise ParameterError("no parameters cell was run: run the notebook's first code cell (tagged "
                             "`parameters`: literal assignments only) before read_parameters()")
    index, declared = found[-1]
    injected = {}
    if cells[index].lstrip().startswith(INJECTED_HEADER):
        before = [assignments for i, assignments in found if i == index - 1]
        if not before:
            raise ParameterError("papermill injected parameters, but this notebook has no cell tagged "
                                 "`parameters` right before them: tag the cell of default values `parameters`")
        injected, declared = declared, before[0]
    values = {name: value for name, (value, _) in declared.items()}
    problems = []
    for name, (value, _) in injected.items():
        if name not in declared:
            close = difflib.get_close_matches(name, declared, n=1)
            problems.append(f"unknown parameter {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            continue
        default, annotation = declared[name]
        accepted = _accepted_types(annotation) or ((object,) if default is None else (type(default),))
        if type(value) is int and float in accepted and int not in accepted:
            value = float(value)
        if not _fits(value, accepted):
            expected = " or ".join("None" if t is type(None) else t.__name__ for t in accepted)
            problems.append(f"parameter {name!r} must be {expected} (its default is {default!r}), "
                            f"got {value!r} ({type(value).__name__})")
            continue
        values[name] = value
    if problems:
        listing = ", ".join(f"{name}={value!r}" for name, (value, _) in declared.items())
        raise ParameterError("; ".join(problems) + f". This notebook's parameters (defaults): {listing}")
    return types.SimpleNamespace(**values)


def _literal_assignments(source: str) -> dict:
    """{name: (value, annotation or None)} if `source` holds only `name = literal` lines, else {}."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, annotation = node.targets[0], None
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, annotation = node.target, node.annotation
        else:
            return {}
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            return {}
        if not isinstance(target, ast.Name):
            return {}
        found[target.id] = (value, annotation)
    return found


def _fits(value, accepted: tuple) -> bool:
    if object in accepted:
        return True
    if isinstance(value, bool):  # a bool is an int to isinstance; not to a reader of `epochs = True`
        return bool in accepted
    return isinstance(value, accepted)


def _accepted_types(annotation) -> tuple | None:
    """`int | None` -> (int, NoneType); no annotation -> None (the default's type decides)."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _accepted_types(annotation.left) + _accepted_types(annotation.right)
    name = ast.unparse(annotation)
    if name not in _TYPES:
        raise ParameterError(f"the parameters cell annotates a parameter as {name!r}; use "
                             f"{', '.join(_TYPES)} (joined with |)")
    return (_TYPES[name],)

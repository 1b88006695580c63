"""Every measured figure that a user reads (README.md, each recipe's README, each notebook's header) comes from a
results file, and says which: a figure next to a link into benchmarks/results/ must be in the files that link
points to (a folder: any file under it).

A piece of text is a paragraph, a list item or a table row; a table's rows also count the links of the paragraph
just above the table (its caption). The figures of a piece: numbers with a thousands separator (15,379), decimals
(42.8 GiB, loss 0.161 -> 0.058), ratios (1.86x, x1.18) and percentages (34 %), outside code spans and link
targets. A figure is found in a results file when a number there rounds to it at the figure's own precision
(15,379 is any of 15378.5 to 15379.5; 0.87 any of 0.865 to 0.875), directly or in the figure's unit (a percentage
from a fraction, GiB from bytes or MiB, GB from bytes, 112.0 k from 111,980); a ratio also as the quotient of two throughputs or two memory
figures of the JSON files linked (tokens_per_s of two runs, images_per_s_1gpu and images_per_s_2gpu). An executed
notebook counts with its outputs, the parameters papermill injected and the files its run left beside it under its
name (NAME.json, NAME_metrics.json, NAME.log), never with its own text (a copy's header may quote an older run). Dates and versions are no figures (2026-12-04, torch 2.11); settings written without a decimal point or a
thousands separator are none either (2 GPUs, rows of 8192 tokens).

Pure file reading: no notebook runs.
"""
from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
RESULT_SUFFIXES = {".json", ".txt", ".md", ".log", ".ipynb", ".tsv", ".csv", ".yml"}

# Where a user reads figures: the README, each recipe's README, each notebook's first (markdown) cell.
DOCUMENTS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("recipes/*/README.md")),
             *sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("notebooks/**/*.ipynb")
                     if ".ipynb_checkpoints" not in p.parts)]

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`(benchmarks/results/[^`\s]*)`")
CODE_SPAN = re.compile(r"`[^`]*`")
VERSION = re.compile(r"(?i)\b(?:python|torch|torchvision|transformers|triton|trl|peft|accelerate|deepspeed|lightning|"
                     r"unsloth|datasets|ray|mlflow|cuda|driver|flash-linear-attention|fla|causal-conv1d|tilelang)"
                     r"\s+\d+(?:\.\d+)+")
FIGURE = re.compile(
    r"(?<![\w.,/-])(?:"
    r"(?P<ratio_after>\d+\.\d+)[x×](?!\w)"  # 1.86x
    r"|[x×](?P<ratio_before>\d+\.\d+)(?![\w.])"  # x1.18
    r"|(?P<percent>\d+(?:\.\d+)?)\s?%"  # 34 %, 27.1 %
    r"|(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)(?!\.?\d)(?:\s?(?P<unit>GiB|GB|MiB|MB|k)(?!\w))?"
    r")")
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
THROUGHPUT_OR_MEMORY = re.compile(r"per_s|tok_s|throughput|peak|memory|_gib|_bytes")


# ------------------------------------------------------------------------------------------------------------------
# The documents: pieces of text, their figures and their links into benchmarks/results/
# ------------------------------------------------------------------------------------------------------------------
def document_text(path: str) -> str:
    if path.endswith(".ipynb"):
        cells = json.loads((REPO / path).read_text())["cells"]
        return "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "markdown" else ""
    return re.sub(r"^```.*?^```", "", (REPO / path).read_text(), flags=re.MULTILINE | re.DOTALL)


def pieces(text: str) -> list[tuple[str, str]]:
    """(piece, caption) for each paragraph, list item and table row; a table row's caption is the paragraph above
    its table, everything else has none."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.strip("\n").splitlines()
        if lines and all(line.lstrip().startswith("|") for line in lines):
            caption = found[-1][0] if found and not found[-1][0].lstrip().startswith("|") else ""
            found += [(line, caption) for line in lines if not re.fullmatch(r"[\s|:-]*", line)]
            continue
        item = []
        for line in lines:
            if re.match(r"\s*(?:[-*]|\d+\.|#+)\s", line) and item:  # a list item or a heading starts a piece
                found.append(("\n".join(item), ""))
                item = []
            item.append(line)
        if item:
            found.append(("\n".join(item), ""))
    return found


def result_links(piece: str, document: str) -> list[Path]:
    """The paths into benchmarks/results/ that a piece links (markdown links relative to the document, code spans
    relative to the repository), each resolved and existing; a link that points nowhere fails the test."""
    base = (REPO / document).parent
    targets = [(base / target.split("#")[0]) for _, target in LINK.findall(piece) if not re.match(r"\w+://", target)]
    targets += [REPO / path for path in CODE_PATH.findall(piece)]
    linked = []
    for target in targets:
        resolved = Path(*target.parts[:1], *_normalise(target.parts[1:]))
        if RESULTS not in resolved.parents:  # benchmarks/results/ itself names no run
            continue
        matches = sorted(resolved.parent.glob(resolved.name)) if any(c in resolved.name for c in "*?[") else [resolved]
        assert matches and all(m.exists() for m in matches), f"{document}: the link {target} points to nothing"
        linked += matches
    return linked


def _normalise(parts) -> list[str]:
    out = []
    for part in parts:
        if part == "..":
            out.pop()
        elif part != ".":
            out.append(part)
    return out


def figures(piece: str) -> list[dict]:
    """Each figure of a piece: as written, its value, its decimals and its kind (ratio, percent, GiB, ... or a
    plain number)."""
    text = VERSION.sub(" ", LINK.sub(lambda m: m.group(1), CODE_SPAN.sub(" ", piece)))
    found = []
    for m in FIGURE.finditer(text):
        written = next(g for g in (m["ratio_after"], m["ratio_before"], m["percent"], m["number"]) if g)
        kind = ("ratio" if m["ratio_after"] or m["ratio_before"] else "percent" if m["percent"]
                else m["unit"] or "number")
        decimals = len(written.split(".")[1]) if "." in written else 0
        found.append({"written": m.group(0).strip(), "value": float(written.replace(",", "")), "decimals": decimals,
                      "kind": kind})
    return found


def quoted(document: str) -> list[tuple[str, list[Path], list[dict]]]:
    """(piece, linked results, figures) for every piece of the document that links into benchmarks/results/."""
    out = []
    for piece, caption in pieces(document_text(document)):
        linked = result_links(piece, document) + result_links(caption, document)
        if linked:
            out.append((piece, linked, figures(piece)))
    return out


# ------------------------------------------------------------------------------------------------------------------
# The results: every number a file holds, and the throughputs and memory figures of its JSON
# ------------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def file_numbers(path: Path) -> tuple[frozenset, tuple]:
    """(every number in the file, the JSON values whose key names a throughput or a memory figure, by key)."""
    text = path.read_text(errors="replace")
    comparable = []
    if path.suffix == ".ipynb":  # outputs and injected parameters, never the copy's own text
        parts = []
        for cell in json.loads(text)["cells"]:
            if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
                parts.append("".join(cell["source"]))
            for output in cell.get("outputs", []):
                parts.append("".join(output.get("text", "")))
                parts += ["".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/")]
        text = "\n".join(parts)
    elif path.suffix == ".json":
        with_keys = []
        _walk(json.loads(text), "", with_keys)
        comparable = [(key, value) for key, value in with_keys if THROUGHPUT_OR_MEMORY.search(key)]
    numbers = frozenset(float(n.replace(",", "")) for n in NUMBER.findall(text))
    return numbers, tuple(comparable)


def _walk(node, key, out):
    if isinstance(node, dict):
        for k, v in node.items():
            _walk(v, f"{key}.{k}", out)
    elif isinstance(node, list):  # runs, or one value per rank; a longer list of numbers is a curve
        for v in node:
            if isinstance(v, (dict, list)) or len(node) <= 8:
                _walk(v, key, out)
    elif isinstance(node, (int, float)) and not isinstance(node, bool) and node > 0:
        out.append((key, float(node)))


def files_under(paths: list[Path]) -> list[Path]:
    """The results files of the linked paths: a folder's files, a file, and with an executed notebook the files its
    run left beside it under its name (NAME.json, NAME_metrics.json, NAME.log)."""
    files = []
    for path in paths:
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        if path.suffix == ".ipynb":
            candidates += [path.with_name(path.stem + tail) for tail in (".json", "_metrics.json", ".log")]
        files += [f for f in candidates if f.is_file() and f.suffix in RESULT_SUFFIXES]
    return files


def rounds_to(x: float, figure: dict) -> bool:
    half = 0.5 * 10 ** -figure["decimals"]
    return abs(x - figure["value"]) <= half * (1 + 1e-9) + 1e-12


def candidates(x: float, kind: str) -> list[float]:
    """x as a results file may hold it, in the figure's unit."""
    return {"percent": [x, 100 * x], "k": [x, x / 1000], "GiB": [x, x / 2**30, x / 2**10], "MiB": [x, x / 2**20],
            "GB": [x, x / 1e9, x / 2**30], "MB": [x, x / 1e6, x / 2**20]}.get(kind, [x])


def found_in(figure: dict, files: list[Path]) -> bool:
    for path in files:
        numbers, _ = file_numbers(path)
        if any(rounds_to(c, figure) for x in numbers for c in candidates(x, figure["kind"])):
            return True
    if figure["kind"] == "ratio":  # the quotient of two throughputs, or of two memory figures
        values = [(key, v) for path in files for key, v in file_numbers(path)[1]]
        for key_a, a in values:
            for key_b, b in values:
                same = ("per_s" in key_a or "tok_s" in key_a) == ("per_s" in key_b or "tok_s" in key_b)
                if a is not b and same and rounds_to(a / b, figure):
                    return True
    return False


# ------------------------------------------------------------------------------------------------------------------
# The tests
# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("document", DOCUMENTS)
def test_each_figure_next_to_a_results_link_is_in_the_results_it_links(document):
    missing = []
    for piece, linked, quoted_figures in quoted(document):
        files = files_under(linked)
        missing += [f"{f['written']!r} (not in {', '.join(p.relative_to(REPO).as_posix() for p in linked)}): "
                    f"{' '.join(piece.split())[:160]}" for f in quoted_figures if not found_in(f, files)]
    assert not missing, f"{document}: figures that their linked results do not hold:\n" + "\n".join(missing)


MEASURED_COLUMN = re.compile(r"^\|.*\|\s*measured on H200s")


def test_each_measured_figure_of_the_readme_tables_links_its_results():
    """The README's tables of notebooks and recipes: a row that quotes a figure links the results it comes from."""
    unlinked = []
    table = False
    for line in document_text("README.md").splitlines():
        if MEASURED_COLUMN.match(line):
            table = True
            continue
        if not line.startswith("|"):
            table = False
        if table and not re.fullmatch(r"[\s|:-]*", line):
            measured = line.rstrip().rstrip("|").rsplit("|", 1)[1]
            if figures(measured) and not result_links(measured, "README.md"):
                unlinked.append(line)
    assert not unlinked, "README rows that quote figures without a link to their results:\n" + "\n".join(unlinked)


def test_each_notebook_header_links_the_results_of_its_figures():
    unlinked = [path for path in DOCUMENTS if path.endswith(".ipynb")
                if any(figures(piece) and "Measured" in piece and not result_links(piece + caption, path)
                       for piece, caption in pieces(document_text(path)))]
    assert not unlinked, f"notebook headers that quote a measured result without a link to its results: {unlinked}"


def test_a_wrong_figure_is_caught():
    """The rule is strict enough to tell a figure from its neighbours: 15,379 is in the 20B notebook's run, 15,397
    and 15,381 are not; its 1.86x (compiled over eager) is, 1.88x is not."""
    run = [RESULTS / "h200x1_2026-12-04" / "gpt_oss_call2_notebooks" / name
           for name in ("nb_20b_compiled.ipynb", "nb_20b_compiled_metrics.json", "nb_20b_eager_metrics.json")]
    assert found_in(figures("15,379 tokens/s")[0], run)
    assert not found_in(figures("15,397 tokens/s")[0], run) and not found_in(figures("15,381 tokens/s")[0], run)
    assert found_in(figures("1.86x")[0], run) and not found_in(figures("1.88x")[0], run)

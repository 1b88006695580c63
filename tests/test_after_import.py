"""tests/hooks/after_import.py's when_imported: a function runs once its module has been imported."""
import sys

from after_import import when_imported


def test_function_runs_right_after_the_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "watched_by_after_import.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("watched_by_after_import", lambda module: seen.append(module.VALUE))
    assert seen == []
    import watched_by_after_import  # noqa: F401

    assert seen == [1]
    assert watched_by_after_import.__loader__.get_source("watched_by_after_import") == "VALUE = 1\n"
    sys.modules.pop("watched_by_after_import")


def test_function_runs_at_once_for_a_module_already_imported():
    seen = []
    when_imported("json", lambda module: seen.append(module.__name__))
    assert seen == ["json"]

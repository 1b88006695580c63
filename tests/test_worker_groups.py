"""`make test` shares the tests between two pytest-xdist workers by group (tests/conftest.py `group_of`). A file
whose tests reuse a notebook's smoke runs must be in that notebook's group, or both workers run them: it happened
silently once (pytest-xdist issue 1386 turned every test into its own group)."""
from conftest import GROUP_OF_FILE, group_of
from notebook_cases import CASES
from test_notebooks import _case_id


def test_each_file_that_reuses_a_notebooks_runs_is_grouped_with_that_notebooks_cases():
    case_groups = {group_of(f"tests/test_notebooks.py::test_notebook_meets_its_expectations[{_case_id(c)}]")
                   for c in CASES}
    for file, group in GROUP_OF_FILE.items():
        if group == "ray":  # the Ray tests share a cluster, not a notebook's runs
            continue
        assert group_of(f"tests/{file}::test_any") == group
        assert group in case_groups, f"{file} is in group {group!r}, which holds no notebook case: a renamed notebook?"


def test_the_ray_test_files_share_one_group():
    assert group_of("tests/test_ray.py::test_a") == group_of("tests/test_ray_recipes.py::test_b[x]") == "ray"


def test_a_file_without_a_shared_run_is_its_own_group():
    assert group_of("tests/test_plan.py::test_a[1]") == "test_plan.py"

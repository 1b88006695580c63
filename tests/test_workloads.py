"""Each recipe's workload.yaml, the file `air run -f workload.yaml` (Databricks' AI Runtime CLI, `databricks-air`)
submits to Databricks' AI Runtime (issues 42 §3, 57 §3). Databricks' own CLI validates each file (`air run --dry-run`,
from .venv-air: `make setup-air`) up to where it needs credentials, which these machines do not have; its schema is
its own, not one written here. What the CLI cannot know is checked here: the dependencies are the lock's versions, the
uploaded snapshot holds what the command needs, the folders the command enters exist, the launcher's options parse with
torchrun's own parser, and the recipe's parser accepts its flags with the `parameters` the platform hands over
(HYPERPARAMETERS_PATH), so the file cannot rot as the recipes change. Each command is also run, as written, on CPU with
the platform's variables for one node and a tiny stand-in: the recipe tests launch each recipe's first run that way
(tests/workload_runs.py; the last test here checks that they do).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.parent.name for p in (REPO / "recipes").glob("*/train.py"))
AIR = REPO / ".venv-air" / "bin" / "air"  # make setup-air (make test does it)
# What the platform sets on every node (one node of 8 here), and the code source where it is unpacked
PLATFORM = {"NUM_NODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "LOCAL_WORLD_SIZE": "8", "MLFLOW_RUN_ID": "0123456789abcdef", "CODE_SOURCE_PATH": str(REPO)}


def workload(recipe: str) -> dict:
    return yaml.safe_load((REPO / "recipes" / recipe / "workload.yaml").read_text())


def constraints() -> dict:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO / "constraints.txt").read_text(), flags=re.MULTILINE)
    return {_normal(name): version for name, version in pins}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_recipe_folder_has_a_workload_file():
    assert RECIPES and all((REPO / "recipes" / r / "workload.yaml").is_file() for r in RECIPES), RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_databricks_cli_validates_the_workload_file_and_stops_only_at_authentication(recipe, tmp_path):
    assert AIR.is_file(), f"{AIR} is missing: `make setup-air` installs Databricks' CLI (make test does)"
    home = tmp_path / "home"  # no ~/.databrickscfg, and no DATABRICKS_* variables: no credentials
    home.mkdir()
    ran = subprocess.run([AIR, "--json", "run", "--dry-run", "-f", "workload.yaml"], cwd=REPO / "recipes" / recipe,
                         env={"PATH": os.environ["PATH"], "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    [answer] = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    # A file the CLI rejects answers INVALID_REQUEST (exit 2) before it looks for credentials
    assert answer["error"]["code"] == "AUTH", answer
    assert "cannot configure default credentials" in answer["error"]["message"], answer


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_workload_file_pins_the_locked_versions_and_uploads_what_its_command_needs(recipe):
    spec = workload(recipe)
    pinned = constraints()
    for dependency in spec["environment"]["dependencies"]:  # each pinned, to the version the tests passed with
        name, _, version = re.sub(r"\[.*\]", "", dependency).partition("==")
        assert pinned.get(_normal(name)) == version, f"{dependency}: constraints.txt has {pinned.get(_normal(name))}"
    snapshot = spec["code_source"]["snapshot"]
    root = (REPO / "recipes" / recipe / snapshot["root_path"]).resolve()
    assert root == REPO, root  # `pip install --no-deps -e .` from the package's tree
    uploaded = snapshot["include_paths"]
    assert all((root / path).exists() for path in uploaded), uploaded
    needs = {"pyproject.toml", "README.md", "nbhelpers", f"recipes/{recipe}"}  # README.md: the package's description
    if "recipe_common" in (REPO / "recipes" / recipe / "train.py").read_text():
        needs.add("recipes/recipe_common.py")
    assert needs <= set(uploaded), sorted(needs - set(uploaded))
    config = yaml.safe_load((REPO / "recipes" / recipe / "config.yaml").read_text()) or {}
    dataset = spec["parameters"].get("dataset_name", config.get("dataset_name", ""))
    if dataset.startswith("../"):  # a dataset of this repository's data/, as config.yaml names it
        assert str((REPO / "recipes" / recipe / dataset).resolve().relative_to(REPO)) in uploaded, dataset
    assert not {"runs", "data"} & set(uploaded), "the runs and every dataset stay home: only what the recipe reads goes"
    assert spec["parameters"]["output_dir"].startswith("/Volumes/"), "outputs go to a Unity Catalog Volume"


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_gated_model_has_its_token_as_a_secret(recipe):
    spec = workload(recipe)
    model = spec["parameters"].get("model_name_or_path", "")
    assert not model.startswith("meta-llama/") or "HF_TOKEN" in spec.get("secrets", {}), model


def launch_line(command: str) -> tuple[Path, list[str]]:
    """(the folder the command launches from, the launch line's words) with the platform's variables: the
    command's `cd`s are followed; its pip install is checked (an editable install of the code source), not run."""
    here = Path(os.environ.get("PWD", "/"))
    for line in command.replace("\\\n", " ").splitlines():
        words = shlex.split(os.path.expandvars(line))
        if not words or words[:2] == ["set", "-e"]:  # set -e: a failed step stops the job
            continue
        if words[0] == "cd":
            here = (here / words[1]).resolve()
            assert here.is_dir(), here
        elif words[0] == "pip":
            assert words == ["pip", "install", "--no-deps", "-e", "."] and (here / "pyproject.toml").is_file(), words
        else:
            return here, words
    raise AssertionError(f"no launch line in {command!r}")


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_workload_command_runs_the_recipe_with_flags_its_parser_accepts(recipe, monkeypatch, tmp_path):
    spec = workload(recipe)
    subprocess.run(["bash", "-n", "-c", spec["command"]], check=True)  # the shell reads it
    parameters = tmp_path / "hyperparameters.yaml"
    parameters.write_text(yaml.safe_dump(spec["parameters"]))
    for name, value in {**PLATFORM, "HYPERPARAMETERS_PATH": str(parameters), "PWD": "/"}.items():
        monkeypatch.setenv(name, value)
    here, words = launch_line(spec["command"])
    if words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        launcher = get_args_parser().parse_args(words[1:])  # torchrun's own parser: its options and the script
        assert (launcher.nnodes, launcher.node_rank, launcher.nproc_per_node) == ("1", 0, "8"), launcher
        script, argv = here / launcher.training_script, launcher.training_script_args
    else:
        assert words[0] == "python", words
        script, argv = here / words[1], words[2:]
    assert script == REPO / "recipes" / recipe / "train.py", script
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from recipe_common import config_with_overrides, parse_settings
    from test_recipes import load_recipe_module

    if "--overrides" in argv:  # TRL's parser (deepspeed recipe): the parameters change config.yaml's keys
        settings = yaml.safe_load(config_with_overrides(script.parent / "config.yaml", argv[argv.index("--overrides") + 1])
                                  .read_text())
        assert argv == ["--overrides", str(parameters)] and "--overrides" in script.read_text()
    else:  # Hugging Face's parser over the recipe's Settings dataclass
        settings = vars(parse_settings(load_recipe_module(recipe, "train").Settings, script.parent, recipe, argv))
    assert spec["parameters"].items() <= settings.items(), settings
    if "--num_workers" in argv:  # a Ray Train worker per GPU of the node
        assert settings["num_workers"] == 8


def test_a_recipe_logs_into_the_platforms_mlflow_run_when_it_is_set(monkeypatch, tmp_path):
    import mlflow

    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from recipe_common import mlflow_run

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(store)
    experiment = client.create_experiment("platform", artifact_location=(tmp_path / "artifacts").as_uri())
    platform_run = client.create_run(experiment).info.run_id
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_RUN_ID", platform_run)
    with mlflow_run("some_recipe", tmp_path / "runs" / "x", None, {"learning_rate": 1e-5}) as tracking:
        tracking.log_metric("train_loss", 1.5)
        # out of the environment meanwhile: transformers' MLflowCallback would start that run again ("already active")
        assert "MLFLOW_RUN_ID" not in os.environ and tracking.active_run().info.run_id == platform_run
    assert os.environ["MLFLOW_RUN_ID"] == platform_run
    assert client.get_run(platform_run).data.params == {"learning_rate": "1e-05"}
    assert [m.value for m in client.get_metric_history(platform_run, "train_loss")] == [1.5]
    assert [r.info.run_id for r in client.search_runs([experiment])] == [platform_run]  # no run of its own
    assert client.get_experiment_by_name("some_recipe") is None


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_recipe_test_runs_the_workload_command(recipe):
    """The run itself costs no CI time of its own: a recipe test's first run is the workload's (workload_runs.py)."""
    imports_run_workload = re.compile(r"^from workload_runs import .*\brun_workload\b", re.MULTILINE)
    launchers = [p.name for p in (REPO / "tests").glob("test_*.py")
                 if imports_run_workload.search(p.read_text()) and f'"{recipe}"' in p.read_text()]
    assert launchers, f"no test runs {recipe}'s workload command with tests/workload_runs.py's run_workload"

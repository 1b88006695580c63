"""The recipes' settings (recipes/recipe_common.py: parse_settings, Hugging Face's HfArgumentParser over a recipe's
Settings dataclass): config.yaml's values, then a --config file's (any subset of the keys), then the flags; a key that
is no setting is refused in one line. The DeepSpeed recipe reads its settings with TRL's parser (TrlParser) instead:
tests/test_workloads.py and its recipe test cover it."""
import argparse
import dataclasses
import sys
import typing
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "recipes"))
from recipe_common import parse_settings  # noqa: E402

RECIPES = sorted(p.parent.name for p in (REPO / "recipes").glob("*/train.py") if "class Settings:" in p.read_text())


@dataclasses.dataclass
class Settings:
    model_name_or_path: str
    max_steps: int
    learning_rate: float
    bf16: bool
    torch_compile: bool | None
    fail_once_at_step: int | None = dataclasses.field(default=None, metadata={"help": argparse.SUPPRESS})


@pytest.fixture
def recipe_dir(tmp_path):
    folder = tmp_path / "recipe"
    folder.mkdir()
    (folder / "config.yaml").write_text("model_name_or_path: Qwen/Qwen3-8B\nmax_steps: 100\nlearning_rate: 2.0e-5\n"
                                        "bf16: true\ntorch_compile: null\n")
    return folder


def test_config_yaml_then_a_config_file_then_the_flags(recipe_dir, tmp_path):
    assert parse_settings(Settings, recipe_dir, "", []) == Settings("Qwen/Qwen3-8B", 100, 2e-5, True, None)
    mine = tmp_path / "mine.yaml"
    mine.write_text("max_steps: 7\nbf16: false\nfail_once_at_step: 3\n")  # a subset, and a test hook
    flags = ["--config", str(mine), "--max_steps", "9", "--torch_compile", "true", "--learning_rate", "1e-3"]
    assert parse_settings(Settings, recipe_dir, "", flags) == Settings("Qwen/Qwen3-8B", 9, 1e-3, False, True, 3)
    assert parse_settings(Settings, recipe_dir, "", ["--config", str(mine), "--bf16"]).bf16 is True  # alone: true
    assert parse_settings(Settings, recipe_dir, "", ["--torch_compile", "true", "--torch_compile", "null"]).torch_compile \
        is None  # as in YAML


def test_a_key_that_is_no_setting_is_refused_naming_the_nearest(recipe_dir, tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("learnig_rate: 1.0e-4\n")
    with pytest.raises(SystemExit, match=r"typo.yaml: unknown setting\(s\) \['learnig_rate'\] \(did you mean "
                                         r"learning_rate\?\); the settings are \['bf16', 'learning_rate', "):
        parse_settings(Settings, recipe_dir, "", ["--config", str(typo)])
    with pytest.raises(SystemExit) as stopped:
        parse_settings(Settings, recipe_dir, "", ["--learnig_rate", "1e-4"])
    assert stopped.value.code == 2 and "error: unrecognized arguments: --learnig_rate 1e-4" in capsys.readouterr().err


def test_help_shows_every_setting_with_its_default_and_hides_test_hooks(recipe_dir, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_settings(Settings, recipe_dir, "A recipe.", ["--help"])
    shown = capsys.readouterr().out
    assert stopped.value.code == 0 and "A recipe." in shown and str(recipe_dir / "config.yaml") in shown
    assert "--max_steps MAX_STEPS" in shown and "default: 100" in shown and "default: 'Qwen/Qwen3-8B'" in shown
    assert "--config CONFIG" in shown and "fail_once_at_step" not in shown


@pytest.mark.parametrize("recipe", RECIPES)
def test_config_yaml_gives_every_setting_a_value_of_its_declared_type(recipe):
    from test_recipes import load_recipe_module

    settings = load_recipe_module(recipe, "train").Settings
    values = yaml.safe_load((REPO / "recipes" / recipe / "config.yaml").read_text())
    hooks = [f.name for f in dataclasses.fields(settings) if f.metadata.get("help") == argparse.SUPPRESS]
    assert list(values) == [f.name for f in dataclasses.fields(settings) if f.name not in hooks]  # in --help's order
    for key, declared in typing.get_type_hints(settings).items():
        kinds = typing.get_args(declared) or (declared,)  # X | None: (X, NoneType)
        value = values.get(key)
        assert (type(value) in kinds or (type(value) is int and float in kinds)) or key in hooks, (key, declared, value)


@pytest.mark.parametrize("gpu_memory_gib, expected", [(79.6, 2), (140.4, None)])
def test_ray_qwen2_5_3b_checkpoints_as_few_layers_as_the_planner_says_fit(monkeypatch, capsys, gpu_memory_gib, expected):
    """config.yaml's gradient_checkpointing null at the README's shape (2 workers, 4 x 1024 tokens): on 80 GB GPUs the
    activations of a step do not fit beside DDP's buckets, every 2nd layer checkpointed does; on 141 GB ones they fit
    whole; rank 0 alone says why."""
    import ray_qwen2_5_3b.train as recipe
    from nbhelpers.planner import fits

    monkeypatch.setattr(fits, "visible_gpus", lambda: [("NVIDIA GPU", gpu_memory_gib)] * 2)
    config = {**yaml.safe_load((REPO / "recipes/ray_qwen2_5_3b/config.yaml").read_text()),
              "model_name_or_path": "qwen2.5-3b"}  # the planner's own copy of Qwen/Qwen2.5-3B's config (no hub here)
    assert [recipe.checkpointed_every_n_layers(config, rank, 2) for rank in (0, 1)] == [expected, expected]
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("planner: qwen2.5-3b (full) with DDP on 2 x") and "fits" in said[0], said
    assert ("gradient checkpointing of every 2nd decoder layer" in said[0]) == (expected == 2), said
    assert recipe.checkpointed_every_n_layers({**config, "gradient_checkpointing": True}, 0, 2) == 1  # as set

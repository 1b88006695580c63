"""recipes/recipe_common.py log_causal_lm: a saved model folder goes to MLflow as a text-generation model that loads
back, on every Transformers here (from 5.23 MLflow 3.18 cannot read the pipeline class of the task registry by
itself), and Transformers' task registry is left as it was."""
import sys

import mlflow
import standins
from transformers.pipelines import SUPPORTED_TASKS

from harness import REPO
from mlflow_runs import assert_logged_text_generator

sys.path.insert(0, str(REPO / "recipes"))
from recipe_common import log_causal_lm  # noqa: E402


def test_a_saved_model_folder_is_logged_as_a_text_generator_that_loads_back(tmp_path, monkeypatch):
    folder = standins.make("llama-3.2-1b", size="tiny", out=tmp_path / "final_model", mxfp4=False, weights=True)
    registry = dict(SUPPORTED_TASKS["text-generation"])
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts (./mlruns) stay in this test's folder
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("recipe")
    with mlflow.start_run() as run:
        log_causal_lm(mlflow, folder)
    assert SUPPORTED_TASKS["text-generation"] == registry  # what Transformers holds there, as it was
    assert_logged_text_generator(tmp_path, run)

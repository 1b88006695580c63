"""Every notebook's smoke run, declared as data: notebook -> parameters -> expectations.

The runner (`harness.py`) executes each notebook with papermill and these parameters, then checks
`output_dir/metrics.json` against `expect`. Placeholders in string parameters are filled in:
  {output_dir}      a fresh folder for this run (every notebook has an `output_dir` parameter)
  {repo}            the repository root; {data} is {repo}/data
  {standin:NAME}    a tiny offline stand-in model folder (nbhelpers.standins), built once per session;
                    NAME+mxfp4: GPT-OSS experts stored in MXFP4, as in the hub checkpoints
  {dataset:NAME}    the folder data/make_NAME.py's make(out) writes (defaults), made once per session
A dict parameter is a settings file: the harness writes it as YAML and passes its path (e.g. `config`).
Expectations: metric -> (op, bound), where bound is a number/bool/str/None, or (other_metric, factor)
meaning factor * metrics[other_metric]. Dotted metric names reach into nested dicts; `mlflow.` names into the
newest finished run of the project's MLflow store.
Test hooks (tests/hooks/cookbook_hooks.py): `hooks=("name=value", ...)` installs them in the kernel, the
fork server and every rank; what they record is readable as `hooks.<name>.count`, `hooks.<name>.ranks`
(the ranks that recorded something) and `hooks.<name>.records` in expectations, or with
harness.hook_records(workdir, name) after a run that failed on purpose.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NotebookCase:
    notebook: str  # path relative to the repository root
    parameters: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    timeout: int = 300  # seconds, for each cell and for the whole run
    gpu_only: str | None = None  # why it cannot run on CPU; it is then skipped there with this reason
    output_contains: tuple = ()  # text the executed notebook's outputs must show (e.g. rank prefixes)
    kernel: str = "python3"  # the Jupyter kernel, i.e. the environment it runs in (Axolotl has its own)
    hooks: tuple = ()  # test hooks to install, e.g. ("kill_rank_after_optimizer_step=3",)
    files: tuple = ()  # files the run must leave in output_dir
    cpu_fixes: bool = True  # False: without tests/hooks' CPU fixes (hooks/cpu_fixes.py), as a user's run (with
    # `hooks`, the test hooks alone)


# The DDP notebook's smoke run: 20 steps, a sealed checkpoint every 10 (resumed by test_trl_ddp_gpt_oss_20b.py).
TRL_DDP_SMOKE = {
    "output_dir": "{output_dir}", "num_gpus": None, "model_name_or_path": "{standin:gpt-oss-20b+mxfp4}",
    "dataset_name": "{data}/multilingual_thinking", "max_length": 256, "per_device_train_batch_size": 4,
    "max_steps": 20, "learning_rate": 0.02,
    "config": {"gradient_accumulation_steps": 1, "logging_steps": 5, "save_steps": 10},
}
# The FSDP notebook's smoke run: 20 steps, a sealed checkpoint every 10 (resumed by test_trl_fsdp_gpt_oss_120b.py).
TRL_FSDP_SMOKE = {
    "output_dir": "{output_dir}", "num_gpus": None, "model_name_or_path": "{standin:gpt-oss-120b+mxfp4}",
    "dataset_name": "{data}/multilingual_thinking", "max_length": 256, "per_device_train_batch_size": 4,
    "max_steps": 20, "learning_rate": 0.01,
    "config": {"gradient_accumulation_steps": 1, "logging_steps": 5, "save_steps": 10},
}

# The ZeRO-3 notebook's smoke run: 20 steps, an evaluation and a sealed checkpoint every 10 (resumed by its test file).
TRL_LLAMA_SMOKE = {
    "output_dir": "{output_dir}", "num_gpus": None, "model_name_or_path": "{standin:llama-3.2-1b}",
    "dataset_name": "{data}/capybara", "max_length": 128, "per_device_train_batch_size": 8, "max_steps": 20,
    "learning_rate": 0.003,
    "config": {"gradient_accumulation_steps": 1, "eval_steps": 10, "save_steps": 10, "logging_steps": 2},
}

# The newest run in the case's MLflow store logged a model with a signature, and the model loads (issue 18).
LOADABLE_MLFLOW_MODEL = {"mlflow.models.model.has_signature": ("==", True), "mlflow.models.model.loads": ("==", True)}
UNSLOTH_SMOKE = {"output_dir": "{output_dir}", "model_name_or_path": "{standin:llama-3.2-3b}",
                 "dataset_name": "{data}/finetome", "max_length": 512, "max_steps": 20, "learning_rate": 0.01,
                 "config": {"gradient_accumulation_steps": 1, "save_steps": 10, "warmup_steps": 2}}

# The two guides on the tiny Llama stand-in, 2 CPU processes (num_gpus None); their one-rank cases reuse them.
FAST_STEPS_SMOKE = {"output_dir": "{output_dir}", "num_gpus": None, "model_name_or_path": "{standin:llama-3.2-1b}",
                    "max_length": 64, "per_device_train_batch_size": 2, "timing_warmup_steps": 1, "timed_steps": 2,
                    "dataloader_num_workers": 1}
SURVIVING_FAILURES_SMOKE = {
    "output_dir": "{output_dir}", "num_gpus": None, "model_name_or_path": "{standin:llama-3.2-1b}", "max_length": 64,
    "per_device_train_batch_size": 2, "learning_rate": 0.001, "max_steps": 10, "save_steps": 4,
}

AXOLOTL_SMOKE = {"output_dir": "{output_dir}", "num_gpus": 1, "base_model": "{standin:olmo-3-7b}",
                 "datasets": [{"path": "{data}/alpaca_messages/train.jsonl", "type": "chat_template"}],
                 "sequence_len": 256, "max_steps": 16, "save_steps": 8, "learning_rate": 0.01,
                 "config": {"gradient_accumulation_steps": 1, "val_set_size": 0.02}}

CASES = [
    NotebookCase(
        "notebooks/00_getting_started.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None},
        expect={"world_size": ("==", 2), "ranks_returned": ("==", [0, 1]), "error_named_rank": ("==", 1),
                "straggler_rank": ("==", 1)},  # the straggler demo: the last rank's data is late
        timeout=120,
        output_contains=("[rank 0] hello from rank 0 of 2", "[rank 1] hello from rank 1 of 2",
                         "@distributed: last_rank_waits_for_data(): rank 1 was ", "of its extra time waiting for data"),
    ),
    NotebookCase(  # one rank (one GPU, or one CPU process): the failing-rank demo fails on rank 0 and says so
        "notebooks/00_getting_started.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": 1},
        expect={"world_size": ("==", 1), "ranks_returned": ("==", [0]), "error_named_rank": ("==", 0),
                "straggler_rank": ("==", None)},
        timeout=120,
        output_contains=("[rank 0] hello from rank 0 of 1", "one rank: the failing rank is rank 0 itself",
                         "one rank: nobody to hold back"),
    ),
    NotebookCase(  # without GPUs every run is one CPU process: all three train at once
        "notebooks/01_sweeps_and_remote.ipynb",
        parameters={"output_dir": "{output_dir}", "learning_rates": [0.0003, 0.003, 0.3], "num_gpus": 1,
                    "num_samples": 4096, "num_features": 16, "hidden_size": 64, "num_train_epochs": 8,
                    "per_device_train_batch_size": 128},
        expect={
            "learning_rates": ("==", [0.0003, 0.003, 0.3]),
            "best_learning_rate": ("==", 0.003),  # the smallest learns slowly, the largest overshoots
            "runs_overlapped": ("==", True),
            "mlflow.runs": ("==", 3),  # one MLflow run per learning rate, each with the launcher's system metrics:
            "mlflow.metrics.system/rank_0_cpu_utilization_percentage": (">=", 0),
            "mlflow.metrics.system/rank_0_memory_usage_megabytes": (">", 0),
        },
        timeout=240,
        output_contains=("[train#1 rank 0] learning rate 0.0003, epoch 0", "[train#3 rank 0]"),
    ),
    NotebookCase(  # one GPU (simulated: the ranks run on the CPU) for three runs of one GPU each: they queue
        "notebooks/01_sweeps_and_remote.ipynb",
        parameters={"output_dir": "{output_dir}", "learning_rates": [0.0003, 0.003, 0.3], "num_gpus": 1,
                    "num_samples": 4096, "num_features": 16, "hidden_size": 64, "num_train_epochs": 8,
                    "per_device_train_batch_size": 128},
        hooks=("simulate_gpus=1",),
        expect={
            "gpus": ("==", ["0", "0", "0"]),
            "runs_overlapped": ("==", False),
            "best_learning_rate": ("==", 0.003),
            "mlflow.runs": ("==", 3),
        },
        timeout=240,
        output_contains=("waiting for 1 GPU(s); leased by other launches: GPU 0: train#",),
    ),
    NotebookCase(
        "notebooks/pytorch/ddp_mlp.ipynb",
        parameters={"output_dir": "{output_dir}", "num_train_epochs": 10, "num_samples": 8192,
                    "learning_rate": 0.003, "num_gpus": None},
        expect={
            "world_size": ("==", 2),
            "final_loss": ("<", 0.1),
            "final_loss_vs_initial": ("<", 0.3),
            # StepTimes timed every step of both ranks (16 a rank an epoch, the first has no start): even, nobody named
            "step_times.steps": ("==", [159, 159]),
            "step_times.straggler_rank": ("==", None),
        },
        timeout=180,
        output_contains=("[rank 0]", "parameters identical on all 2 ranks: True"),
    ),
    NotebookCase(  # one rank (as many steps as 2 ranks on twice the data): no claim about ranks agreeing (null)
        "notebooks/pytorch/ddp_mlp.ipynb",
        parameters={"output_dir": "{output_dir}", "num_train_epochs": 10, "num_samples": 4096,
                    "learning_rate": 0.003, "num_gpus": 1},
        expect={
            "world_size": ("==", 1),
            "final_loss": ("<", 0.1),
            "final_loss_vs_initial": ("<", 0.3),
            "step_times.steps": ("==", [159]),
            "mlflow.params.learning_rate": ("==", "0.003"),  # the project's store holds the run and its model
            "mlflow.metrics.train_loss": ("<", 0.1),
            **LOADABLE_MLFLOW_MODEL,
            "mlflow.models.model.predicts": ("==", True),
        },
        timeout=180,
        output_contains=("[rank 0]", "one rank: nothing to compare"),
    ),
    NotebookCase(
        # One rank writes every checkpoint and computes every metric itself, and says there is nothing to compare.
        # The 2-rank run, resume after a kill and bad input: tests/test_lightning_notebook.py.
        "notebooks/lightning/ddp_two_tower.ipynb",
        parameters={"output_dir": "{output_dir}", "dataset_name": "{data}/ratings/item_ratings.csv", "num_gpus": 1,
                    "num_train_epochs": 3, "per_device_train_batch_size": 256, "dataloader_num_workers": 0},
        expect={
            "world_size": ("==", 1),
            "final_loss": ("<", ("initial_loss", 0.8)),
            "hooks.record_lightning_trainer.cluster_environment": ("==", ["TorchElasticEnvironment"]),
            "step_times.steps": ("==", [3 * 21 - 1]),  # lightning_callback() timed each batch (21 an epoch) but the first
        },
        hooks=("record_lightning_trainer",),
        timeout=180,
        output_contains=("one rank: it wrote every checkpoint and computed every metric itself; nothing to compare",),
    ),
    NotebookCase(
        # 30 steps of 2 images per rank, from scratch, on the coloured-shapes COCO set at 96 px: the loss falls
        # (tests/test_retinanet_notebook.py compares the means of its first and last tenth); evaluation scores both
        # ranks' detections together (a meaningful mAP needs the longer GPU run); DDP kept the weights identical.
        "notebooks/pytorch/ddp_retinanet.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "dataset_name": "{dataset:detection}",
                    "image_size": 96, "per_device_train_batch_size": 2, "num_train_epochs": 1, "max_train_samples": 120,
                    "learning_rate": 0.02, "dataloader_num_workers": 0, "max_eval_samples": 16},
        # (images/s against the seconds it counts: tests/test_retinanet_notebook.py)
        expect={"world_size": ("==", 2), "val_map": (">=", 0)},
        timeout=240,
        output_contains=("[rank 0]", "weights identical on all 2 ranks: True", "validation mAP", "on 16 images"),
    ),
    NotebookCase(
        # 2 CPU processes, a small model: every parameter sharded 1/2; the loss falls; a checkpoint every 4 steps (the
        # newest 2 kept); the final checkpoint, loaded unsharded in the notebook's process, predicts what the sharded
        # model did. Also the uninterrupted run of tests/test_fsdp2_transformer.py's crashes.
        "notebooks/pytorch/fsdp2_transformer.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": None, "num_hidden_layers": 2, "hidden_size": 64,
                    "max_length": 32, "num_samples": 2048, "per_device_train_batch_size": 16, "max_steps": 12,
                    "learning_rate": 0.01, "save_steps": 4},
        expect={"world_size": ("==", 2), "final_loss_vs_initial": ("<", 0.6)},
        timeout=240,
        output_contains=("[rank 0]", "each rank holds 1/2 of every one: True", "unsharded model from step_12"),
    ),
    NotebookCase(
        # The fast-steps guide on 2 CPU processes (gloo) with the tiny Llama stand-in: every knob row is measured in one
        # launch and the baseline's step is profiled on each rank (tests/test_fast_steps.py reads its metrics.json).
        "notebooks/02_fast_steps.ipynb",
        parameters=FAST_STEPS_SMOKE,
        # (its tokens/s against the seconds it counts: tests/test_fast_steps.py)
        expect={"world_size": ("==", 2)},
        files=("profile/rank0.pt.trace.json", "profile/rank1.pt.trace.json", "knobs.png"),
        timeout=300,
        output_contains=("[rank 0]",),
    ),
    NotebookCase(
        # One rank: every knob row still measured and the step profiled, FSDP2 over a world of one.
        "notebooks/02_fast_steps.ipynb",
        parameters={**FAST_STEPS_SMOKE, "num_gpus": 1},
        expect={"world_size": ("==", 1)},
        files=("profile/rank0.pt.trace.json", "knobs.png"),
        timeout=300,
        output_contains=("tokens/s on 1 rank(s)",),
    ),
    NotebookCase(
        # The failures guide on 2 CPU processes (gloo) with the tiny Llama stand-in: its failure demo's last rank fails
        # at step 6; the same launch again resumes from step 4's checkpoint to the uninterrupted run's losses
        # (tests/test_surviving_failures.py: that, the hung collective, the timeout and torchrun's restart).
        "notebooks/03_surviving_failures.ipynb",
        parameters=SURVIVING_FAILURES_SMOKE,
        expect={"world_size": ("==", 2), "final_loss": ("<", ("initial_loss", 0.9))},
        timeout=300,
        output_contains=("[rank 0]", "resuming from"),
    ),
    NotebookCase(
        # One rank: the demo fails rank 0, the rerun resumes from step 4 to the same losses, torchrun restarts it.
        "notebooks/03_surviving_failures.ipynb",
        parameters={**SURVIVING_FAILURES_SMOKE, "num_gpus": 1},
        expect={"world_size": ("==", 1), "final_loss": ("<", ("initial_loss", 0.9))},
        timeout=300,
        output_contains=("the failure demo: rank 0 fails at step 6", "resuming from", "(step 4)",
                         "attempt 1: rank 0 done"),
    ),
    NotebookCase(
        # One rank holds every parameter whole: the notebook says nothing is sharded. Its MLflow store holds the run's
        # params and metrics and the unsharded model, which loads and predicts.
        "notebooks/pytorch/fsdp2_transformer.ipynb",
        parameters={"output_dir": "{output_dir}", "num_gpus": 1, "num_hidden_layers": 2, "hidden_size": 64,
                    "max_length": 32, "num_samples": 1024, "per_device_train_batch_size": 16, "max_steps": 6,
                    "learning_rate": 0.001, "save_steps": 3},
        expect={
            "world_size": ("==", 1),
            "final_loss_vs_initial": ("<", 0.92),  # it reaches 0.87; at learning rate 0 0.95 (the batches differ)
            "mlflow.params.learning_rate": ("==", "0.001"),
            "mlflow.metrics.samples_per_s": (">", 0),
            **LOADABLE_MLFLOW_MODEL,
            "mlflow.models.model.predicts": ("==", True),
        },
        files=("checkpoints/step_3", "checkpoints/step_6", "loss.png"),
        timeout=180,
        output_contains=("one rank: it holds all 30 parameters whole; nothing is sharded",),
    ),
    NotebookCase(
        # what fits where, and the pick per setup: tests/test_choose_your_technique.py reads plan.csv
        "notebooks/choose_your_technique.ipynb",
        parameters={"output_dir": "{output_dir}"},
        expect={
            "plans": ("==", 10 * 3 * 2 * 2),
            "mlflow.params.lora_r": ("==", "16"),  # the project's store holds the run
            "mlflow.metrics.plans": ("==", 10 * 3 * 2 * 2),
        },
        files=("plan.csv", "plan.png"),
        timeout=240,
    ),
    # TRL notebooks: tiny random-weight stand-ins of the real architectures, a slice of the data, few steps.
    # LoRA on a frozen random base barely moves the loss (the random LM head caps the logits), so the
    # LoRA cases also check the token accuracy, which the adapters lift from ~0 within a few steps.
    # The GPT-OSS stand-ins keep their experts in MXFP4 like the hub's, so the notebooks dequantise on load.
    NotebookCase(  # also the uninterrupted run that the killed + resumed run must reproduce
        "notebooks/trl/ddp_gpt_oss_20b.ipynb",
        parameters=TRL_DDP_SMOKE,
        hooks=("record_trainer",),
        expect={
            "world_size": ("==", 2),
            "hooks.record_trainer.ranks": ("==", [0, 1]),
            "step_times.steps": ("==", [19, 19]),  # the notebook's StepTimer (a Trainer callback) timed every step
            "final_loss_vs_initial": ("<", 0.99),  # it reaches 0.976 on packed rows; at learning rate 0 1.000
            "mlflow.metrics.mean_token_accuracy": (">", 0.1),  # the Trainer's last logged one
        },
        files=("adapter/adapter_model.safetensors", "merged/config.json", "loss.png"),
        timeout=240,
        output_contains=("[rank 0]", "[rank 1]", "LoRA weights identical on all 2 ranks: True",
                         "merged model in", "planner: no GPU is visible"),
    ),
    NotebookCase(  # one rank: nothing to all-reduce or compare; the loss still falls
        "notebooks/trl/ddp_gpt_oss_20b.ipynb",
        parameters={**TRL_DDP_SMOKE, "num_gpus": 1, "max_steps": 4, "merge_adapter": False,
                    "config": {"gradient_accumulation_steps": 1, "logging_steps": 2, "save_steps": 100}},
        # it reaches 0.989 on packed rows; at learning rate 0 1.000
        expect={"world_size": ("==", 1), "final_loss_vs_initial": ("<", 0.993)},
        timeout=180,
        output_contains=("[rank 0]", "one rank: no other rank to all-reduce gradients with"),
    ),
    NotebookCase(  # also the uninterrupted run that the killed + resumed run must reproduce
        "notebooks/trl/fsdp_gpt_oss_120b.ipynb",
        parameters=TRL_FSDP_SMOKE,
        hooks=("record_trainer",),
        expect={
            "world_size": ("==", 2),
            "hooks.record_trainer.ranks": ("==", [0, 1]),
            "final_loss_vs_initial": ("<", 0.98),  # it reaches 0.961 on packed rows; at learning rate 0 1.000
            "mlflow.metrics.mean_token_accuracy": (">", 0.05),
        },
        files=("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "merged/config.json", "loss.png"),
        timeout=240,
        output_contains=("decoder layers sharded: True", "share of the parameters per rank: ",
                         "merged model in"),
    ),
    NotebookCase(  # one rank, its FSDP settings from an accelerate config file: FSDP shards nothing
        "notebooks/trl/fsdp_gpt_oss_120b.ipynb",
        parameters={**TRL_FSDP_SMOKE, "num_gpus": 1, "max_steps": 4, "merge_adapter": False,
                    "fsdp_config": "{repo}/tests/data/accelerate_fsdp2.yaml",
                    "config": {"gradient_accumulation_steps": 1, "logging_steps": 2, "save_steps": 100}},
        hooks=("record_trainer",),
        # it reaches 0.964 on packed rows; at learning rate 0 1.000
        expect={"world_size": ("==", 1), "held_fraction": ("==", [1.0]), "final_loss_vs_initial": ("<", 0.98)},
        timeout=180,
        output_contains=("one rank: FSDP shards nothing",),
    ),
    NotebookCase(  # also the uninterrupted run that the killed + resumed run must reproduce
        "notebooks/trl/deepspeed_llama_3_2_1b.ipynb",
        parameters=TRL_LLAMA_SMOKE,
        hooks=("record_trainer",),
        expect={"world_size": ("==", 2), "hooks.record_trainer.ranks": ("==", [0, 1]),
                "final_loss_vs_initial": ("<", 0.8)},
        files=("final/model.safetensors", "ds_config.json", "loss.png"),
        timeout=240,
        output_contains=("ZeRO stage 3 on 2 rank(s); share of the parameters per rank: ",),
    ),
    NotebookCase(  # one rank, driven by a DeepSpeed JSON file (zero_stage 0 would mean DDP): ZeRO-3 partitions nothing
        "notebooks/trl/deepspeed_llama_3_2_1b.ipynb",
        parameters={**TRL_LLAMA_SMOKE, "num_gpus": 1, "zero_stage": 0, "max_steps": 4,
                    "deepspeed": "{repo}/tests/data/deepspeed_zero3.json",
                    "config": {"gradient_accumulation_steps": 1, "eval_steps": 2, "save_steps": 100, "logging_steps": 2}},
        hooks=("record_trainer",),
        # it reaches 0.945; at learning rate 0 1.001
        expect={"world_size": ("==", 1), "held_fraction": ("==", [1.0]), "final_loss_vs_initial": ("<", 0.97)},
        timeout=180,
        output_contains=("one rank: ZeRO-3 partitions nothing",),
    ),
    # Unsloth: the tiny Llama stand-in, 20 steps with a checkpoint every 10. The 2-rank run is also the reference
    # that tests/test_unsloth_notebook.py's killed-and-resumed run must reproduce (the notebook_run fixture shares it).
    # Without the tests' CPU fixes: what the notebook needs on CPUs it passes itself, so these runs are a user's
    # (tests/test_unsloth_notebook.py checks that the 2 ranks train as one job, and resume). On Unsloth's own kernel,
    # `cookbook-unsloth` (.venv-unsloth: its caps hold only this notebook).
    NotebookCase(
        "notebooks/unsloth/ddp_llama_3_2_3b.ipynb",
        parameters={**UNSLOTH_SMOKE, "num_gpus": None},
        cpu_fixes=False,
        expect={
            "world_size": ("==", 2),
            "final_loss_vs_initial": ("<", 0.97),  # it reaches 0.94; at learning rate 0 0.99
            "mlflow.params.learning_rate": ("==", "0.01"),  # the Trainer's settings, logged by rank 0
            "mlflow.metrics.loss": ("==", ("final_loss", 1)),  # the last loss the Trainer logged
            "mlflow.models.model.loads": ("==", True),  # the adapter, as an MLflow transformers model
            "mlflow.models.model.has_signature": ("==", True),
        },
        files=("adapter/adapter_model.safetensors", "merged/config.json", "loss.png"),
        timeout=300,
        kernel="cookbook-unsloth",
        output_contains=("[rank 0]", "[rank 1]", "LoRA weights identical on all 2 ranks: True", "merged model in"),
    ),
    NotebookCase(  # one rank (one GPU, or one CPU process): nothing to compare
        "notebooks/unsloth/ddp_llama_3_2_3b.ipynb",
        parameters={**UNSLOTH_SMOKE, "num_gpus": 1, "max_steps": 8,
                    "config": {"gradient_accumulation_steps": 1, "save_steps": 100, "warmup_steps": 2}},
        cpu_fixes=False,
        # it reaches 0.965; at learning rate 0 1.002 (its single steps' losses 0.98 to 1.0 of the first)
        expect={"world_size": ("==", 1), "final_loss_vs_initial": ("<", 0.975)},
        files=("adapter/adapter_model.safetensors",),
        timeout=300,
        kernel="cookbook-unsloth",
        output_contains=("[rank 0]", "one rank: no other rank to all-reduce with or compare to"),
    ),
    # Axolotl: without GPUs it trains in one process (it places each process's model on GPU LOCAL_RANK), so its CPU
    # case is the one-process run; DDP over GPUs is the GPU run's to show (benchmarks/gpu/axolotl.sh). 16 steps with
    # a checkpoint every 8; the run is also the reference that tests/test_axolotl_notebook.py's killed-and-resumed,
    # YAML-driven run must reproduce. The merge is in fp32 here: merged and base + adapter agree to rounding.
    NotebookCase(
        "notebooks/axolotl/ddp_olmo3_7b.ipynb",
        parameters=AXOLOTL_SMOKE,
        expect={
            "world_size": ("==", 1),
            "final_loss_vs_initial": ("<", 0.95),  # it reaches 0.93; at learning rate 0 1.0 (tokens/s: its test file)
            "mlflow.params.learning_rate": ("==", "0.01"),  # the Trainer's settings, logged by Axolotl's rank 0
            "mlflow.metrics.loss": ("==", ("final_loss", 1)),
            "mlflow.models.model.loads": ("==", True),  # the adapter, as an MLflow transformers model
            "mlflow.models.model.has_signature": ("==", True),
        },
        files=("lora-out/adapter_model.safetensors", "merged/config.json", "config.yml", "loss.png"),
        timeout=600,
        kernel="cookbook-axolotl",
        output_contains=("axolotl.cli.preprocess", "Training completed",
                         "1 process(es): nothing to all-reduce"),
    ),
]

"""The command-line recipes, launched as their users launch them: two torchrun agents (two "nodes", one
process each) meeting through a c10d rendezvous on 127.0.0.1, on CPU with tiny stand-ins; and as Databricks' AI
Runtime launches them, their workload.yaml's command on one node of 2 processes (tests/workload_runs.py): each
recipe's first run is that one, and a rerun on two nodes resumes from its checkpoints."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

from mlflow_runs import assert_logged_text_generator, tracked_runs
from workload_runs import kill_process_tree, run_workload, workload

from nbhelpers.launch.processes import free_port
from nbhelpers.training import checkpoints

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
DATA = REPO / "data"


def start_node(node_rank: int, port: int, job: str, script: Path, args: list, log: Path) -> subprocess.Popen:
    """One torchrun agent = one node with one process, as `torchrun --nnodes=2 ...` runs on each machine."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id={job}", "--rdzv-conf=join_timeout=120", "--max-restarts=0", str(script), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    return subprocess.Popen(command, cwd=script.parent, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def run_two_nodes(recipe: str, args: list, workdir: Path, timeout: float = 240) -> dict:
    """Run a recipe as 2 nodes x 1 process; return the metrics.json its rank 0 wrote."""
    port, job = free_port(), f"test-{uuid.uuid4().hex[:8]}"
    script = RECIPES / recipe / "train.py"
    logs = [workdir / f"node{n}.log" for n in (0, 1)]
    nodes = [start_node(0, port, job, script, args, logs[0])]
    time.sleep(1.0)  # node 0 first, so it hosts the rendezvous store
    nodes.append(start_node(1, port, job, script, args, logs[1]))
    try:
        for node in nodes:
            node.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for node in nodes:
            kill_process_tree(node)
    failed = [(n, node.returncode) for n, node in enumerate(nodes) if node.returncode != 0]
    assert not failed, f"{recipe} failed on nodes {failed}:\n" + "\n".join(
        f"--- node {n} ---\n{logs[n].read_text()[-4000:]}" for n, _ in failed)
    return json.loads((workdir / "out" / "metrics.json").read_text())


def assert_sharded_over_both_nodes(metrics: dict, nodes: int = 2) -> None:
    """2 ranks, on 2 nodes (one each) or, as a workload's run on one node (nodes=1), both on node 0."""
    assert metrics["world_size"] == 2 and metrics["nodes"] == nodes
    assert sorted(r["node_rank"] for r in metrics["ranks"]) == ([0, 1] if nodes == 2 else [0, 0])
    shards, total = metrics["local_shard_numel"], metrics["parameters"]
    for shard in shards:  # each rank holds about half of the parameters (padding and rounding aside)
        assert 0.4 * total < shard < 0.6 * total, (shards, total)
    assert total * 0.98 <= sum(shards) <= total * 1.05, (shards, total)


def assert_tokens_per_s_counts_the_timed_samples(metrics, timed_samples, max_length):
    """tokens/s is the real tokens of the timed steps over their seconds: times the seconds recorded beside it, it
    gives between 20 tokens (fewer than the Alpaca prompt's fixed words) and max_length per timed sample, of which the
    labelled (response) tokens are a part. On the tiny stand-in 67 and 12 a sample; counting anything but the tokens
    (the micro-batches, say) fails."""
    seconds = metrics["timed_seconds"]
    tokens, labelled = metrics["tokens_per_s"] * seconds, metrics["label_tokens_per_s"] * seconds
    assert 20 * timed_samples < tokens <= max_length * timed_samples, (tokens, timed_samples, metrics)
    assert timed_samples <= labelled < tokens, (labelled, tokens, metrics)


def load_recipe_module(recipe: str, name: str):
    path = RECIPES / recipe / f"{name}.py"
    sys.path.insert(0, str(path.parent))  # train.py imports its neighbours (extraction.py)
    try:
        spec = importlib.util.spec_from_file_location(f"recipe_{recipe}_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import does: a dataclass of the module (Settings) looks itself up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


# --------------------------------------------------------------------------------------------------
# FSDP (FSDP1) Llama-3.1-8B
# --------------------------------------------------------------------------------------------------
def test_fsdp_llama_workload_shards_trains_saves_full_model_and_two_nodes_resume_from_its_checkpoint(tmp_path,
                                                                                                    standin):
    model = standin("llama-3.1-8b")
    settings = {"model_name_or_path": model, "dataset_name": DATA / "alpaca", "output_dir": tmp_path / "out",
                "max_steps": 14, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                "learning_rate": 3e-3, "warmup_steps": 2, "logging_steps": 4, "save_steps": 8}
    # The first run: workload.yaml's command on one node of 2 processes, logging into the platform's MLflow run.
    metrics, platform_run = run_workload("fsdp_llama_3_1_8b_multinode", settings, tmp_path)
    assert_sharded_over_both_nodes(metrics, nodes=1)
    assert metrics["final_loss"] < 0.75 * metrics["initial_loss"], metrics["losses"]
    assert_tokens_per_s_counts_the_timed_samples(metrics, timed_samples=(14 - 2) * 4 * 2 * 2, max_length=1024)
    assert metrics["resumed_from_step"] is None and [Path(c).name for c in metrics["checkpoints"]] == ["step_0000008"]

    # The same settings again on two nodes (as after a failure): they resume at step 8 and redo steps 9..14 on the
    # same data.
    (tmp_path / "out" / "final_model").rename(tmp_path / "first_final_model")
    command = [word for key, value in settings.items() for word in (f"--{key}", value)]
    again = run_two_nodes("fsdp_llama_3_1_8b_multinode", command, tmp_path)
    assert_sharded_over_both_nodes(again)
    assert again["resumed_from_step"] == 8
    assert again["losses"][:8] == metrics["losses"][:8]
    assert again["losses"][8:] == pytest.approx(metrics["losses"][8:], abs=2e-3)
    metrics["saved_model"] = str(tmp_path / "first_final_model")

    # The full state dict gathered on rank 0 is a normal checkpoint with trained weights.
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(metrics["saved_model"])
    original = AutoModelForCausalLM.from_pretrained(model)
    assert sum(p.numel() for p in saved.parameters()) == metrics["parameters"]
    assert not torch.equal(saved.model.layers[0].mlp.up_proj.weight, original.model.layers[0].mlp.up_proj.weight)
    checkpoints.verify(metrics["saved_model"])  # rank 0 sealed what it wrote

    # The workload's run in the platform's MLflow run, the rerun in a run of its own (both in the store beside
    # output_dir).
    params = {"learning_rate": "0.003"}
    runs = [*tracked_runs(tmp_path, workload("fsdp_llama_3_1_8b_multinode")["experiment_name"], params, "loss"),
            *tracked_runs(tmp_path, "fsdp_llama_3_1_8b_multinode", params, "loss")]
    assert runs[0].info.run_id == platform_run.info.run_id
    assert [r.data.metrics["final_loss"] for r in runs] == pytest.approx([metrics["final_loss"], again["final_loss"]])
    assert all(r.data.metrics["system/rank_1_step_time_ms"] > 0 for r in runs)  # StepTimes: rank 1's, gathered at the end
    assert_logged_text_generator(tmp_path, runs[0])


# --------------------------------------------------------------------------------------------------
# FSDP2 Qwen3: packing, distributed checkpoint and resume
# --------------------------------------------------------------------------------------------------
def fsdp2_settings(model, output_dir, steps, **extra) -> dict:
    return {"model_name_or_path": model, "dataset_name": DATA / "capybara", "dataset_train_split": "train",
            "output_dir": output_dir, "max_length": 256, "per_device_train_batch_size": 2, "max_steps": steps,
            "learning_rate": 3e-3, "warmup_steps": 2, "torch_compile": False, "save_final_model": False,
            "logging_steps": 4, "timing_warmup_steps": 2, **extra}


def fsdp2_args(model, output_dir, steps, *extra):
    flags = [word for key, value in fsdp2_settings(model, output_dir, steps).items() for word in (f"--{key}", value)]
    return [str(word).lower() if isinstance(word, bool) else word for word in flags] + list(extra)


def test_fsdp2_qwen3_workload_and_two_nodes_resuming_from_its_distributed_checkpoint(tmp_path, standin):
    model = standin("qwen3-0.6b")
    # The first run: workload.yaml's command on one node of 2 processes, logging into the platform's MLflow run.
    first, platform_run = run_workload("fsdp2_qwen3_multinode",
                                       fsdp2_settings(model, tmp_path / "out", 12, save_steps=6), tmp_path)
    assert_sharded_over_both_nodes(first, nodes=1)
    assert first["final_loss"] < 0.8 * first["initial_loss"], first["losses"]
    assert first["resumed_from_step"] is None and len(first["checkpoints"]) == 1  # step 6 (none at the last step)

    # The same settings again on two nodes: they find the step-6 checkpoint and redo steps 7..12 on the same data.
    second = run_two_nodes("fsdp2_qwen3_multinode", fsdp2_args(model, tmp_path / "out", 12, "--save_steps", 6,
                                                               "--save_final_model", "true"), tmp_path)
    assert_sharded_over_both_nodes(second)
    assert second["resumed_from_step"] == 6
    assert second["losses"][:6] == first["losses"][:6]
    assert second["losses"][6:] == pytest.approx(first["losses"][6:], abs=2e-3)

    # Both runs in the project's MLflow store (beside output_dir): the workload's in the platform's run, the second
    # in one of its own, with its final model.
    params = {"learning_rate": "0.003", "max_steps": "12"}
    runs = [*tracked_runs(tmp_path, workload("fsdp2_qwen3_multinode")["experiment_name"], params, "loss"),
            *tracked_runs(tmp_path, "fsdp2_qwen3_multinode", params, "loss")]
    assert runs[0].info.run_id == platform_run.info.run_id
    assert [r.data.metrics["final_loss"] for r in runs] == pytest.approx([first["final_loss"], second["final_loss"]])
    assert all(r.data.metrics["system/rank_1_step_time_ms"] > 0 for r in runs)  # StepTimes: rank 1's, gathered at the end
    assert_logged_text_generator(tmp_path, runs[1])


# The FSDP2 recipe's own save_checkpoint / resume, on one rank (gloo) and a small FSDP2 model, in processes that
# end as a crash would end them. MODE save-then-disk-full | save-then-killed-resave | resume; prints what it did.
FSDP2_CHECKPOINTS = textwrap.dedent("""
    import errno, importlib.util, os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    script, mode, folders = sys.argv[1], sys.argv[2], [Path(p) for p in sys.argv[3:]]
    dist.init_process_group("gloo", init_method=f"file://{folders[0]}.store", rank=0, world_size=1)
    spec = importlib.util.spec_from_file_location("fsdp2_train", script)
    train = sys.modules["fsdp2_train"] = importlib.util.module_from_spec(spec)  # its Settings dataclass looks there
    spec.loader.exec_module(train)
    checkpoints = train.checkpoints

    def fresh_model():
        torch.manual_seed(0)
        model = fully_shard(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)))
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    def take_step(model, optimizer):
        model(torch.randn(8, 256)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    def fingerprint(model):
        return sum(p.full_tensor().double().sum().item() for p in model.parameters())

    model, optimizer = fresh_model()
    if mode == "resume":
        for folder in folders:
            path, step, losses = train.resume(model, optimizer, folder)
            print(f"resumed {folder.name} step {step} losses {losses} weights {fingerprint(model)!r}", flush=True)
        sys.exit(0)
    take_step(model, optimizer)
    train.save_checkpoint(model, optimizer, 2, [2.0], folders[0], keep=3)
    print(f"saved step 2 weights {fingerprint(model)!r}", flush=True)
    take_step(model, optimizer)
    if mode == "save-then-disk-full":  # the disk fills while the manifest (the marker) is written
        def open_on_a_full_disk(path, *args, **kwargs):
            if Path(path).name.startswith(checkpoints.MANIFEST):
                raise OSError(errno.ENOSPC, "No space left on device")
            return open(path, *args, **kwargs)
        checkpoints.open = open_on_a_full_disk
        try:
            train.save_checkpoint(model, optimizer, 4, [2.0, 1.0], folders[0], keep=3)
        except checkpoints.CheckpointError as error:
            print(f"step 4: {error}", flush=True)
        del checkpoints.open
        # and while the shards are written: torch.distributed.checkpoint gathers the ranks' errors
        def write_data_on_a_full_disk(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")
        train.dcp.FileSystemWriter.write_data = write_data_on_a_full_disk
        try:
            train.save_checkpoint(model, optimizer, 6, [2.0, 1.0, 0.5], folders[0], keep=3)
        except checkpoints.CheckpointError as error:
            print(f"step 6: {error}", flush=True)
    else:  # saves step 2 again (new weights), and is killed while its shards are half written
        real_save = train.dcp.save
        def save_and_be_killed(state, checkpoint_id):
            real_save(state, checkpoint_id=checkpoint_id)
            for shard in Path(checkpoint_id).glob("*.distcp"):
                os.truncate(shard, shard.stat().st_size // 2)
            print("half written", flush=True)
            time.sleep(120)
        train.dcp.save = save_and_be_killed
        train.save_checkpoint(model, optimizer, 2, [9.0], folders[0], keep=3)
""")


def fsdp2_checkpoints(tmp_path, mode, *folders) -> subprocess.Popen:
    script = tmp_path / "fsdp2_checkpoints.py"
    script.write_text(FSDP2_CHECKPOINTS)
    return subprocess.Popen([sys.executable, str(script), str(RECIPES / "fsdp2_qwen3_multinode" / "train.py"), mode,
                             *map(str, folders)], env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)


def test_fsdp2_checkpoints_survive_a_full_disk_at_the_marker_and_a_killed_resave_of_the_same_step(tmp_path):
    """Issue 16 §3: (a) a disk that filled while the marker was written left an empty trainer_state.json and every
    restart failed with JSONDecodeError; (b) a re-save into an existing step_N killed mid-write kept the old marker
    and the next run resumed silently from the half-new shards."""
    disk_full, killed = tmp_path / "disk_full", tmp_path / "killed"
    first = fsdp2_checkpoints(tmp_path, "save-then-disk-full", disk_full)
    second = fsdp2_checkpoints(tmp_path, "save-then-killed-resave", killed)
    output = first.communicate(timeout=180)[0]
    assert first.returncode == 0, output
    for step in (4, 6):  # the disk fills at the marker, then in the shards: one error says what happened and what to do
        assert (f"step {step}: checkpoint step_000000{step} could not be written: the disk of {disk_full} is full "
                f"(errno 28, No space left on device{' on rank 0' if step == 6 else ''}). It is left unfinished as "
                f"step_000000{step}.tmp, which nothing resumes from. What to do: free space on that disk (or use an "
                f"output_dir on a larger one) and run the same command again: it resumes from {disk_full}/step_0000002."
                in output), output
    saved_a = output.split("saved step 2 weights ")[1].split()[0]
    saved_b = second.stdout.readline().split("saved step 2 weights ")[1].strip()
    assert second.stdout.readline().strip() == "half written"
    second.kill()
    second.wait(timeout=30)

    restart = fsdp2_checkpoints(tmp_path, "resume", disk_full, killed)
    output = restart.communicate(timeout=180)[0]
    assert restart.returncode == 0, output
    assert f"resumed disk_full step 2 losses [2.0] weights {saved_a}" in output  # the complete one before
    assert f"resumed killed step 2 losses [2.0] weights {saved_b}" in output  # the old complete step 2, whole


def test_a_fresh_fsdp2_run_into_an_earlier_runs_checkpoints_is_refused_before_anything_loads(tmp_path):
    earlier = tmp_path / "out" / "checkpoints" / "step_0000006"
    earlier.mkdir(parents=True)
    checkpoints.seal(earlier, {"step": 6}, no_dist=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               str(RECIPES / "fsdp2_qwen3_multinode" / "train.py"), "--output_dir", str(tmp_path / "out"),
               "--model_name_or_path", str(tmp_path / "no-model-needed"), "--resume_from_checkpoint", "false"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert (f"FileExistsError: {tmp_path}/out/checkpoints holds the checkpoints of an earlier run (step_0000006, ...): "
            "resume from them (resume_from_checkpoint true), or pass another output_dir, or delete them") in proc.stderr
    assert checkpoints.verify(earlier) == {"step": 6}


@pytest.mark.parametrize("recipe, left", [("fsdp2_qwen3_multinode", "final_model"),
                                          ("fsdp_llama_3_1_8b_multinode", "metrics.json")])
def test_a_run_without_checkpoints_into_an_earlier_runs_output_dir_is_refused_before_anything_loads(
        tmp_path, recipe, left):
    out = tmp_path / "out"
    earlier = out / left / "model.safetensors" if left == "final_model" else out / left
    earlier.parent.mkdir(parents=True)
    earlier.write_text("the earlier run's")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               str(RECIPES / recipe / "train.py"), "--output_dir", str(out), "--save_steps", "0",
               "--model_name_or_path", str(tmp_path / "no-model-needed")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    assert (f"FileExistsError: {out} holds the {left} of an earlier run, and this run would start afresh (no "
            f"checkpoint in {out}/checkpoints to resume from) and replace them: pass another output_dir, or delete them"
            in proc.stderr), proc.stderr[-3000:]
    assert earlier.read_text() == "the earlier run's"


def test_a_rerun_that_resumes_from_its_checkpoints_may_replace_the_earlier_final_model(tmp_path):
    spec = importlib.util.spec_from_file_location("recipe_common", RECIPES / "recipe_common.py")
    recipe_common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe_common)
    (tmp_path / "final_model").mkdir()
    (tmp_path / "metrics.json").write_text("{}")
    checkpoint = tmp_path / "checkpoints" / "step_0000006"
    checkpoint.mkdir(parents=True)
    checkpoints.seal(checkpoint, {"step": 6}, no_dist=True)
    args = argparse.Namespace(output_dir=str(tmp_path), resume_from_checkpoint=True)
    assert recipe_common.checkpoint_dir_to_use(args) == tmp_path / "checkpoints"


# A recipe's end (recipe_common.shutdown) while a gloo thread still frees a tensor: as after FSDP2 training, whose state
# keeps the process groups (so destroy_process_group leaves their threads running). Made certain here: rank 1 drops
# its tensor while an all-reduce holds it, and keeps the GIL (as a busy machine delays the gloo thread) until the
# interpreter finalizes.
FREED_BY_GLOO_AT_EXIT = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    sys.path.insert(0, sys.argv[1])
    from recipe_common import shutdown

    dist.init_process_group("gloo")
    kept = dist.group.WORLD
    if dist.get_rank() == 0:
        time.sleep(1.0)
        dist.all_reduce(torch.ones(1 << 16))
    else:
        sys.setswitchinterval(1000)
        tensor = torch.ones(1 << 16)
        dist.all_reduce(tensor, async_op=True)
        del tensor  # a gloo thread holds the last reference, and needs the GIL to free it once rank 0 joins
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass

    class ReleasesTheGilWhileTheInterpreterFinalizes:
        def __del__(self, sleep=time.sleep):
            sleep(1)

    finalizing = ReleasesTheGilWhileTheInterpreterFinalizes()
    shutdown()
""")


def test_a_rank_ends_with_code_0_while_a_gloo_thread_still_frees_a_tensor(tmp_path):
    script = tmp_path / "freed_by_gloo_at_exit.py"
    script.write_text(FREED_BY_GLOO_AT_EXIT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
               str(RECIPES)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert "terminate called" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_packed_sample_has_the_same_loss_as_alone(standin):
    """Packing keeps attention inside each sample: position ids restart, transformers builds the block mask."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train = load_recipe_module("fsdp2_qwen3_multinode", "train")
    path = standin("qwen3-0.6b")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = [json.loads(line) for line in (DATA / "capybara" / "train.jsonl").read_text().splitlines()[:3]]
    template = train.get_training_chat_template(tokenizer)
    samples = [train.tokenize_chat(tokenizer, template, r["messages"], 256) for r in rows]

    def per_sample_losses(row):
        logits = model(input_ids=torch.tensor([row["input_ids"]]), position_ids=torch.tensor([row["position_ids"]]),
                       use_cache=False).logits  # with a cache, transformers does not look for packed samples
        labels = torch.tensor(row["labels"])
        token_loss = torch.nn.functional.cross_entropy(logits[0], labels, ignore_index=-100, reduction="none")
        starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(labels)]
        return [token_loss[a:b].sum().item() for a, b in zip(starts, starts[1:])]

    with torch.no_grad():
        packed = train.pack(samples, seq_len=sum(len(ids) for ids, _ in samples) + 5, pad_id=0)
        assert len(packed) == 1  # three samples and a padding segment in one row
        alone = [per_sample_losses(train.pack([s], len(s[0]), 0)[0])[0] for s in samples]
        together = per_sample_losses(packed[0])
    assert together[:3] == pytest.approx(alone, rel=1e-4)
    # Without the restarts, the second sample would see the first: its loss changes.
    row = dict(packed[0], position_ids=list(range(len(packed[0]["position_ids"]))))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([row["input_ids"]]), position_ids=torch.tensor([row["position_ids"]]),
                       use_cache=False).logits
    second = slice(len(samples[0][0]), len(samples[0][0]) + len(samples[1][0]))
    leaked = torch.nn.functional.cross_entropy(logits[0, second], torch.tensor(row["labels"][second]),
                                               ignore_index=-100, reduction="sum").item()
    assert abs(leaked - alone[1]) > 1e-3


# --------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3 + TRL: invoices
# --------------------------------------------------------------------------------------------------
def test_deepspeed_invoices_workload_partitions_and_lowers_eval_loss(tmp_path, standin):
    """workload.yaml's command on one node of 2 processes: the workload's parameters (here the settings below, with
    their own DeepSpeed JSON) change config.yaml's keys through --overrides, and TRL's parser reads the merged file as
    its --config (a TRL config file as the whole command line)."""
    recipe = RECIPES / "deepspeed_qwen3_8b_invoices"
    (tmp_path / "zero3.json").write_text((recipe / "ds_zero3.json").read_text())
    settings = {"model_name_or_path": str(standin("qwen3-8b")), "dtype": "float32", "bf16": False,
                "dataset_name": str(DATA / "invoices"), "output_dir": str(tmp_path / "out"),
                "deepspeed": str(tmp_path / "zero3.json"), "num_train_epochs": 2, "max_train_samples": 96,
                "max_predict_samples": 4, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
                "gradient_accumulation_steps": 1, "learning_rate": 3e-3, "logging_steps": 1, "max_new_tokens": 48,
                "ddp_timeout": 120}
    metrics, platform_run = run_workload("deepspeed_qwen3_8b_invoices", settings, tmp_path, timeout=300)
    assert_sharded_over_both_nodes(metrics, nodes=1)  # ZeRO-3 from zero3.json: each rank's ds_tensor partitions
    # hold half
    assert len(metrics["eval_losses"]) == 3  # before training, after epoch 1, after epoch 2
    assert metrics["best_eval_loss"] < 0.85 * metrics["initial_eval_loss"], metrics["eval_losses"]
    assert metrics["final_loss"] < metrics["initial_loss"]
    assert metrics["best_checkpoint"]
    for when in ("before", "after"):
        assert metrics[when]["documents"] == 4
        assert 0 <= metrics[when]["json_valid"] <= 1 and 0 <= metrics[when]["field_exact_match"] <= 1
    assert (Path(metrics["saved_model"]) / "model.safetensors").exists()
    for checkpoint in [*(tmp_path / "out").glob("checkpoint-*"), Path(metrics["saved_model"])]:
        checkpoints.verify(checkpoint)  # sealed after the Trainer saved it

    [run] = tracked_runs(tmp_path, workload("deepspeed_qwen3_8b_invoices")["experiment_name"],
                         {"learning_rate": "0.003", "max_predict_samples": "4"}, "loss")  # the platform's run
    assert run.info.run_id == platform_run.info.run_id
    assert run.data.metrics["after_json_valid"] == metrics["after"]["json_valid"]
    assert run.data.metrics["system/rank_1_step_time_ms"] > 0  # StepTimer: rank 1's step times, gathered at the end
    assert_logged_text_generator(tmp_path, run)


def test_invoice_replies_are_scored_without_qwens_think_block():
    evaluate = load_recipe_module("deepspeed_qwen3_8b_invoices", "extraction")
    reference = '{"vendor": "Acme", "total": "12.50", "currency": "EUR"}'
    thinking = "<think>\n\n</think>\n\n"
    assert evaluate.score_reply(thinking + reference, reference) == \
        {"json_valid": True, "fields": 3, "fields_matched": 3, "exact": True}
    wrong_total = evaluate.score_reply(thinking + '{"vendor": "Acme", "total": "12.5", "currency": "EUR"}', reference)
    assert wrong_total == {"json_valid": True, "fields": 3, "fields_matched": 2, "exact": False}
    assert evaluate.score_reply(thinking + '{"vendor": "Acme", "total": ', reference)["json_valid"] is False


# --------------------------------------------------------------------------------------------------
# A node dies: the survivor fails fast and says why
# --------------------------------------------------------------------------------------------------
def test_a_dead_node_makes_the_other_fail_with_a_clear_error(tmp_path, standin):
    port, job = free_port(), f"test-{uuid.uuid4().hex[:8]}"
    script = RECIPES / "fsdp2_qwen3_multinode" / "train.py"
    args = fsdp2_args(standin("qwen3-0.6b"), tmp_path / "out", 100000, "--logging_steps", 1, "--save_steps", 0,
                      "--ddp_timeout", 20)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    survivor = start_node(0, port, job, script, args, logs[0])
    time.sleep(1.0)
    victim = start_node(1, port, job, script, args, logs[1])
    try:
        deadline = time.monotonic() + 180
        while "step 2 loss" not in logs[0].read_text():
            assert survivor.poll() is None and victim.poll() is None, logs[0].read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start:\n" + logs[0].read_text()[-3000:]
            time.sleep(0.5)
        kill_process_tree(victim)  # the whole node: agent and worker
        killed = time.monotonic()
        returncode = survivor.wait(timeout=90)
        took = time.monotonic() - killed
    finally:
        kill_process_tree(survivor)
        kill_process_tree(victim)
    log = logs[0].read_text()
    assert returncode != 0
    assert took < 60, f"the surviving node took {took:.0f} s to fail"
    assert "LOST PEER: rank 0 (node 0" in log, log[-3000:]

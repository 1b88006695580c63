"""Fine-tune torchvision's ResNet-50 on Imagenette-style image folders with Ray Train (DDP on every worker).

    python recipes/ray_resnet50/train.py --dataset_name ~/data/imagenette2-320 --num_workers 2     # one node
    RAY_ADDRESS=HEAD:6379 python recipes/ray_resnet50/train.py --dataset_name /shared/imagenette2-320 \\
        --num_workers 16 --storage_path /shared/ray_results                                   # a cluster

Defaults are in config.yaml (5 epochs, batch 64 per worker, AdamW 1e-3, ImageNet weights); every key is a
flag (`--learning_rate 3e-4`), `--config my.yaml` changes any of them. Each epoch every worker reports
train/val loss and accuracy and the epoch's seconds through `ray.train.report`, and rank 0 attaches a
checkpoint it sealed (nbhelpers.training.checkpoints: a manifest of checksums, copied with it by Ray Train). A
worker that dies (a lost node, a killed process) makes Ray Train restart the whole worker group, up to
`max_failures` times; the training function then resumes from the newest checkpoint of the run that
verifies (Ray's latest, or the one before it if that one is damaged) and continues from the epoch after
it. The driver writes OUTPUT_DIR/metrics.json (per-epoch history, throughput) and logs the settings, the
per-epoch metrics and the model (mlflow.pytorch, with its signature) to MLflow.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import nbhelpers
from nbhelpers.training import checkpoints

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # recipes/: recipe_common.py, what the recipes share
import recipe_common  # noqa: E402
from recipe_common import mlflow_run, newest_ray_checkpoint, parse_settings  # noqa: E402

import gpu_images  # noqa: E402  the data path: JPEGs decoded and augmented on the worker's device
from gpu_images import make_loaders  # noqa: E402

RECIPE = "ray_resnet50"


@dataclass
class Settings:
    """config.yaml's keys, each also a flag (`--max_steps 10`): their types here, their values and meanings there."""
    dataset_name: str
    download: bool
    output_dir: str
    num_workers: int
    use_gpu: bool | None
    num_train_epochs: int
    per_device_train_batch_size: int
    learning_rate: float
    weight_decay: float
    weights: str
    image_size: int
    data_pipeline: str
    read_threads: int
    prefetch_batches: int
    dataloader_num_workers: int
    torch_compile: bool
    bf16: bool
    max_failures: int
    save_total_limit: int
    seed: int
    storage_path: str | None
    run_name: str
    ray_address: str | None
    mlflow_tracking_uri: str | None
    fail_once_at_epoch: int | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # test hook


def build_model(weights: str | None, num_classes: int) -> torch.nn.Module:
    """ResNet-50 (ImageNet weights unless None) with a new `num_classes` head."""
    model = torchvision.models.resnet50(weights=weights)
    model.fc = torch.nn.Linear(model.fc.in_features, num_classes)
    return model


def die_once(config: dict, epoch: int, rank: int, world_size: int, loader):
    """Test hook (--fail_once_at_epoch): halfway through training that epoch the last rank kills itself, once (a
    marker file remembers), as a worker on a lost node would die: its loader's thread with batches in flight."""
    marker = config["fail_marker"]
    if config.get("fail_once_at_epoch") != epoch or rank != world_size - 1 or os.path.exists(marker):
        return loader
    return _killed_halfway(loader, marker, epoch, rank)


def _killed_halfway(loader, marker: str, epoch: int, rank: int):
    halfway = len(loader) // 2
    for step, batch in enumerate(loader):
        if step == halfway:
            Path(marker).write_text(f"rank {rank} killed itself in epoch {epoch}, step {step}\n")
            print(f"[test hook] rank {rank}: SIGKILL in epoch {epoch} at step {step} of {len(loader)}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch


def run_epoch(model, loader, optimizer, device, bf16: bool) -> tuple[float, float, int, float]:
    """One pass over `loader` (training if `optimizer`); returns global (mean loss, accuracy, images, seconds)."""
    training = optimizer is not None
    model.train(training)
    totals = torch.zeros(3, device=device)  # summed loss, correct, images
    started = time.perf_counter()
    with torch.set_grad_enabled(training):
        for images, labels in loader:  # already on `device` (gpu_images.py)
            if device.type == "cuda":
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(images)
            loss = F.cross_entropy(logits.float(), labels)
            if training:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            totals += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum(),
                                   torch.full((), len(labels), device=device)])  # (no host copy: no sync)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    if dist.is_initialized():
        dist.all_reduce(totals)  # every worker's share of the epoch
    loss_sum, correct, images = totals.tolist()
    return loss_sum / images, correct / images, int(images), seconds


def train_loop_per_worker(config: dict) -> dict:
    """What every Ray Train worker runs: plain PyTorch, with Ray's device/DDP/sampler helpers."""
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    bf16 = config["bf16"] and device.type == "cuda"
    torch.manual_seed(config["seed"])

    # JPEG decoding and augmentation on this worker's device, prefetch_batches ahead of the step (gpu_images.py)
    train_loader, val_loader = make_loaders(
        config["data_pipeline"], config["dataset_name"], batch_size=config["per_device_train_batch_size"],
        image_size=config["image_size"], device=device, rank=rank, world_size=world_size, seed=config["seed"],
        read_threads=config["read_threads"], dataloader_num_workers=config["dataloader_num_workers"],
        prefetch_batches=config["prefetch_batches"])
    model = build_model(config["weights"], num_classes=train_loader.num_classes)
    start_epoch, history = 0, []
    resumed_from, state = newest_ray_checkpoint(config["experiment_dir"])  # after a failure, or a rerun
    if state is not None:
        model.load_state_dict(state["model"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        print(f"rank {rank}: resuming from {resumed_from} (epoch {state['epoch']})", flush=True)

    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # the layout cuDNN's bf16 convolutions want
    if config["torch_compile"]:  # in place (the state dict keeps its names), before DDP wraps it (no graph breaks)
        model.compile()
    model = ray.train.torch.prepare_model(model)  # Ray: onto this worker's device, wrapped in DDP
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"], weight_decay=config["weight_decay"])
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])  # after the move: its state follows the parameters

    for epoch in range(start_epoch, config["num_train_epochs"]):
        train_loader.set_epoch(epoch)  # this epoch's shuffle and crops: the same after a restart
        started = time.perf_counter()
        batches = die_once(config, epoch, rank, world_size, train_loader)
        train_loss, train_acc, train_images, train_s = run_epoch(model, batches, optimizer, device, bf16)
        if epoch == start_epoch:
            checkpoints.check_resumed_loss(train_loss, resumed_from)
        val_loss, val_acc, _, _ = run_epoch(model, val_loader, None, device, bf16)
        metrics = {
            "epoch": epoch, "train_loss": train_loss, "train_accuracy": train_acc, "val_loss": val_loss,
            "val_accuracy": val_acc, "epoch_s": time.perf_counter() - started, "train_s": train_s,
            "images_per_s": train_images / train_s, "world_size": world_size, "started_at_epoch": start_epoch,
        }
        history.append(metrics)
        if rank == 0:
            print(f"epoch {epoch}: train loss {train_loss:.4f} acc {train_acc:.3f} | val loss {val_loss:.4f} "
                  f"acc {val_acc:.3f} | {metrics['epoch_s']:.1f} s, {metrics['images_per_s']:.0f} images/s", flush=True)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:  # DDP keeps the replicas identical: one copy is the checkpoint
                torch.save({"epoch": epoch, "model": model.module.state_dict() if world_size > 1 else model.state_dict(),
                            "optimizer": optimizer.state_dict(), "history": history}, os.path.join(folder, "checkpoint.pt"))
                checkpoint = Checkpoint.from_directory(checkpoints.seal(folder, {"epoch": epoch}, no_dist=True))
            # Every worker reports (it is a barrier); the metrics of rank 0 are kept with the checkpoint.
            ray.train.report({**metrics, "history": history}, checkpoint=checkpoint)
        if rank == 0:  # Ray has copied it: keep the newest save_total_limit, never the newest verified one
            checkpoints.rotate(config["experiment_dir"], config["save_total_limit"], "checkpoint_*")
    return history


def main(argv=None) -> None:
    args = parse_settings(Settings, HERE, __doc__.split("\n")[0], argv)
    args.weights = None if str(args.weights).lower() in ("none", "") else args.weights
    args.dataset_name, args.output_dir = (os.path.abspath(os.path.expanduser(p)) for p in (args.dataset_name, args.output_dir))
    args.storage_path = args.storage_path or os.path.join(args.output_dir, "ray_results")
    args.experiment_dir = os.path.join(args.storage_path, args.run_name)  # where Ray Train copies the checkpoints
    args.fail_marker = os.path.join(args.output_dir, "killed_worker.marker")
    if not os.path.isdir(os.path.join(args.dataset_name, "train")):
        if not args.download:
            raise SystemExit(f"{args.dataset_name} has no train/ folder; pass --dataset_name DIR or --download true")
        torchvision.datasets.Imagenette(os.path.dirname(args.dataset_name), split="train", size="320px", download=True)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints reach us once, not twice
    # Every node gets the code the workers import: recipe_common and gpu_images (not installed) and nbhelpers.
    ray.init(address=args.ray_address, runtime_env={"py_modules": [recipe_common, gpu_images, nbhelpers]})
    use_gpu = args.use_gpu if args.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
    with mlflow_run(RECIPE, args.output_dir, args.mlflow_tracking_uri, vars(args)) as tracking:
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config=vars(args),
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu),
            run_config=RunConfig(name=args.run_name, storage_path=args.storage_path,
                                 failure_config=FailureConfig(max_failures=args.max_failures)),
        )  # no CheckpointConfig(num_to_keep): the workers rotate, never deleting the newest verified checkpoint
        started = time.perf_counter()
        result = trainer.fit()
        report(args, result, use_gpu, time.perf_counter() - started, tracking)


def report(args, result, use_gpu: bool, wall_s: float, tracking) -> None:
    """metrics.json, and the per-epoch metrics and the model of the last verified checkpoint in MLflow."""
    from mlflow.models import infer_signature

    from nbhelpers.training.metrics import write_metrics

    history = result.metrics["history"]  # every epoch, across worker-group restarts (it travels in the checkpoint)
    losses = [m["train_loss"] for m in history]
    path = write_metrics(
        args.output_dir,
        recipe=RECIPE, world_size=history[-1]["world_size"], use_gpu=use_gpu,
        data_pipeline=args.data_pipeline, prefetch_batches=args.prefetch_batches, torch_compile=args.torch_compile,
        per_device_train_batch_size=args.per_device_train_batch_size, image_size=args.image_size, weights=args.weights,
        epochs=history, losses=losses, initial_loss=losses[0], final_loss=losses[-1],
        final_val_accuracy=history[-1]["val_accuracy"],
        images_per_s=history[-1]["images_per_s"],  # the last epoch: warm (the first includes cuDNN tuning)
        worker_group_starts=sorted({m["started_at_epoch"] for m in history}),
        killed_worker=os.path.exists(args.fail_marker),
        checkpoint=result.checkpoint.path if result.checkpoint else None, wall_s=wall_s,
    )
    for m in history:
        tracking.log_metrics({k: m[k] for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy",
                                                 "images_per_s")}, step=m["epoch"])
    folder = checkpoints.newest_verified(Path(args.experiment_dir), "checkpoint_*")
    state = torch.load(folder / "checkpoint.pt", map_location="cpu", weights_only=True)
    model = build_model(None, num_classes=state["model"]["fc.weight"].shape[0])
    model.load_state_dict(state["model"])
    example = torch.randn(2, 3, args.image_size, args.image_size)
    with torch.no_grad():
        signature = infer_signature(example.numpy(), model.eval()(example).numpy())
    # the pip requirements given: MLflow infers them by loading the model again in a process of its own
    requirements = [f"{m.__name__}=={m.__version__.split('+')[0]}" for m in (torch, torchvision)]
    tracking.pytorch.log_model(model, name="model", signature=signature, input_example=example.numpy(),
                               pip_requirements=requirements)
    print(f"final: train loss {losses[-1]:.4f}, val accuracy {history[-1]['val_accuracy']:.3f}, "
          f"{history[-1]['images_per_s']:.0f} images/s on {history[-1]['world_size']} workers -> {path}")


if __name__ == "__main__":
    main()

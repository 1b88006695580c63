"""Fine-tune torchvision's ResNet-50 on Imagenette-style image folders with Ray Train (DDP on every worker).

    python recipes/ray_resnet50/train.py --data ~/data/imagenette2-320 --num-workers 2          # one node
    RAY_ADDRESS=HEAD:6379 python recipes/ray_resnet50/train.py --data /shared/imagenette2-320 \\
        --num-workers 16 --storage-path /shared/ray_results                                   # a cluster

Defaults are in config.yaml (5 epochs, batch 64 per worker, AdamW 1e-3, ImageNet weights); any flag
overrides them. Each epoch every worker reports train/val loss and accuracy and the epoch's seconds
through `ray.train.report`, and rank 0 attaches a checkpoint. A worker that dies (a lost node, a
killed process) makes Ray Train restart the whole worker group, up to `--max-failures` times; the
training function then finds the last checkpoint in `ray.train.get_checkpoint()` and continues from
the epoch after it. The driver writes OUTPUT_DIR/metrics.json (per-epoch history, throughput).
"""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
import yaml

import gpu_images
import ray
import ray.cloudpickle
import ray.train
import ray.train.torch
from gpu_images import make_loaders
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

HERE = Path(__file__).resolve().parent
ray.cloudpickle.register_pickle_by_value(gpu_images)  # the workers get the data path with the function, not by import


def build_model(weights: str | None, num_classes: int) -> torch.nn.Module:
    """ResNet-50 (ImageNet weights unless None) with a new `num_classes` head."""
    model = torchvision.models.resnet50(weights=weights)
    model.fc = torch.nn.Linear(model.fc.in_features, num_classes)
    return model


def die_once(config: dict, epoch: int, rank: int, world_size: int) -> None:
    """Test hook (--fail-once-at-epoch): after training that epoch, before reporting it, the last rank
    kills itself, once (a marker file remembers), as a worker on a lost node would die."""
    marker = config["fail_marker"]
    if config.get("fail_once_at_epoch") != epoch or rank != world_size - 1 or os.path.exists(marker):
        return
    Path(marker).write_text(f"rank {rank} killed itself in epoch {epoch}\n")
    print(f"[test hook] rank {rank}: SIGKILL in epoch {epoch}, before its report", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


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

    # JPEG decoding and augmentation on this worker's device, a few batches ahead (gpu_images.py)
    train_loader, val_loader = make_loaders(
        config["data_pipeline"], config["data"], batch_size=config["batch_size"], image_size=config["image_size"],
        device=device, rank=rank, world_size=world_size, seed=config["seed"], read_threads=config["read_threads"],
        loader_workers=config["loader_workers"])
    model = build_model(config["weights"], num_classes=train_loader.num_classes)
    start_epoch, state, history = 0, None, []
    checkpoint = ray.train.get_checkpoint()  # set when Ray Train restarted us after a failure
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "checkpoint.pt"), map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        print(f"rank {rank}: resuming from the checkpoint of epoch {state['epoch']}", flush=True)

    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # the layout cuDNN's bf16 convolutions want
    if config["torch_compile"]:  # in place (the state dict keeps its names), before DDP wraps it (no graph breaks)
        model.compile()
    model = ray.train.torch.prepare_model(model)  # Ray: onto this worker's device, wrapped in DDP
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])  # after the move: its state follows the parameters

    for epoch in range(start_epoch, config["epochs"]):
        train_loader.set_epoch(epoch)  # this epoch's shuffle and crops: the same after a restart
        started = time.perf_counter()
        train_loss, train_acc, train_images, train_s = run_epoch(model, train_loader, optimizer, device, bf16)
        die_once(config, epoch, rank, world_size)
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
                checkpoint = Checkpoint.from_directory(folder)
            # Every worker reports (it is a barrier); the metrics of rank 0 are kept with the checkpoint.
            ray.train.report({**metrics, "history": history}, checkpoint=checkpoint)
    return history


def parse_args(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(HERE / "config.yaml"), help="YAML file of defaults")
    parser.add_argument("--data", help="folder with train/ and val/ class folders (Imagenette layout)")
    parser.add_argument("--download", action=argparse.BooleanOptionalAction,
                        help="fetch Imagenette (320 px) into --data's parent if --data has no train/")
    parser.add_argument("--num-workers", type=int, help="Ray Train workers: one GPU each (or CPU)")
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, help="default: if the cluster has GPUs")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batch-size", type=int, help="per worker")
    parser.add_argument("--lr", type=float)
    parser.add_argument("--weight-decay", type=float)
    parser.add_argument("--weights", help="torchvision weights name, or 'none' to train from scratch")
    parser.add_argument("--image-size", type=int)
    parser.add_argument("--data_pipeline", choices=("device", "dataloader"),
                        help="device: decode JPEGs on the worker's GPU (nvJPEG) or CPU; dataloader: PIL in DataLoader processes")
    parser.add_argument("--read_threads", type=int, help="threads per Ray worker reading JPEG files (device pipeline)")
    parser.add_argument("--loader-workers", type=int, help="DataLoader processes per Ray worker (dataloader pipeline)")
    parser.add_argument("--torch_compile", action=argparse.BooleanOptionalAction, help="compile the model (torch.compile)")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, help="bf16 autocast on GPUs")
    parser.add_argument("--max-failures", type=int, help="worker-group restarts allowed (from the last checkpoint)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--output-dir", help="metrics.json goes here")
    parser.add_argument("--storage-path", help="checkpoints (shared storage on a cluster); default OUTPUT_DIR/ray_results")
    parser.add_argument("--address", help="Ray cluster address; default RAY_ADDRESS, else a local Ray")
    parser.add_argument("--fail-once-at-epoch", type=int, help=argparse.SUPPRESS)  # tests: kill a worker once
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text())
    config.update({k: v for k, v in vars(args).items() if v is not None and k != "config"})
    config["weights"] = None if str(config["weights"]).lower() in ("none", "") else config["weights"]
    for key in ("data", "output_dir"):
        config[key] = os.path.abspath(os.path.expanduser(config[key]))
    config["storage_path"] = config.get("storage_path") or os.path.join(config["output_dir"], "ray_results")
    config["fail_marker"] = os.path.join(config["output_dir"], "killed_worker.marker")
    return config


def main(argv=None) -> None:
    config = parse_args(argv)
    if not os.path.isdir(os.path.join(config["data"], "train")):
        if not config["download"]:
            raise SystemExit(f"{config['data']} has no train/ folder; pass --data DIR or --download")
        torchvision.datasets.Imagenette(os.path.dirname(config["data"]), split="train", size="320px", download=True)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints reach us once, not twice
    ray.init(address=config.get("address"))
    use_gpu = config.get("use_gpu")
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=config["num_workers"], use_gpu=use_gpu),
        run_config=RunConfig(
            name=config["run_name"],
            storage_path=config["storage_path"],
            failure_config=FailureConfig(max_failures=config["max_failures"]),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall_s = time.perf_counter() - started
    history = result.metrics["history"]  # every epoch, across worker-group restarts (it travels in the checkpoint)
    losses = [m["train_loss"] for m in history]
    from nbhelpers.metrics import write_metrics

    path = write_metrics(
        config["output_dir"],
        recipe="ray_resnet50", world_size=history[-1]["world_size"], use_gpu=use_gpu,
        data_pipeline=config["data_pipeline"], torch_compile=config["torch_compile"],
        batch_size_per_worker=config["batch_size"], image_size=config["image_size"], weights=config["weights"],
        epochs=history, losses=losses, initial_loss=losses[0], final_loss=losses[-1],
        final_val_accuracy=history[-1]["val_accuracy"],
        images_per_s=history[-1]["images_per_s"],  # the last epoch: warm (the first includes cuDNN tuning)
        worker_group_starts=sorted({m["started_at_epoch"] for m in history}),
        killed_worker=os.path.exists(config["fail_marker"]),
        checkpoint=result.checkpoint.path if result.checkpoint else None, wall_s=wall_s,
    )
    print(f"final: train loss {losses[-1]:.4f}, val accuracy {history[-1]['val_accuracy']:.3f}, "
          f"{history[-1]['images_per_s']:.0f} images/s on {history[-1]['world_size']} workers -> {path}")


if __name__ == "__main__":
    main()

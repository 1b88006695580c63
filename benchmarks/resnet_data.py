"""ResNet-50 training on one GPU, side by side, fed several ways (issues 21 §1 and 59), all from one folder of JPEGs
written to local disk at the start:

  (a) synthetic: one batch of random tensors already on the GPU, reused: the ceiling a data path can approach;
  (b) dataloader: the recipe's first data path (PIL decoding + torchvision transforms in DataLoader processes);
  (c) device: the recipe's data path now (recipes/ray_resnet50/gpu_images.py: nvJPEG batches, one-gather crops),
      `--prefetch_batches` ahead of the step on a stream of its own, and (c0) the same in turn with the step
      (prefetch_batches 0, the baseline of the overlap);
  (d) synthetic, with the device path making one batch per step beside it, on its own streams, its batches dropped:
      the step slowed only by sharing the GPU with the data path's work, which no overlap can hide;
  (a), (c), (c0) and (d) eager and with torch.compile; plus a profile of where (c)'s time goes (file reads,
  host-to-device copy of the JPEG bytes, decode, crop/resize, each alone; the step alone is (a)), a profile of
  the GPU's streams while (a) and (c) train (is the step's stream ever idle, waiting for data, and how much of the
  data path's GPU time runs beside the step's kernels), and a check that the GPU path gives the CPU path's pixels.
  The training step is the recipe's (recipes/ray_resnet50/train.py): bf16 autocast, channels_last, AdamW, no Ray
  (the recipe under Ray Train is benchmarks/gpu/resnet_data.sh's optional second stage).

    python benchmarks/resnet_data.py --output_dir OUT [--train_images 32000] [--per_device_train_batch_size 256]

On CPU (a dry run of the logic): `--train_images 96 --max_side 64 --image_size 32 --per_device_train_batch_size 8
--timed_steps 3 --no-torch_compile`. Writes OUT/resnet_data.json after every phase (a time-out keeps what finished).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "recipes" / "ray_resnet50"))
sys.path.insert(0, str(REPO / "data"))
from gpu_images import DataLoaderBatches, HostBuffers, JpegFolderLoader  # noqa: E402
from make_image_folders import IMAGENETTE_CLASSES  # noqa: E402

# ImageNet's common shapes (width, height) and how often: mean about 0.21 megapixels, as ImageNet's training set.
PHOTO_SHAPES = [((500, 375), .45), ((375, 500), .15), ((500, 333), .15), ((333, 500), .05), ((500, 500), .1), ((640, 480), .1)]
NOISE_SIGMA = 24  # pixel noise that makes quality-90 JPEGs about ImageNet's mean size (~110 kB)


# --- the JPEG folder ---------------------------------------------------------------------------------

def _write_images(task) -> tuple[int, int]:
    """Write one slice of the folder; returns (bytes, pixels) written."""
    from PIL import Image, ImageDraw

    root, split, start, stop, max_side, seed = task
    rng = np.random.default_rng([seed, start])
    noise = np.clip(rng.normal(0, NOISE_SIGMA, (704, 704, 3)), -80, 80).astype(np.float32)
    shapes, weights = zip(*PHOTO_SHAPES)
    written = pixels = 0
    for i in range(start, stop):
        label = i % len(IMAGENETTE_CLASSES)
        w, h = shapes[rng.choice(len(shapes), p=weights)]
        if max(w, h) > max_side:
            w, h = max(8, w * max_side // max(w, h)), max(8, h * max_side // max(w, h))
        background = Image.fromarray(rng.integers(30, 226, (4, 4, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
        y, x = rng.integers(0, 704 - h + 1), rng.integers(0, 704 - w + 1)
        image = Image.fromarray(np.clip(np.asarray(background, np.float32) + noise[y:y + h, x:x + w], 0, 255).astype(np.uint8))
        r = rng.uniform(0.15, 0.3) * min(w, h)  # a disc whose colour says the class: something to learn
        cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        ImageDraw.Draw(image).ellipse([cx - r, cy - r, cx + r, cy + r], fill=tuple(int(25 * label + c) for c in (0, 80, 160)))
        data = io.BytesIO()
        image.save(data, "JPEG", quality=90)
        wnid = IMAGENETTE_CLASSES[label][0]
        (Path(root) / split / wnid / f"{wnid}_{i}.JPEG").write_bytes(data.getvalue())
        written, pixels = written + data.tell(), pixels + w * h
    return written, pixels


def make_jpeg_folder(root: Path, train_images: int, val_images: int, max_side: int, processes: int) -> dict:
    """ROOT/{train,val}/<wnid>/*.JPEG in Imagenette's layout, photo-sized; returns what was written and how fast."""
    started = time.perf_counter()
    for split in ("train", "val"):
        for wnid, _ in IMAGENETTE_CLASSES:
            (root / split / wnid).mkdir(parents=True, exist_ok=True)
    tasks = []
    for split, count, seed in (("train", train_images, 0), ("val", val_images, 1)):
        step = max(1, count // (processes * 4))
        tasks += [(str(root), split, i, min(i + step, count), max_side, seed) for i in range(0, count, step)]
    # spawn, not fork: a fork of a process with threads (a pytest-xdist worker, a notebook's kernel) can copy a lock
    # another thread held, and the pool then waits forever (seen in the test suite on 2026-12-05)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        done = pool.map(_write_images, tasks)
    seconds = time.perf_counter() - started
    total_bytes, total_pixels, n = sum(b for b, _ in done), sum(p for _, p in done), train_images + val_images
    return dict(root=str(root), train_images=train_images, val_images=val_images, processes=processes,
                seconds=seconds, images_per_s=n / seconds, mean_kb=total_bytes / n / 1e3,
                mean_megapixels=total_pixels / n / 1e6, total_gb=total_bytes / 1e9)


# --- the recipe's training step ----------------------------------------------------------------------

def make_model(num_classes: int, device: torch.device, compile_model: bool):
    model = torchvision.models.resnet50(weights=None)
    model.fc = torch.nn.Linear(model.fc.in_features, num_classes)
    model = model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if compile_model:
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    return model, optimizer


def train_step(model, optimizer, images, labels, totals, bf16: bool) -> None:
    """recipes/ray_resnet50/train.py's run_epoch body."""
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(images)
    loss = F.cross_entropy(logits.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    totals += torch.stack([loss.detach() * len(labels), (logits.argmax(1) == labels).sum(),
                           torch.full((), len(labels), device=images.device)])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def endless(loader):
    """Batches of epoch 0, 1, 2, ... without end (close() stops the loader's threads)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def timed_training(model, optimizer, batches, device, warmup: int, steps: int, bf16: bool, loader=None) -> dict:
    """Images/s over `steps` steps after `warmup` (cuDNN choices, compiling, the loader's pipeline filling)."""
    totals = torch.zeros(3, device=device)
    started = time.perf_counter()
    for _ in range(warmup):
        train_step(model, optimizer, *next(batches), totals, bf16)
    synchronize(device)
    warmup_s = time.perf_counter() - started
    waited = loader.stats["wait_s"] if isinstance(loader, JpegFolderLoader) else None
    images_before = totals[2].item()
    started = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, *next(batches), totals, bf16)
    synchronize(device)
    seconds = time.perf_counter() - started
    images = totals[2].item() - images_before
    result = dict(images_per_s=images / seconds, step_ms=seconds / steps * 1e3, timed_steps=steps, warmup_steps=warmup,
                  warmup_s=warmup_s, mean_loss=totals[0].item() / totals[2].item())
    if waited is not None:  # the training loop waiting for the loader: the GPU starved this long
        result["waiting_for_data_fraction"] = (loader.stats["wait_s"] - waited) / seconds
    return result


def pipeline_alone(batches, device, warmup: int, steps: int) -> dict:
    """A data path's own throughput: batches taken as fast as it gives them, nothing trained."""
    for _ in range(warmup):
        next(batches)
    synchronize(device)
    started, images = time.perf_counter(), 0
    for _ in range(steps):
        images += len(next(batches)[1])
    synchronize(device)
    return dict(images_per_s=images / (time.perf_counter() - started))


def training_beside(model, optimizer, batch, loader, device, warmup: int, steps: int, bf16: bool) -> dict:
    """timed_training on the synthetic `batch` while another thread takes one of `loader`'s batches per step and drops
    it, on a stream of its own (the step's stream waits for nothing): the data path's GPU work beside the step."""
    permits, stop, failed = threading.Semaphore(0), threading.Event(), []

    def drain():
        batches = endless(loader)
        try:
            with torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else contextlib.nullcontext():
                while not stop.is_set():
                    if permits.acquire(timeout=0.1):
                        next(batches)
        except Exception as err:  # noqa: BLE001 - raised in the timing thread below
            failed.append(err)
        finally:
            batches.close()

    def paced():
        while True:
            permits.release()
            yield batch

    thread = threading.Thread(target=drain, name="data-beside", daemon=True)
    thread.start()
    try:
        result = timed_training(model, optimizer, paced(), device, warmup, steps, bf16)
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]
    return result


# --- where the GPU's time goes: each stage of the device path alone; the streams while it trains ------------------

def profile_stages(loader: JpegFolderLoader, device: torch.device, batches: int) -> dict:
    loader.set_epoch(0)
    plan = loader.batches()[:batches]
    buffers = HostBuffers(len(plan), pinned=device.type == "cuda")
    with ThreadPoolExecutor(loader.read_threads) as pool:
        started = time.perf_counter()
        jobs = [loader.read(pool, b, buffers) for b in plan]
        for job in jobs:
            for future in job.futures:
                future.result()
        read_s = time.perf_counter() - started
    nbytes = sum(int(job.sizes.sum()) for job in jobs)
    images = sum(len(b) for b in plan)
    result = dict(batches=len(plan), images=images, mean_kb=nbytes / images / 1e3, nvjpeg=loader.uses_nvjpeg,
                  read=dict(images_per_s=images / read_s, mb_per_s=nbytes / read_s / 1e6, threads=loader.read_threads))
    if device.type == "cuda":
        pinned = jobs[0].buffer
        pageable = torch.from_numpy(pinned.numpy().copy())
        for name, source in (("pinned", pinned), ("pageable", pageable)):
            source.to(device, non_blocking=True)
            synchronize(device)
            started = time.perf_counter()
            for _ in range(10):
                source.to(device, non_blocking=True)
            synchronize(device)
            result[f"h2d_{name}_gb_s"] = 10 * source.numel() / (time.perf_counter() - started) / 1e9
        decoded_batches, decode_s, augment_s = [], 0.0, 0.0
        for number, job in enumerate(jobs):
            synchronize(device)
            started = time.perf_counter()
            decoded = loader.decode(job)
            synchronize(device)
            if number:  # the first call sets nvJPEG up
                decode_s += time.perf_counter() - started
            started = time.perf_counter()
            loader.augment(decoded, 0, number)
            synchronize(device)
            if number:
                augment_s += time.perf_counter() - started
            decoded_batches.append(len(decoded))
        timed = sum(decoded_batches[1:])
        result["decode"] = dict(images_per_s=timed / decode_s, ms_per_batch=decode_s / (len(jobs) - 1) * 1e3)
        result["augment"] = dict(images_per_s=timed / augment_s, ms_per_batch=augment_s / (len(jobs) - 1) * 1e3)
    return result


def busy_spans(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of (start, end) intervals, as sorted disjoint intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    """Time covered by both of two lists of sorted disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        total += max(0.0, min(first[i][1], second[j][1]) - max(first[i][0], second[j][0]))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def gpu_streams(events: list[dict], steps: int) -> dict:
    """From a profiler trace's GPU events (microseconds): the step's stream (the busiest) and its idle time between
    the first and the last GPU event, and the other streams' (the data path's: our decoding stream, nvJPEG's) time,
    with the share of it that ran beside the step's kernels. The step's stream idle longer than the synthetic run's
    means it waited for data; the step's kernels slower than the synthetic run's means they shared the GPU."""
    spans, names = defaultdict(list), defaultdict(Counter)
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            stream = event.get("args", {}).get("stream", event.get("tid"))
            spans[stream].append((event["ts"], event["ts"] + event["dur"]))
            names[stream][event["name"][:70]] += event["dur"]
    if not spans:
        raise ValueError("no GPU events in the trace")
    merged = {stream: busy_spans(s) for stream, s in spans.items()}
    busy = {stream: sum(b - a for a, b in m) for stream, m in merged.items()}
    step_stream = max(busy, key=busy.get)
    data = busy_spans([span for stream, m in merged.items() if stream != step_stream for span in m])
    data_busy = sum(b - a for a, b in data)
    window = max(b for m in merged.values() for _, b in m) - min(m[0][0] for m in merged.values())
    per_step = 1e-3 / steps  # microseconds -> ms per step
    return dict(
        steps=steps, window_ms_per_step=window * per_step, step_stream=step_stream,
        step_kernels_ms_per_step=busy[step_stream] * per_step,
        step_stream_idle_ms_per_step=(window - busy[step_stream]) * per_step,
        data_streams_ms_per_step=data_busy * per_step,
        data_beside_step_share=overlap(merged[step_stream], data) / data_busy if data_busy else None,
        streams={str(stream): dict(ms_per_step=busy[stream] * per_step,
                                   top=[(name, round(us * per_step, 3)) for name, us in names[stream].most_common(4)])
                 for stream in sorted(busy, key=busy.get, reverse=True)})


def stream_profile(model, optimizer, batches, device, bf16: bool, steps: int, trace: Path) -> dict:
    """A few training steps under torch.profiler (GPU activity only): gpu_streams of their trace, kept gzipped."""
    from torch.profiler import ProfilerActivity, profile

    totals = torch.zeros(3, device=device)
    for _ in range(3):
        train_step(model, optimizer, *next(batches), totals, bf16)
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            train_step(model, optimizer, *next(batches), totals, bf16)
        synchronize(device)
        wall = time.perf_counter() - started
    raw = trace.with_suffix("")  # .json
    profiler.export_chrome_trace(str(raw))
    events = json.loads(raw.read_text())["traceEvents"]
    with open(raw, "rb") as f, gzip.open(trace, "wb") as g:
        g.write(f.read())
    raw.unlink()
    return dict(wall_ms_per_step=wall * 1e3 / steps, **gpu_streams(events, steps))


def gpu_matches_cpu(val_root: Path, device: torch.device, image_size: int) -> dict:
    """One validation batch through the device path on the GPU and on the CPU: nvJPEG vs libjpeg-turbo pixels."""
    batch = {}
    for where in (device, torch.device("cpu")):
        loader = JpegFolderLoader(val_root, batch_size=64, image_size=image_size, device=where, train=False)
        images, labels = next(iter(loader))
        batch[where.type] = (images.float().cpu(), labels.cpu())
    (gpu, gpu_labels), (cpu, cpu_labels) = batch[device.type], batch["cpu"]
    levels = (gpu - cpu).abs() * 255 * 0.229  # back to 0-255 levels (at most: the smallest std)
    return dict(images=len(gpu), labels_equal=bool(torch.equal(gpu_labels, cpu_labels)),
                max_abs_diff_levels=levels.max().item(), mean_abs_diff_levels=levels.mean().item())


# --- main ------------------------------------------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True, help="resnet_data.json goes here")
    parser.add_argument("--data_dir", help="where to write the JPEG folder (default: a temporary folder, removed after)")
    parser.add_argument("--train_images", type=int, default=32000)
    parser.add_argument("--val_images", type=int, default=1000)
    parser.add_argument("--max_side", type=int, default=640, help="shrink the photo shapes to this longest side (CPU dry runs)")
    parser.add_argument("--per_device_train_batch_size", type=int, default=256)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--timed_steps", type=int, default=40)
    parser.add_argument("--timing_warmup_steps", type=int, default=8)
    parser.add_argument("--dataloader_num_workers", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="DataLoader processes of the old path")
    parser.add_argument("--read_threads", type=int, default=8)
    parser.add_argument("--prefetch_batches", type=int, default=3, help="the device path's overlap (the recipe's flag)")
    parser.add_argument("--dataloader_path", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the old DataLoader path")
    parser.add_argument("--profile_steps", type=int, default=10, help="steps of each stream profile (GPU only; 0: none)")
    parser.add_argument("--torch_compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--data_only", action="store_true", help="write the JPEG folder to --data_dir and stop")
    args = parser.parse_args(argv)
    if args.data_only and not args.data_dir:
        parser.error("--data_only needs --data_dir (otherwise the folder is removed at the end)")

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = dict(benchmark="resnet_data", settings={k: v for k, v in vars(args).items() if k != "output_dir"}, runs={})

    def save(phase: str) -> None:
        (out / "resnet_data.json").write_text(json.dumps(results, indent=2))
        print(f"[{time.perf_counter() - begin:6.1f} s] {phase}: {json.dumps(results.get(phase) or results['runs'].get(phase))}",
              flush=True)

    begin = time.perf_counter()
    scratch = None if args.data_dir else tempfile.TemporaryDirectory(prefix="resnet_data_", dir="/tmp")
    root = Path(args.data_dir or scratch.name)
    try:
        # before CUDA is touched: the writers are forked
        results["data"] = make_jpeg_folder(root, args.train_images, args.val_images, args.max_side, os.cpu_count() or 1)
        if args.data_only:
            save("data")
            return
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        bf16 = args.bf16 and device.type == "cuda"
        results["environment"] = dict(
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"), host=platform.node(),
            python=platform.python_version(), torch=torch.__version__, torchvision=torchvision.__version__,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", cpu_cores=os.cpu_count())
        save("data")
        batch, size = args.per_device_train_batch_size, args.image_size
        common = dict(batch_size=batch, image_size=size, device=device, train=True, seed=0)
        device_loader = JpegFolderLoader(root / "train", read_threads=args.read_threads,
                                         prefetch_batches=args.prefetch_batches, **common)
        in_turn_loader = JpegFolderLoader(root / "train", read_threads=args.read_threads, prefetch_batches=0, **common)
        num_classes = device_loader.num_classes
        warmup, steps = args.timing_warmup_steps, args.timed_steps

        def attempt(where: dict, name: str, measure) -> None:
            """One phase; a failure is recorded and the next phase still runs."""
            try:
                where[name] = measure()
            except Exception as err:  # noqa: BLE001 - the figures of the other phases are still worth having
                traceback.print_exc()
                where[name] = dict(error=f"{type(err).__name__}: {err}"[:2000])
            save(name)

        def device_pipeline_alone():
            batches = endless(device_loader)
            try:
                return pipeline_alone(batches, device, warmup, steps)
            finally:
                batches.close()

        def trained_by(loader, also_alone: bool = False):
            batches = endless(loader)
            try:
                result = timed_training(model, optimizer, batches, device, warmup, steps, bf16, loader=loader)
                if also_alone:
                    result["pipeline_alone"] = pipeline_alone(batches, device, warmup, steps)
                return result
            finally:
                batches.close()

        def repeat(item):
            while True:
                yield item

        def profiled(name: str, batches_of):
            """The streams while `batches_of()` feeds the step (GPU only)."""
            if device.type != "cuda" or not args.profile_steps:
                return
            batches = batches_of()
            try:
                attempt(results.setdefault("stream_profiles", {}), name, lambda: stream_profile(
                    model, optimizer, batches, device, bf16, args.profile_steps, out / f"trace_{name}.json.gz"))
            finally:
                if hasattr(batches, "close"):
                    batches.close()

        def each_feed(mode: str) -> None:
            """The step fed each way, `mode` eager or compiled; the synthetic ceiling first (it compiles the model)."""
            started = time.perf_counter()
            attempt(runs, f"synthetic_{mode}", lambda: {
                **timed_training(model, optimizer, repeat(synthetic), device, warmup, steps, bf16),
                "first_step_and_warmup_s": time.perf_counter() - started})
            attempt(runs, f"device_{mode}", lambda: trained_by(device_loader))
            attempt(runs, f"device_{mode}_no_overlap", lambda: trained_by(in_turn_loader))
            attempt(runs, f"synthetic_{mode}_data_beside", lambda: training_beside(
                model, optimizer, synthetic, device_loader, device, warmup, steps, bf16))
            profiled(f"synthetic_{mode}", lambda: repeat(synthetic))
            profiled(f"device_{mode}", lambda: endless(device_loader))

        if device.type == "cuda":
            attempt(results, "check", lambda: gpu_matches_cpu(root / "val", device, size))
        attempt(results, "profile", lambda: profile_stages(device_loader, device, batches=min(12, len(device_loader))))
        attempt(results["profile"], "device_pipeline_alone", device_pipeline_alone)

        model, optimizer = make_model(num_classes, device, compile_model=False)
        memory_format = torch.channels_last if device.type == "cuda" else torch.contiguous_format
        synthetic = (torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=memory_format),
                     torch.randint(0, num_classes, (batch,), device=device))
        runs = results["runs"]
        each_feed("eager")
        if args.dataloader_path:
            attempt(runs, "dataloader_eager", lambda: trained_by(  # its worker processes end with the loader
                DataLoaderBatches(root / "train", dataloader_num_workers=args.dataloader_num_workers, **common),
                also_alone=True))
        if args.torch_compile:
            model.compile()  # in place, as the recipe's --torch_compile
            each_feed("compiled")
        results["device_loader_stats"] = device_loader.stats
    finally:
        if scratch is not None:
            scratch.cleanup()
    results["summary"] = summary_line(results)
    results["wall_s"] = time.perf_counter() - begin
    save("summary")
    (out / "resnet_data_summary.txt").write_text(results["summary"] + "\n")


def summary_line(results: dict) -> str:
    """One line of the figures; a phase that failed or did not run shows as 'failed' or '-'."""
    runs, profile = results["runs"], results.get("profile", {})

    def figure(where: dict, *keys) -> str:
        for key in keys:
            if not isinstance(where, dict) or key not in where:
                return "-"
            if isinstance(where[key], dict) and "error" in where[key]:
                return "failed"
            where = where[key]
        return f"{where:,.0f}"

    def share(name: str, ceiling: str) -> str:
        try:
            return f" ({runs[name]['images_per_s'] / runs[ceiling]['images_per_s']:.0%} of the ceiling)"
        except (KeyError, TypeError, ZeroDivisionError):
            return ""

    def both(name: str) -> str:  # "eager (share) / compiled (share)"
        return " / ".join(f"{figure(runs, name.format(mode), 'images_per_s')}{share(name.format(mode), f'synthetic_{mode}')}"
                          for mode in ("eager", "compiled"))

    def streams(mode: str) -> str:
        device, synthetic = (results.get("stream_profiles", {}).get(f"{name}_{mode}", {}) for name in ("device", "synthetic"))
        try:
            return (f"{mode}: step kernels {device['step_kernels_ms_per_step']:.1f} ms/step (synthetic "
                    f"{synthetic['step_kernels_ms_per_step']:.1f}), step's stream idle {device['step_stream_idle_ms_per_step']:.1f}"
                    f" ({synthetic['step_stream_idle_ms_per_step']:.1f}), data path {device['data_streams_ms_per_step']:.1f} ms/step, "
                    f"{device['data_beside_step_share']:.0%} beside the step's kernels")
        except (KeyError, TypeError):
            return f"{mode}: -"

    env = results.get("environment", {})
    return (f"resnet_data {env.get('date', '')[:10]} {env.get('device', '?')}, batch "
            f"{results['settings']['per_device_train_batch_size']}, {results['data']['mean_kb']:.0f} kB JPEGs, images/s "
            f"eager / compiled: synthetic (the ceiling) {both('synthetic_{}')} | device path, "
            f"{results['settings']['prefetch_batches']} batches ahead: {both('device_{}')}; in turn with the step: "
            f"{both('device_{}_no_overlap')} | the ceiling with the device path's work beside it: "
            f"{both('synthetic_{}_data_beside')} | old DataLoader path {figure(runs, 'dataloader_eager', 'images_per_s')} "
            f"| streams {streams('eager')}; {streams('compiled')} "
            f"| alone: file reads {figure(profile, 'read', 'images_per_s')}, "
            f"nvJPEG {figure(profile, 'decode', 'images_per_s')}, crops {figure(profile, 'augment', 'images_per_s')}, "
            f"device path {figure(profile, 'device_pipeline_alone', 'images_per_s')}, DataLoader path "
            f"{figure(runs, 'dataloader_eager', 'pipeline_alone', 'images_per_s')}")


if __name__ == "__main__":
    main()

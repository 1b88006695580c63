"""The ResNet-50 recipe's data path (recipes/ray_resnet50/gpu_images.py), on CPU: the same code that decodes
with nvJPEG on GPUs decodes with libjpeg-turbo here. Tiny folders, made in each test; about 3 s in all."""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "recipes" / "ray_resnet50"))
from gpu_images import (IMAGENET_MEAN, IMAGENET_STD, DataLoaderBatches, JpegFolderLoader, crop_boxes,  # noqa: E402
                        decode_on_gpu, resized_crops, shard_indices)

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 60, 220)]


def solid_colour_folder(root: Path, per_class: int = 6, size=(40, 30)) -> Path:
    """ROOT/<class>/*.jpg, class k one flat colour (JPEG keeps a flat colour within a few levels)."""
    for label, colour in enumerate(COLOURS):
        (root / f"c{label}").mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, colour).save(root / f"c{label}" / f"{i}.jpg", quality=95)
    return root


def copies_of_one_photo(root: Path, copies: int) -> Path:
    """ROOT/only/*.jpg: the same detailed image (gradient + noise) many times, so crops tell images apart."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:60, 0:80]
    pixels = np.stack([x * 3, y * 4, (x + y) * 2], -1) + rng.integers(0, 40, (60, 80, 3))
    (root / "only").mkdir(parents=True)
    for i in range(copies):
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / "only" / f"{i}.jpg", quality=95)
    return root


def loader(root, **kwargs) -> JpegFolderLoader:
    settings = dict(batch_size=8, image_size=24, device="cpu", train=True, read_threads=2)
    return JpegFolderLoader(root, **{**settings, **kwargs})


def test_batches_are_normalised_float_channels_last_images_whose_colours_match_their_labels(tmp_path):
    val = loader(solid_colour_folder(tmp_path), train=False)
    batches = list(val)
    assert [len(labels) for _, labels in batches] == [8, 8, 2]  # validation keeps the last partial batch
    lowest = min((0 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    highest = max((1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    for images, labels in batches:
        assert images.shape == (len(labels), 3, 24, 24) and images.dtype == torch.float32
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.dtype == torch.int64
        assert lowest - 1e-4 <= images.min() and images.max() <= highest + 1e-4
        expected = torch.tensor([COLOURS[k] for k in labels.tolist()], dtype=torch.float32) / 255
        expected = (expected - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
        assert torch.allclose(images.mean((2, 3)), expected, atol=4 / 255 / 0.224), labels


def test_resized_crops_match_cropping_then_bilinear_interpolation_and_flip_mirrors(tmp_path):
    image = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8)
    other = torch.randint(0, 256, (3, 21, 17), dtype=torch.uint8)
    # resized_crops reads the spare element past the end (weight 0) for a crop at the last image's bottom-right corner
    flat = torch.cat([image.reshape(-1), other.reshape(-1), torch.tensor([255], dtype=torch.uint8)])
    boxes = [(image, 0, (3, 5, 20, 30, 0)), (image, 0, (0, 0, 40, 50, 1)), (other, image.numel(), (2, 1, 9, 13, 0)),
             (other, image.numel(), (0, 4, 21, 13, 0)), (other, image.numel(), (20, 16, 1, 1, 1))]
    params = torch.tensor([[offset, *img.shape[1:], *box] for img, offset, box in boxes])
    for size in (32, 8):  # upsampling and downsampling
        got = resized_crops(flat, params, size, torch.ones(3), torch.zeros(3))
        assert got.is_contiguous(memory_format=torch.channels_last)
        for out, (img, _, (top, left, h, w, flip)) in zip(got, boxes):
            ref = F.interpolate(img[None, :, top:top + h, left:left + w].float(), size=(size, size), mode="bilinear",
                                align_corners=False, antialias=False)[0]
            assert torch.allclose(out, ref.flip(-1) if flip else ref, atol=1e-3), (size, top, left, h, w, flip)


def test_random_crops_differ_per_image_and_repeat_with_the_same_seed_and_epoch(tmp_path):
    root = copies_of_one_photo(tmp_path, copies=8)
    first = next(iter(loader(root, seed=1)))[0]
    flat = first.reshape(len(first), -1)
    assert all(not torch.equal(flat[i], flat[j]) for i in range(8) for j in range(i + 1, 8)), "two crops were identical"
    assert torch.equal(first, next(iter(loader(root, seed=1)))[0])
    assert not torch.equal(first, next(iter(loader(root, seed=2)))[0])
    later = loader(root, seed=1)
    later.set_epoch(1)
    assert not torch.equal(first, next(iter(later))[0])


def test_crop_boxes_follow_random_resized_crop_and_validation_takes_the_centre():
    rng = np.random.default_rng(0)
    heights = rng.integers(40, 400, 2000)
    widths = np.round(heights * rng.uniform(0.6, 1.6, 2000)).astype(int)  # photographs' shapes
    top, left, h, w, flip = crop_boxes(rng, heights, widths, train=True, image_size=32, scale=(0.35, 1.0)).T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= heights).all() and (left + w <= widths).all()
    area = h * w / (heights * widths)
    assert np.mean((area > 0.33) & (area < 1.01)) > 0.99  # a few fall back to the centre crop
    assert np.mean((w / h > 0.7) & (w / h < 1.4)) > 0.99
    assert 0.45 < flip.mean() < 0.55
    top, left, h, w, flip = crop_boxes(rng, np.array([30, 90]), np.array([90, 36]), train=False, image_size=32).T
    assert (h == w).all() and (flip == 0).all()
    assert list(h) == [27, 32] and list(top) == [1, 29] and list(left) == [31, 2]  # side = short side * 32 / 36


def test_every_file_of_an_epoch_is_read_once_over_the_ranks_shards():
    n, world = 37, 3
    for epoch in (0, 1):
        shards = [shard_indices(n, epoch, train=True, rank=r, world_size=world, seed=5) for r in range(world)]
        together = np.concatenate(shards)
        assert [len(s) for s in shards] == [12, 12, 12]  # equal step counts on every rank
        assert len(set(together.tolist())) == 36  # no file twice; 37 % 3 = 1 file sits this epoch out
    assert not np.array_equal(shard_indices(n, 0, train=True, rank=0, world_size=world, seed=5),
                              shard_indices(n, 1, train=True, rank=0, world_size=world, seed=5))
    assert np.array_equal(shard_indices(n, 1, train=True, rank=0, world_size=world, seed=5),
                          shard_indices(n, 1, train=True, rank=0, world_size=world, seed=5))
    val = np.concatenate([shard_indices(n, 0, train=False, rank=r, world_size=world, seed=5) for r in range(world)])
    assert sorted(val.tolist()) == list(range(n))


def test_each_rank_yields_the_labels_of_its_own_shard_in_order(tmp_path):
    root = solid_colour_folder(tmp_path, per_class=7)  # 21 files
    for rank in (0, 1):
        shard = loader(root, rank=rank, world_size=2, batch_size=5, seed=3)
        shard.set_epoch(2)
        read = torch.cat([labels for _, labels in shard]).tolist()
        assert read == shard.labels[shard.epoch_indices()[:10]].tolist()  # 10 of each rank's 10: two full batches


def photos_of_many_sizes(root: Path, classes: int = 3, per_class: int = 9) -> Path:
    """ROOT/c<k>/*.jpg: noise photos of different sizes, so every image, crop and label tells batches apart."""
    rng = np.random.default_rng(4)
    for label in range(classes):
        (root / f"c{label}").mkdir(parents=True)
        for i in range(per_class):
            h, w = rng.integers(20, 60, 2)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / f"c{label}" / f"{i}.jpg")
    return root


def epochs_seen(make, epochs, slow_step: float = 0.0) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every batch that reaches the step, per epoch, from one loader made by make(), as a worker group makes it."""
    seen, batches = [], make()
    for epoch in epochs:
        batches.set_epoch(epoch)
        seen.append([])
        for images, labels in batches:
            seen[-1].append((images.clone(), labels.clone()))
            time.sleep(slow_step)  # a slow step: the loader's queue fills up
    return seen


@pytest.mark.parametrize("train", [True, False])
def test_the_overlap_changes_nothing_that_reaches_the_step_nor_its_order_also_after_a_resume(tmp_path, train):
    root = photos_of_many_sizes(tmp_path)
    settings = dict(batch_size=4, train=train, rank=1, world_size=2, seed=7)
    in_turn = epochs_seen(lambda: loader(root, prefetch_batches=0, **settings), [0, 1, 2])
    assert [len(epoch) for epoch in in_turn] == ([3] * 3 if train else [4] * 3)  # 13 files per rank; val keeps 1 more
    labels = [torch.cat([l for _, l in epoch]) for epoch in in_turn]
    shard = loader(root, **settings)
    for epoch, got in enumerate(labels):
        shard.set_epoch(epoch)
        assert got.tolist() == shard.labels[np.concatenate(shard.batches())].tolist()
    if train:
        assert not torch.equal(in_turn[0][0][0], in_turn[1][0][0]), "epochs 0 and 1 began alike: no reshuffle"
    runs = {
        "1 batch ahead": epochs_seen(lambda: loader(root, prefetch_batches=1, **settings), [0, 1, 2]),
        "3 ahead, slow step": epochs_seen(lambda: loader(root, prefetch_batches=3, **settings), [0, 1, 2], 0.02),
        # a worker group restarted after a failure in epoch 1 builds new loaders and begins at epoch 1
        "resumed at epoch 1": [in_turn[0]] + epochs_seen(lambda: loader(root, prefetch_batches=3, **settings), [1, 2]),
    }
    for name, run in runs.items():
        assert len(run) == len(in_turn), name
        for epoch, (want, got) in enumerate(zip(in_turn, run)):
            assert len(got) == len(want), (name, epoch)
            for number, ((want_images, want_labels), (images, labels)) in enumerate(zip(want, got)):
                assert torch.equal(labels, want_labels), (name, epoch, number)
                assert torch.equal(images, want_images), (name, epoch, number)


def test_an_epoch_stopped_halfway_begins_again_from_its_first_batch(tmp_path):
    root = photos_of_many_sizes(tmp_path)
    whole = epochs_seen(lambda: loader(root, batch_size=4, prefetch_batches=2), [1])[0]
    stopped = loader(root, batch_size=4, prefetch_batches=2)
    stopped.set_epoch(1)
    epoch = iter(stopped)
    next(epoch), next(epoch)
    epoch.close()  # the worker died here
    again = [(images, labels) for images, labels in stopped]
    assert len(again) == len(whole) == 6
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(again, whole))


def test_the_loader_runs_at_most_prefetch_batches_ahead_of_the_step(tmp_path, monkeypatch):
    root = photos_of_many_sizes(tmp_path)  # 27 files: 13 batches of 2
    made = []
    finish = JpegFolderLoader.finish_batch
    monkeypatch.setattr(JpegFolderLoader, "finish_batch", lambda self, *a: made.append(1) or finish(self, *a))
    for depth in (1, 3):
        made.clear()
        ahead = []
        for taken, _ in enumerate(loader(root, batch_size=2, prefetch_batches=depth), start=1):
            if taken == 1:  # a long first step: let the loader go as far ahead as it may (a liveness wait, not a timing)
                deadline = time.monotonic() + 60
                while len(made) < depth + 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.05)
            ahead.append(len(made) - taken)
        # `depth` batches wait in the queue, and one more in the thread's hands, never more
        assert max(ahead) == depth + 1, (depth, ahead)


def test_prefetch_batches_below_zero_is_refused(tmp_path):
    with pytest.raises(ValueError, match="prefetch_batches must be 0"):
        loader(solid_colour_folder(tmp_path), prefetch_batches=-1)


def test_a_corrupt_jpeg_stops_the_epoch_with_an_error_naming_the_file(tmp_path):
    root = solid_colour_folder(tmp_path)
    bad = root / "c1" / "2.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not the rest of a JPEG" * 4)
    with pytest.raises(ValueError, match=f"cannot decode {re.escape(str(bad))}"):
        for _ in loader(root, train=False):
            pass


def test_a_batch_the_decoder_refuses_is_decoded_image_by_image_and_a_bad_file_is_named(tmp_path):
    # decode_on_gpu's fallback, run with the CPU decoder in nvJPEG's place: ImageNet has PNGs named .JPEG
    files = {"good.jpg": "JPEG", "png_in_disguise.jpg": "PNG"}
    for name, kind in files.items():
        Image.new("RGB", (12, 10), (200, 10, 10)).save(tmp_path / name, kind)
    as_bytes = [torch.frombuffer(bytearray((tmp_path / n).read_bytes()), dtype=torch.uint8) for n in files]
    decoded = decode_on_gpu(as_bytes, list(files), torch.device("cpu"))
    assert [tuple(d.shape) for d in decoded] == [(3, 10, 12), (3, 10, 12)]
    garbage = torch.frombuffer(bytearray(b"not an image at all" * 5), dtype=torch.uint8)
    with pytest.raises(ValueError, match="cannot decode broken.jpg"):
        decode_on_gpu([as_bytes[0], garbage], ["good.jpg", "broken.jpg"], torch.device("cpu"))


def test_an_image_folder_with_non_jpeg_images_is_refused_before_reading_naming_one(tmp_path):
    root = solid_colour_folder(tmp_path)
    Image.new("RGB", (8, 8)).save(root / "c0" / "odd.png")
    with pytest.raises(ValueError, match=r"1 image\(s\) in .* are not JPEG \(e.g. .*odd.png\).*--data_pipeline dataloader"):
        loader(root)


def test_too_few_images_for_one_batch_per_rank_is_refused_with_the_counts(tmp_path):
    root = solid_colour_folder(tmp_path, per_class=2)
    with pytest.raises(ValueError, match="6 images: 3 per worker for 2 worker.*fewer than one batch of 8"):
        loader(root, world_size=2)


def test_stopping_early_leaves_no_loader_thread_running(tmp_path):
    epoch = iter(loader(copies_of_one_photo(tmp_path, copies=40)))
    next(epoch)
    epoch.close()  # what a `break` out of the training loop does
    assert not [t.name for t in threading.enumerate() if t.name.startswith("jpeg-")]


def test_the_dataloader_pipeline_gives_batches_of_the_same_form(tmp_path):
    root = solid_colour_folder(tmp_path)
    images, labels = next(iter(DataLoaderBatches(root, batch_size=8, image_size=24, device="cpu", train=True,
                                                 dataloader_num_workers=0)))
    assert images.shape == (8, 3, 24, 24) and images.dtype == torch.float32 and labels.dtype == torch.int64


def test_the_benchmark_measures_every_path_without_an_error_on_a_cpu(tmp_path):
    """benchmarks/resnet_data.py records a failed phase and goes on, so only this test sees a phase that breaks
    (on 2026-12-01 the old DataLoader path failed on the GPU on a renamed argument)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import resnet_data

    resnet_data.main(["--output_dir", str(tmp_path), "--train_images", "24", "--val_images", "6", "--max_side", "48",
                      "--per_device_train_batch_size", "4", "--image_size", "32", "--timed_steps", "1",
                      "--timing_warmup_steps", "1", "--dataloader_num_workers", "1", "--read_threads", "1",
                      "--no-torch_compile"])
    results = json.loads((tmp_path / "resnet_data.json").read_text())
    failed = {name: run["error"] for name, run in results["runs"].items() if isinstance(run, dict) and "error" in run}
    assert not failed, failed
    assert {"synthetic_eager", "device_eager", "device_eager_no_overlap", "synthetic_eager_data_beside",
            "dataloader_eager"} <= set(results["runs"])
    assert "in turn with the step" in results["summary"]


def test_the_benchmarks_stream_profile_tells_the_steps_idle_time_from_the_data_paths_time_beside_it():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from resnet_data import gpu_streams

    def kernel(stream, start, end, name="k"):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": end - start, "args": {"stream": stream}}

    # 2 steps on stream 7 (busy 0-40 and 50-90 us); the data path on stream 20 (30-60) and nvJPEG's stream 21
    # (55-65, 95-100): busy 30-65 and 95-100, of which 30-40 and 50-65 beside the step's kernels
    events = [kernel(7, 0, 25), kernel(7, 20, 40), kernel(7, 50, 90), kernel(20, 30, 60, "crop"),
              kernel(21, 55, 65, "nvjpeg"), kernel(21, 95, 100, "nvjpeg"),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 500, "args": {}}]
    got = gpu_streams(events, steps=2)
    assert got["step_stream"] == 7
    assert got["window_ms_per_step"] == pytest.approx(100 / 2 / 1e3)
    assert got["step_kernels_ms_per_step"] == pytest.approx(80 / 2 / 1e3)
    assert got["step_stream_idle_ms_per_step"] == pytest.approx(20 / 2 / 1e3)  # 40-50 and 90-100
    assert got["data_streams_ms_per_step"] == pytest.approx(40 / 2 / 1e3)  # 30-65 and 95-100
    assert got["data_beside_step_share"] == pytest.approx((10 + 15) / 40)  # 30-40 and 50-65
    assert got["streams"]["20"]["top"] == [("crop", pytest.approx(0.015))]

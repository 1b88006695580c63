"""The data path of recipes/ray_resnet50: JPEG image folders -> augmented, normalised batches on the training device.

Precondition: an ImageFolder tree, ROOT/<class>/<name>.jpg (or .jpeg, any case), as Imagenette and ImageNet unpack.

    loader = JpegFolderLoader(root, batch_size=256, image_size=224, device=device, train=True,
                              rank=rank, world_size=world_size, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:   # float32 [B, 3, S, S] channels_last, int64 [B], both on `device`
            ...

Why: decoding JPEGs with PIL in DataLoader processes (`pipeline="dataloader"`, the recipe's first data
path, kept for comparison and for folders of other formats) fed one H200 about 1,100 images/s; ResNet-50
trains at 4,700 (eager) to 6,800 (compiled) images/s there. JPEG decoding is the work that costs, so it
moves to the GPU. Each batch goes through three stages:
1. read: a few threads read the batch's files into one of a few reused pinned host buffers (the raw JPEG bytes);
2. decode: one batched `torchvision.io.decode_jpeg(..., device="cuda")` call: nvJPEG, which on A100,
   H100 and H200 runs baseline JPEGs on the GPU's hardware JPEG engines, beside the SMs that train.
   Without a GPU the read threads decode their files instead (libjpeg-turbo), so the same code runs on CPU;
3. augment: RandomResizedCrop + horizontal flip (training) or resize + centre crop (validation) of the
   whole batch in one vectorised bilinear gather, normalised with ImageNet's mean and std.
With `prefetch_batches` N > 0, stages 2 and 3 run in a background thread on a CUDA stream of their own, up to N
batches ahead of the training step, and the reads N batches ahead of the decoder: the step's stream waits for a
batch's event, the host does not. N = 0 runs the three stages in the training loop, in turn with the step.

Each rank reads its own shard of a per-epoch permutation (the same on every rank, from seed and epoch),
so a rerun of the same command sees the same data order, and the crops are drawn from (seed, epoch,
rank, batch): deterministic per seed, different for every image, whatever N is.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torchvision
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, encode_jpeg

# torchvision 0.29 (CI) deprecates its decoders in favour of TorchCodec, which the GPU machine lacks;
# the call is the same in torchvision 0.26 (torch 2.11) through 0.29.
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
JPEG_SUFFIXES = (".jpg", ".jpeg")
OTHER_IMAGE_SUFFIXES = (".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def scan_image_folder(root) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """ROOT/<class>/*.jpg -> (classes, paths, labels, byte sizes), classes and files sorted as ImageFolder sorts them."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder at {root}: expected {root}/<class>/<image>.jpg")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    paths, labels, sizes, others = [], [], [], []
    for label, name in enumerate(classes):
        for entry in sorted(os.scandir(root / name), key=lambda e: e.name):
            suffix = os.path.splitext(entry.name)[1].lower()
            if suffix in JPEG_SUFFIXES and entry.is_file():
                paths.append(entry.path)
                labels.append(label)
                sizes.append(entry.stat().st_size)
            elif suffix in OTHER_IMAGE_SUFFIXES:
                others.append(entry.path)
    if others:
        raise ValueError(f"{len(others)} image(s) in {root} are not JPEG (e.g. {others[0]}): this loader decodes JPEG "
                         "only; convert them to JPEG, or use the DataLoader pipeline (--data_pipeline dataloader)")
    if not paths:
        raise FileNotFoundError(f"no JPEG images in {root}: expected {root}/<class>/<image>.jpg")
    return classes, paths, np.asarray(labels, dtype=np.int64), np.asarray(sizes, dtype=np.int64)


def shard_indices(n: int, epoch: int, *, train: bool, rank: int, world_size: int, seed: int) -> np.ndarray:
    """This rank's file indices for `epoch`, in order.

    Training: a permutation of all n files drawn from (seed, epoch), the same on every rank, dealt out
    like cards; every rank gets n // world_size of them (equal step counts keep DDP in step), so at
    most world_size - 1 files sit out an epoch. Validation: every file exactly once over the ranks, in order.
    """
    if not train:
        return np.arange(rank, n, world_size)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[rank::world_size][: n // world_size]


def crop_boxes(rng: np.random.Generator, heights: np.ndarray, widths: np.ndarray, *, train: bool, image_size: int,
               scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3)) -> np.ndarray:
    """Per image (top, left, height, width, flip) in source pixels, int64 [B, 5].

    Training: torchvision's RandomResizedCrop (area fraction from `scale`, aspect ratio log-uniform in
    `ratio`, up to 10 tries, then the centre crop clamped to `ratio`) and a horizontal flip with
    probability 1/2, vectorised over the batch. Validation: the centre square that Resize(S * 8 // 7) +
    CenterCrop(S) keeps, no flip.
    """
    heights, widths = heights.astype(np.float64), widths.astype(np.float64)
    n = len(heights)
    if not train:
        side = np.maximum(1, np.round(np.minimum(heights, widths) * image_size / (image_size * 8 // 7)))
        top, left = (heights - side) // 2, (widths - side) // 2
        return np.stack([top, left, side, side, np.zeros(n)], 1).astype(np.int64)
    area = (heights * widths)[:, None]
    target = area * rng.uniform(scale[0], scale[1], (n, 10))
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), (n, 10)))
    w = np.round(np.sqrt(target * aspect))
    h = np.round(np.sqrt(target / aspect))
    fits = (w >= 1) & (w <= widths[:, None]) & (h >= 1) & (h <= heights[:, None])
    first = fits.argmax(1)
    w, h = w[np.arange(n), first], h[np.arange(n), first]
    # No try fitted: the whole image, cropped to the nearest allowed aspect ratio, centred.
    in_ratio = widths / heights
    fallback_w = np.where(in_ratio > ratio[1], np.round(heights * ratio[1]), widths)
    fallback_h = np.where(in_ratio < ratio[0], np.round(widths / ratio[0]), heights)
    none_fit = ~fits.any(1)
    w, h = np.where(none_fit, fallback_w, w), np.where(none_fit, fallback_h, h)
    position = rng.uniform(0, 1, (n, 2))
    top = np.where(none_fit, (heights - h) // 2, np.floor(position[:, 0] * (heights - h + 1)))
    left = np.where(none_fit, (widths - w) // 2, np.floor(position[:, 1] * (widths - w + 1)))
    flip = rng.uniform(0, 1, n) < 0.5
    return np.stack([top, left, h, w, flip], 1).astype(np.int64)


def resized_crops(flat: torch.Tensor, params: torch.Tensor, image_size: int, scale: torch.Tensor,
                  shift: torch.Tensor) -> torch.Tensor:
    """Crop, resize (bilinear) and flip every image of a batch at once.

    `flat`: uint8, the batch's decoded images one after the other, each [3, H, W] flattened, then one spare
    element; `params`: int64 [B, 8] = (offset in `flat`, H, W, top, left, crop height, crop width, flip).
    Returns float32 [B, 3, S, S] in channels_last memory, `value * scale + shift` per channel. Matches cropping
    then `F.interpolate(mode="bilinear", align_corners=False, antialias=False)` (as RandomResizedCrop on a
    tensor with antialias=False). A few kernels per batch, not per image, and few bytes moved (the step
    shares the GPU with them): one int32 index per output value and row of taps, the column taps read through
    a view of `flat` one element on, the scale folded into the weights.
    """
    offset, height, width, top, left, crop_h, crop_w, flip = params.unbind(1)
    centres = torch.arange(image_size, device=flat.device, dtype=torch.float32) + 0.5

    def taps(length):  # per output row (or column): the source one at or before it, and the weight of the next
        src = (centres[None, :] * (length[:, None].float() / image_size) - 0.5).clamp(min=0)
        low = src.floor()
        weight = src - low
        low = low.long().minimum(length[:, None] - 1)
        # on the crop's last row (column) the next one lies outside it: weight 0 (its value is read, never used)
        return low, weight.masked_fill(low == length[:, None] - 1, 0)

    rows, wy = taps(crop_h)
    below = (rows + 1).minimum(crop_h[:, None] - 1)
    cols, wx = taps(crop_w)
    flipped = flip.bool()[:, None]
    cols, wx = (torch.where(flipped, t.flip(1), t) for t in (cols, wx))
    index_type = torch.int32 if flat.numel() <= torch.iinfo(torch.int32).max else torch.int64
    across = (left[:, None, None] + cols[:, :, None]
              + torch.arange(3, device=flat.device) * (height * width)[:, None, None]).to(index_type)  # [B, S, 3]
    wx, wy = wx[:, None, :, None], wy[:, :, None, None]
    shape = (len(params), image_size, image_size, 3)

    def row(source_rows):  # -> float32 [B, S(rows), S(cols), 3]: the two column taps, weighted and scaled
        index = ((offset[:, None] + (top[:, None] + source_rows) * width[:, None]).to(index_type)[:, :, None, None]
                 + across[:, None]).view(-1)
        left_tap, right_tap = flat.index_select(0, index), flat[1:].index_select(0, index)
        return torch.addcmul(left_tap.view(shape) * ((1 - wx) * scale), right_tap.view(shape), wx * scale)

    out = torch.addcmul(shift, row(rows), 1 - wy)
    out.addcmul_(row(below), wy)
    return out.permute(0, 3, 1, 2)  # NHWC memory = NCHW channels_last


def read_files(paths, sizes, buffer: np.ndarray, offsets) -> None:
    """Read each whole file into buffer[offset: offset + size] (no copy on the way)."""
    for path, size, offset in zip(paths, sizes, offsets):
        with open(path, "rb", buffering=0) as f:
            got = f.readinto(buffer[offset: offset + size])
        if got != size:
            raise ValueError(f"{path} changed while training: {got} bytes read, {size} when the folder was scanned; "
                             "keep the image folder unchanged during a run")


def decode_on_cpu(jpeg: torch.Tensor, path: str) -> torch.Tensor:
    """uint8 [3, H, W] from one file's bytes (libjpeg-turbo; also the fallback for what nvJPEG refuses)."""
    try:
        return decode_image(jpeg, mode=ImageReadMode.RGB)
    except RuntimeError as err:
        raise ValueError(f"cannot decode {path} ({err}); delete or replace the file (check it opens: "
                         f"python -c \"from PIL import Image; Image.open('{path}').load()\")") from None


def decode_on_gpu(jpegs: list[torch.Tensor], paths: list[str], device: torch.device) -> list[torch.Tensor]:
    """One batched nvJPEG call; if nvJPEG refuses the batch, image by image: on the GPU, else on the CPU, else
    an error naming the file (a batched call's error does not say which image failed)."""
    try:
        return decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        decoded = []
        for jpeg, path in zip(jpegs, paths):
            try:
                decoded.append(decode_jpeg(jpeg, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:  # e.g. CMYK, or a PNG named .jpg (ImageNet has both)
                decoded.append(decode_on_cpu(jpeg, path).to(device))
        return decoded


def nvjpeg_problem(device: torch.device) -> str | None:
    """None if torchvision's nvJPEG decodes on `device`, else what went wrong (e.g. a build without nvJPEG)."""
    try:
        decode_jpeg([encode_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8))], mode=ImageReadMode.RGB, device=device)
        return None
    except RuntimeError as err:
        return str(err).splitlines()[0]


class ReadJob(NamedTuple):
    """One batch's files, being read into `buffer` (one after the other, at `offsets`) by the read threads' `futures`,
    each of which gives None, or without nvJPEG its files decoded."""
    indices: np.ndarray
    paths: list[str]
    buffer: torch.Tensor
    offsets: np.ndarray
    sizes: np.ndarray
    futures: list[Future]


class HostBuffers:
    """`count` byte buffers (page-locked for a GPU) handed out in turn and reused, each grown when a batch needs more,
    so that pinning (slow, and more of it each batch) happens a few times per run; the holder makes sure that a
    buffer's batch was decoded before it comes round again."""

    def __init__(self, count: int, pinned: bool):
        self.buffers: list[torch.Tensor | None] = [None] * count
        self.pinned, self.turn = pinned, 0

    def take(self, nbytes: int) -> torch.Tensor:
        slot = self.turn % len(self.buffers)
        self.turn += 1
        if self.buffers[slot] is None or self.buffers[slot].numel() < nbytes:
            self.buffers[slot] = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, pin_memory=self.pinned)
        return self.buffers[slot][:nbytes]


class JpegFolderLoader:
    """Batches of one image folder for one rank, decoded and augmented on `device` (see the module docstring).

    Iterating yields (images, labels) on `device`; `set_epoch(e)` picks the epoch's order and crops, as
    DistributedSampler.set_epoch does. Training drops the last partial batch (every step the same shape,
    which torch.compile likes); validation keeps it. `prefetch_batches` (N): batches decoded and cropped ahead of
    the training step by a background thread on a CUDA stream of its own, files read N batches ahead of that;
    0: every stage in the training loop, when it asks for the batch. The batches are the same either way. `stats`
    adds up where the time went: `read_s` (waiting for file reads), `decode_s`, `augment_s` (host time of the
    decoding thread, or of the loop when N = 0), and `wait_s` (the training loop waiting for a batch, on the host:
    the GPU may still have had queued work).
    """

    def __init__(self, root, *, batch_size: int, image_size: int, device, train: bool, rank: int = 0,
                 world_size: int = 1, seed: int = 0, read_threads: int = 8, prefetch_batches: int = 3,
                 scale=(0.35, 1.0)):
        if prefetch_batches < 0:
            raise ValueError(f"prefetch_batches must be 0 (no overlap) or more, got {prefetch_batches}")
        self.root, self.batch_size, self.image_size, self.train = str(root), batch_size, image_size, train
        self.device, self.rank, self.world_size, self.seed = torch.device(device), rank, world_size, seed
        self.read_threads, self.prefetch_batches, self.scale, self.epoch = max(1, read_threads), prefetch_batches, scale, 0
        # (not `.classes`: the name would make cloudpickle, shipping this module to Ray workers, take torch.classes)
        self.class_names, self.paths, self.labels, self.sizes = scan_image_folder(root)
        if train and len(self.paths) // world_size < batch_size:
            raise ValueError(f"{root} has {len(self.paths)} images: {len(self.paths) // world_size} per worker for "
                             f"{world_size} worker(s), fewer than one batch of {batch_size}; lower the batch size")
        self.uses_nvjpeg = False
        if self.device.type == "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device() if self.device.index is None else self.device.index)
            problem = nvjpeg_problem(self.device)
            self.uses_nvjpeg = problem is None
            if problem:
                warnings.warn(f"nvJPEG cannot decode on {self.device} ({problem}): the {self.read_threads} read threads "
                              "decode on the CPU instead, which is several times slower; install a torchvision built "
                              "with nvJPEG (the PyPI CUDA wheels are)")
        scale_c = torch.tensor([1 / (255 * s) for s in IMAGENET_STD])
        self._scale, self._shift = scale_c.to(self.device), (-torch.tensor(IMAGENET_MEAN) / torch.tensor(IMAGENET_STD)).to(self.device)
        if self.uses_nvjpeg:
            # nvJPEG writes its outputs on torchvision's own stream, which waits for no stream of ours; allocating
            # them on this stream, whose memory the allocator hands out again only after the streams recorded on
            # it are done with it, keeps nvJPEG from writing into memory that a queued kernel still reads.
            self._nvjpeg_stream = torch.cuda.Stream(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # _scale and _shift are read on other streams
        self.stats = dict(read_s=0.0, decode_s=0.0, augment_s=0.0, wait_s=0.0, images=0)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_indices(self) -> np.ndarray:
        """The file indices this rank reads this epoch, in order."""
        return shard_indices(len(self.paths), self.epoch, train=self.train, rank=self.rank,
                             world_size=self.world_size, seed=self.seed)

    def batches(self) -> list[np.ndarray]:
        indices = self.epoch_indices()
        if self.train:
            indices = indices[: len(indices) // self.batch_size * self.batch_size]
        return [indices[i: i + self.batch_size] for i in range(0, len(indices), self.batch_size)]

    def __len__(self) -> int:
        return len(self.batches())

    # --- the stages (also called one by one by benchmarks/resnet_data.py for its profile) ---

    def read(self, pool: ThreadPoolExecutor, indices: np.ndarray, buffers: HostBuffers) -> ReadJob:
        """Submit the reads of one batch's files into the next of `buffers`."""
        sizes = self.sizes[indices]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        buffer = buffers.take(int(sizes.sum()))
        paths = [self.paths[i] for i in indices]
        chunks = np.array_split(np.arange(len(indices)), min(self.read_threads, len(indices)))
        view = buffer.numpy()
        on_cpu = not self.uses_nvjpeg

        def read_chunk(chunk):
            read_files([paths[i] for i in chunk], sizes[chunk], view, offsets[chunk])
            if on_cpu:  # no nvJPEG: these threads decode too
                return [decode_on_cpu(buffer[offsets[i]: offsets[i] + sizes[i]], paths[i]) for i in chunk]
            return None

        return ReadJob(indices, paths, buffer, offsets, sizes, [pool.submit(read_chunk, chunk) for chunk in chunks])

    def decode(self, job: ReadJob) -> list[torch.Tensor]:
        """A batch's images, uint8 [3, H, W] each, on this loader's device (its buffer is free again on return)."""
        parts = [future.result() for future in job.futures]
        if not self.uses_nvjpeg:
            return [image for part in parts for image in part]
        jpegs = [job.buffer[o: o + s] for o, s in zip(job.offsets.tolist(), job.sizes.tolist())]
        stream = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._nvjpeg_stream):
            decoded = decode_on_gpu(jpegs, job.paths, self.device)  # returns when nvJPEG is done (torchvision syncs)
        stream.wait_stream(self._nvjpeg_stream)
        for image in decoded:
            image.record_stream(stream)
        return decoded

    def augment(self, decoded: list[torch.Tensor], epoch: int, batch_number: int) -> torch.Tensor:
        heights = np.array([d.shape[1] for d in decoded])
        widths = np.array([d.shape[2] for d in decoded])
        rng = np.random.default_rng([self.seed, epoch, self.rank, batch_number])
        boxes = crop_boxes(rng, heights, widths, train=self.train, image_size=self.image_size, scale=self.scale)
        plane_sizes = 3 * heights * widths
        offsets = np.concatenate([[0], np.cumsum(plane_sizes)[:-1]])
        params = torch.from_numpy(np.column_stack([offsets, heights, widths, boxes]).astype(np.int64))
        if self.device.type == "cuda":
            params = params.pin_memory().to(self.device, non_blocking=True)
        flat = torch.cat([d.reshape(-1) for d in decoded] + [decoded[0].new_zeros(1)])  # + resized_crops' spare element
        if flat.device.type != self.device.type:  # decoded on the CPU for a GPU
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        return resized_crops(flat, params, self.image_size, self._scale, self._shift)

    def finish_batch(self, job: ReadJob, epoch: int, batch_number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for a batch's reads, decode it and augment it on the current stream."""
        started = time.perf_counter()
        for future in job.futures:
            future.result()
        read_done = time.perf_counter()
        decoded = self.decode(job)
        decode_done = time.perf_counter()
        images = self.augment(decoded, epoch, batch_number)
        labels = torch.from_numpy(self.labels[job.indices])
        if self.device.type == "cuda":
            labels = labels.pin_memory().to(self.device, non_blocking=True)
        self.stats["read_s"] += read_done - started
        self.stats["decode_s"] += decode_done - read_done
        self.stats["augment_s"] += time.perf_counter() - decode_done
        return images, labels

    def stages(self, batches, epoch: int, pool: ThreadPoolExecutor, read_ahead: int):
        """(images, labels) of each of `batches` in turn, their files read `read_ahead` batches before their decode."""
        buffers = HostBuffers(read_ahead + 1, pinned=self.device.type == "cuda")
        jobs: deque[ReadJob] = deque()
        try:
            for number in range(len(batches)):
                # batch k takes buffer k % (read_ahead + 1), last used by batch k - read_ahead - 1: decoded already
                while len(jobs) <= read_ahead and number + len(jobs) < len(batches):
                    jobs.append(self.read(pool, batches[number + len(jobs)], buffers))
                yield self.finish_batch(jobs.popleft(), epoch, number)
        finally:
            for job in jobs:  # stopped early: reads not begun need not run (the pool waits for the others)
                for future in job.futures:
                    future.cancel()

    # --- iteration: the stages in the training loop (prefetch_batches 0), or in a thread ahead of it ---

    def __iter__(self):
        batches = self.batches()
        if self.prefetch_batches == 0:
            yield from self._in_turn(batches)
            return
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch_batches)
        stop = threading.Event()
        on_gpu = self.device.type == "cuda"
        device_index = self.device.index if on_gpu else None
        thread = threading.Thread(target=self._produce, args=(batches, self.epoch, ready, stop, device_index),
                                  name="jpeg-batches", daemon=True)
        thread.start()
        try:
            for _ in batches:
                started = time.perf_counter()
                item = ready.get()
                self.stats["wait_s"] += time.perf_counter() - started
                if isinstance(item, BaseException):
                    raise item
                images, labels, done = item
                if on_gpu:  # the step's stream waits for the decoding stream, and the allocator knows who uses what
                    stream = torch.cuda.current_stream(self.device)
                    stream.wait_event(done)
                    images.record_stream(stream)
                    labels.record_stream(stream)
                self.stats["images"] += len(labels)
                yield images, labels
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get(timeout=0.05)
                except queue.Empty:
                    pass
            thread.join()

    def _in_turn(self, batches):
        with ThreadPoolExecutor(self.read_threads, thread_name_prefix="jpeg-read") as pool:
            made = self.stages(batches, self.epoch, pool, read_ahead=0)
            try:
                for _ in batches:
                    started = time.perf_counter()
                    images, labels = next(made)
                    self.stats["wait_s"] += time.perf_counter() - started
                    self.stats["images"] += len(labels)
                    yield images, labels
            finally:
                made.close()

    def _produce(self, batches, epoch: int, ready: queue.Queue, stop: threading.Event, device_index) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        try:
            stream = None
            if device_index is not None:
                torch.cuda.set_device(device_index)  # the current device is per thread
                # High priority: its few kernels are needed before the step's next ones, which at equal priority
                # could hold them back behind a queue of their own.
                stream = torch.cuda.Stream(device_index, priority=-1)
            with ThreadPoolExecutor(self.read_threads, thread_name_prefix="jpeg-read") as pool, \
                    (torch.cuda.stream(stream) if stream is not None else nullcontext()):
                made = self.stages(batches, epoch, pool, read_ahead=self.prefetch_batches)
                try:
                    for images, labels in made:
                        done = None
                        if stream is not None:
                            done = torch.cuda.Event()
                            done.record(stream)
                        if stop.is_set() or not put((images, labels, done)):
                            break
                finally:
                    made.close()
        except BaseException as err:  # noqa: BLE001 - handed to the training loop, which raises it
            put(err)


class DataLoaderBatches:
    """The recipe's first data path: PIL decoding and torchvision transforms in `dataloader_num_workers` DataLoader
    processes, a DistributedSampler across ranks, batches moved to `device` (channels_last on GPUs).

    Kept for comparison (benchmarks/resnet_data.py) and for image folders that are not all JPEG.
    """

    def __init__(self, root, *, batch_size: int, image_size: int, device, train: bool, rank: int = 0,
                 world_size: int = 1, seed: int = 0, dataloader_num_workers: int = 6, scale=(0.35, 1.0)):
        from torchvision import transforms

        normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        if train:
            tf = transforms.Compose([transforms.RandomResizedCrop(image_size, scale=scale),
                                     transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize])
        else:
            tf = transforms.Compose([transforms.Resize(image_size * 8 // 7), transforms.CenterCrop(image_size),
                                     transforms.ToTensor(), normalize])
        self.dataset = torchvision.datasets.ImageFolder(str(root), tf)
        self.device = torch.device(device)
        self.sampler = None
        if world_size > 1:
            self.sampler = torch.utils.data.DistributedSampler(self.dataset, num_replicas=world_size, rank=rank,
                                                               shuffle=train, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=batch_size, shuffle=train and self.sampler is None, sampler=self.sampler,
            drop_last=train, num_workers=dataloader_num_workers, pin_memory=self.device.type == "cuda",
            persistent_workers=dataloader_num_workers > 0, generator=generator)

    @property
    def num_classes(self) -> int:
        return len(self.dataset.class_to_idx)

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for images, labels in self.loader:
            images = images.to(self.device, non_blocking=True)
            if self.device.type == "cuda":
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(self.device, non_blocking=True)


def make_loaders(pipeline: str, data_dir, *, batch_size: int, image_size: int, device, rank: int, world_size: int,
                 seed: int, read_threads: int, dataloader_num_workers: int, prefetch_batches: int = 3):
    """(train, val) loaders of DATA_DIR/train and DATA_DIR/val for one rank; `pipeline` is "device" or "dataloader"."""
    common = dict(batch_size=batch_size, image_size=image_size, device=device, rank=rank, world_size=world_size, seed=seed)
    if pipeline == "device":
        return tuple(JpegFolderLoader(os.path.join(data_dir, split), train=split == "train", read_threads=read_threads,
                                      prefetch_batches=prefetch_batches, **common) for split in ("train", "val"))
    if pipeline == "dataloader":
        return tuple(DataLoaderBatches(os.path.join(data_dir, split), train=split == "train",
                                       dataloader_num_workers=dataloader_num_workers, **common) for split in ("train", "val"))
    raise ValueError(f"data pipeline must be 'device' or 'dataloader', got {pipeline!r}")

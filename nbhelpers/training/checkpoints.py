"""Checkpoints a restart can trust: never resumed half-written, truncated or corrupt.

Preconditions: a checkpoint is a folder; every process that writes into it sees the same filesystem
(one that all nodes share, for a multi-node run); one run at a time writes into a parent folder. When
torch.distributed is initialized, `saving`, `seal` and `newest_verified` are collectives, as in
torch.distributed.checkpoint: every rank calls them, in the same order (the ranks split the files to
check between them and agree on the result); `no_dist=True` makes them local to the calling process.

The rules:
- `saving` writes into `<name>.tmp`, fsyncs every file, writes `checkpoint_manifest.json` (each file's
  size and CRC-32, plus your metadata) last, then renames the folder to `<name>`. A complete checkpoint
  is never overwritten in place: a second save of `<name>` replaces it by rename once it is complete.
- `newest_verified` checks every file against its manifest, newest checkpoint first; it falls back to
  the previous complete one and says why; if checkpoints exist but none verifies, it raises a
  `CheckpointError` naming each folder, what is wrong, and what to do.
- A save that fills the disk raises one CheckpointError saying so (errno 28 from any rank), which checkpoint is
  left unfinished, and that a rerun resumes from the last complete one.
- `refuse_to_start_over` stops a fresh run (not resuming) that would write over an earlier run's checkpoints.
- `rotate` keeps the newest `keep` and never deletes the newest verified checkpoint.
- A folder someone else wrote (HF Trainer's `checkpoint-N`, a DeepSpeed tag, a folder reported to Ray
  Train) is sealed once it is complete: `seal(folder)`; `trainer_callback()` does that for a Trainer.
- `check_resumed_loss` stops a resumed run whose first loss is not finite.

CRC-32 (zlib, standard library) because it keeps up with disks: 4.1 GB/s in memory and 2.8 GB/s
reading a 1 GiB file from the page cache on one core of the 2-core AMD EPYC CI machine (SHA-256: 1.8,
BLAKE2b: 0.9 GB/s). It finds any change of up to 32 consecutive bits and misses a random corruption
with probability 2^-32; sizes catch truncation. It guards against accidents, not against attackers.

    # torch.distributed.checkpoint, every rank:
    found = checkpoints.newest_verified(run / "checkpoints", "step_*")       # None: start fresh
    if found:
        dcp.load(state, checkpoint_id=found)
        step = checkpoints.read_metadata(found)["step"]
    ...
    with checkpoints.saving(run / "checkpoints" / f"step_{step}", {"step": step}, keep=2) as folder:
        dcp.save(state, checkpoint_id=folder)       # every rank writes its shards into folder
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import sys
import zlib
from pathlib import Path

MANIFEST = "checkpoint_manifest.json"
_UNFINISHED = (".tmp", ".old")  # suffixes of a save in progress and of a checkpoint being replaced
_CHUNK = 8 << 20


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted, or a save that could not finish."""


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def saving(folder, metadata: dict | None = None, *, keep: int | None = None, no_dist: bool = False):
    """Yield `<folder>.tmp` to write a checkpoint into; on leaving the block, seal it and rename it to `folder`.

    An exception inside the block leaves only the `.tmp` folder, which nothing resumes from. `metadata`
    (JSON) is stored in the manifest (`read_metadata`); `keep` rotates the checkpoints named like this
    one (`step_12` -> `step_*`) once it is in place.
    """
    folder = Path(folder)
    partial = folder.with_name(folder.name + ".tmp")
    dist = _dist(no_dist)

    def start():
        if partial.exists():  # a save of the same name that did not finish
            shutil.rmtree(partial)
        partial.mkdir(parents=True)

    _on_rank0(dist, start)
    try:
        yield partial
        _seal(partial, metadata, dist)
    except BaseException as error:
        full = disk_full(error, partial)
        if full is None:
            raise
        raise CheckpointError(
            f"checkpoint {folder.name} could not be written: the disk of {folder.parent} is full ({full}). It is left "
            f"unfinished as {partial.name}, which nothing resumes from. What to do: free space on that disk (or use an "
            f"output_dir on a larger one) and run the same command again: it resumes from "
            f"{_newest_complete(folder.parent, _family(folder.name)) or 'the start (no checkpoint is complete yet)'}."
        ) from error

    def publish():
        _replace(partial, folder)
        if keep:
            rotate(folder.parent, keep, _family(folder.name), verified=folder)

    _on_rank0(dist, publish)


def refuse_to_start_over(parent, pattern: str = "*") -> None:
    """A run that starts afresh (resume_from_checkpoint false) into `parent`, which holds an earlier run's
    checkpoints: FileExistsError saying what to do, before anything is overwritten."""
    found = _checkpoints(Path(parent), pattern)
    if found:
        raise FileExistsError(f"{parent} holds the checkpoints of an earlier run ({found[0].name}, ...): resume from "
                              "them (resume_from_checkpoint true), or pass another output_dir, or delete them")


def disk_full(error: BaseException, folder) -> str | None:
    """How `error` (or what it wraps: its causes, a CheckpointException's failures on other ranks) says the disk
    of `folder` is full; None if it does not. errno 28 anywhere counts, and so does a write that stopped short
    ("unexpected pos", torch.save's zip writer) while the disk has less than 64 MiB free."""
    seen, pending, short_write = set(), [(error, None)], None
    while pending:
        exc, rank = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        pending.extend([(exc.__cause__, rank), (exc.__context__, rank)])
        failures = getattr(exc, "failures", None)  # torch.distributed.checkpoint's CheckpointException: by rank
        if isinstance(failures, dict):
            pending.extend((wrapped[0], r) for r, wrapped in failures.items() if isinstance(wrapped, tuple))
            continue
        where = f" on rank {rank}" if rank is not None else ""
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc):
            return f"errno 28, No space left on device{where}"
        if short_write is None and "unexpected pos" in str(exc):
            short_write = f"a write stopped short{where}: {str(exc).strip().splitlines()[-1][:120]}"
    if short_write is not None:
        existing = next(p for p in [Path(folder), *Path(folder).parents] if p.exists())
        free = shutil.disk_usage(existing).free
        if free < 64 * 2**20:
            return f"{short_write}, with {free / 2**20:.1f} MiB free"
    return None


def seal(folder, metadata: dict | None = None, *, no_dist: bool = False) -> Path:
    """Precondition: `folder` is completely written and nothing writes to it any more.

    Fsync every file in it and write its manifest last, in place: for checkpoints other code wrote
    (HF Trainer, DeepSpeed, a folder about to be reported to Ray Train). Returns `folder`.
    """
    folder = Path(folder)
    _seal(folder, metadata, _dist(no_dist))
    return folder


def _seal(folder: Path, metadata: dict | None, dist) -> None:
    text_of_metadata = json.dumps(metadata or {})  # not JSON: fail before any work
    if dist is not None:
        dist.barrier()  # every rank has written its files (an HF Trainer's rng_state_N.pth) before rank 0 lists them
    names = _on_rank0(dist, lambda: _files(folder))
    described = _each_rank_takes_a_share(dist, names, lambda name: _describe(folder / name, fsync=True))
    failed = {name: entry for name, entry in described.items() if "error" in entry}
    if failed:
        raise CheckpointError(f"cannot seal {folder}: " + "; ".join(f"{n}: {e['error']}" for n, e in failed.items()))

    def write_manifest():
        manifest = {"format": 1, "checksum": "crc32", "files": described, "metadata": json.loads(text_of_metadata)}
        partial = folder / (MANIFEST + ".tmp")
        with open(partial, "w") as f:
            f.write(json.dumps(manifest, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, folder / MANIFEST)
        _fsync_dir(folder)

    _on_rank0(dist, write_manifest)


def _replace(partial: Path, folder: Path) -> None:
    """Rename the sealed `partial` to `folder`; an existing `folder` is moved aside first, deleted last."""
    old = folder.with_name(folder.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if folder.exists():
        os.rename(folder, old)
    os.rename(partial, folder)
    _fsync_dir(folder.parent)
    if old.exists():
        shutil.rmtree(old)


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------
def verify(folder) -> dict:
    """Check every file of `folder` against its manifest (this process alone); return the metadata.

    Raises CheckpointError naming the folder, what is wrong, and what to do.
    """
    folder = Path(folder)
    manifest, problem = _read_manifest(folder)
    if problem is None:
        problem = _first_problem({name: _problem(folder, name, entry) for name, entry in manifest["files"].items()})
    if problem is not None:
        raise CheckpointError(_unusable(folder, problem))
    return manifest["metadata"]


def read_metadata(folder) -> dict:
    """The metadata stored when `folder` was sealed (its files are not checked: see `verify`)."""
    manifest, problem = _read_manifest(Path(folder))
    if problem is not None:
        raise CheckpointError(_unusable(Path(folder), problem))
    return manifest["metadata"]


def newest_verified(parent, pattern: str = "*", *, no_dist: bool = False, where=None) -> Path | None:
    """The newest folder in `parent` matching `pattern` whose files all match its manifest; None if there is none.

    Checkpoints are ordered by the numbers in their names (step_N, checkpoint-N, dates). A newer one that
    fails is reported on stderr with the reason; if some exist and none verifies, CheckpointError.
    where: only checkpoints whose metadata it accepts count (e.g. training states, not a final model beside them).
    """
    dist = _dist(no_dist)
    parent = Path(parent)

    def listing():
        found = _checkpoints(parent, pattern)
        if where is not None:
            found = [f for f in found if (m := _read_manifest(f)[0]) is None or where(m["metadata"])]
        return found, _unfinished(parent, pattern)

    candidates, unfinished = _on_rank0(dist, listing)
    if unfinished:
        _say(dist, f"ignoring unfinished saves in {parent}: {', '.join(p.name for p in unfinished)}")
    rejected = []
    for folder in candidates:
        manifest, problem = _on_rank0(dist, lambda: _read_manifest(folder))
        if problem is None:
            problems = _each_rank_takes_a_share(
                dist, sorted(manifest["files"]), lambda name: _problem(folder, name, manifest["files"][name]))
            problem = _first_problem(problems)
        if problem is None:
            for bad, why in rejected:
                _say(dist, f"checkpoint {bad} is not usable: {why}; using {folder} instead")
            return folder
        rejected.append((folder, problem))
    if rejected:
        raise CheckpointError(f"no usable checkpoint in {parent}:\n" + "\n".join(
            f"  {bad}: {why}" for bad, why in rejected) + "\nWhat to do: restore one of them from a copy, or delete "
            "them to start from scratch (or start fresh without resuming).")
    return None


def check_resumed_loss(loss: float, resumed_from) -> None:
    """Stop a run resumed from `resumed_from` (None: not resumed) whose first loss is not finite."""
    if resumed_from is not None and not math.isfinite(float(loss)):
        raise CheckpointError(
            f"the first loss after resuming from {resumed_from} is {float(loss)}: its files match their checksums, "
            f"so its weights or optimizer state were already broken when it was saved. What to do: delete "
            f"{resumed_from} to resume from the checkpoint before it, or start fresh without resuming.")


# --------------------------------------------------------------------------------------------------
# Rotation
# --------------------------------------------------------------------------------------------------
def rotate(parent, keep: int, pattern: str = "*", *, keep_also=(), verified=None) -> list[Path]:
    """Delete all but the newest `keep` checkpoints in `parent` matching `pattern`, and unfinished saves.

    Never deletes the newest verified checkpoint, nor a folder in `keep_also` (e.g. the best one).
    `verified`: a folder known good (just sealed); only newer ones are checked. One process calls this.
    """
    parent = Path(parent)
    newest_first = _checkpoints(parent, pattern)
    spared = set(newest_first[:keep]) | {Path(p) for p in keep_also if p}
    for folder in newest_first:
        if folder == (Path(verified) if verified else None) or _verifies(folder):
            spared.add(folder)
            break
    deleted = [folder for folder in newest_first if folder not in spared] + _unfinished(parent, pattern)
    for folder in deleted:
        shutil.rmtree(folder, ignore_errors=True)
    return deleted


# --------------------------------------------------------------------------------------------------
# HF Trainer (and TRL, DeepSpeed through the Trainer)
# --------------------------------------------------------------------------------------------------
def trainer_callback():
    """A transformers TrainerCallback that seals every `checkpoint-N` the Trainer saves, on every rank.

    It takes over the Trainer's rotation (`save_total_limit`, the best checkpoint kept) so that the newest
    verified checkpoint is never deleted, and stops a resumed run whose first logged loss is not finite.
    Resume with `trainer.train(resume_from_checkpoint=newest_verified(output_dir, "checkpoint-*"))`.
    """
    from transformers import TrainerCallback

    class SealCheckpoints(TrainerCallback):
        keep, resumed_from, nan_filter = None, None, None

        def on_train_begin(self, args, state, control, **kwargs):
            if args.save_total_limit is not None:
                self.keep, args.save_total_limit = args.save_total_limit, None
            if state.global_step:
                self.resumed_from = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                # the Trainer would log a NaN loss as the mean of the finite ones: not until the first log
                self.nan_filter, args.logging_nan_inf_filter = args.logging_nan_inf_filter, False

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.resumed_from is not None and "loss" in (logs or {}):
                args.logging_nan_inf_filter = self.nan_filter
                check_resumed_loss(logs["loss"], self.resumed_from)
                self.resumed_from = None

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if (dist := _dist(False)) is not None:
                dist.barrier()  # what other callbacks write from one rank (an adapter file) is in place
            _refuse_a_checkpoint_without_weights(folder)
            folder = seal(folder, {"global_step": state.global_step})
            if self.keep:
                _on_rank0(_dist(False), lambda: rotate(folder.parent, self.keep, "checkpoint-*",
                                                       keep_also=[state.best_model_checkpoint], verified=folder))

    return SealCheckpoints()


# --------------------------------------------------------------------------------------------------
# Internals
# --------------------------------------------------------------------------------------------------
def _refuse_a_checkpoint_without_weights(folder: Path) -> None:
    """An FSDP checkpoint of a PEFT model can hold no weights at all: accelerate (1.15) saves its sharded state by
    asking PEFT for the adapter of the sharded model and writes the empty answer. Sealing it would let a resumed run
    put the optimizer of step N onto the initial adapter, silently; stop the run at its first save instead."""
    sharded = sorted(folder.glob("pytorch_model_fsdp_*/.metadata"))
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*model*.bin"))  # not training_args.bin
    if not sharded or has_weights:
        return
    from torch.distributed.checkpoint import FileSystemReader

    empty = [m.parent.name for m in sharded if not FileSystemReader(str(m.parent)).read_metadata().state_dict_metadata]
    if empty:
        raise CheckpointError(
            f"{folder}: {', '.join(empty)} holds no tensors (FSDP's sharded checkpoint of a PEFT model), and no other "
            "file of the checkpoint holds weights: resuming from it would restart the adapter from its first values. "
            "Write the adapter into each checkpoint before it is sealed (a TrainerCallback whose on_save gathers it "
            "with get_model_state_dict(..., full_state_dict=True, ignore_frozen_params=True), as "
            "notebooks/trl/fsdp_gpt_oss_120b.ipynb does), and load it back before trainer.train(resume_from_checkpoint=...).")


def _dist(no_dist: bool):
    """torch.distributed if a process group is up (without importing torch when nothing did)."""
    dist = None if no_dist else sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def _on_rank0(dist, action):
    """Run `action` on rank 0 only; every rank returns its result (or raises its error). Also a barrier."""
    if dist is None:
        return action()
    outcome, failure = [None], None
    if dist.get_rank() == 0:
        try:
            outcome = [("ok", action())]
        except Exception as error:  # noqa: BLE001 - raised on every rank below
            outcome, failure = [("error", f"{type(error).__name__}: {error}")], error
    dist.broadcast_object_list(outcome, src=0)
    status, value = outcome[0]
    if failure is not None:
        raise failure
    if status == "error":
        raise CheckpointError(f"rank 0 failed: {value}")
    return value


def _each_rank_takes_a_share(dist, names: list[str], work) -> dict:
    """{name: work(name)}, the names split over the ranks (every rank gets the whole dict)."""
    if dist is None:
        return {name: work(name) for name in names}
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = [None] * world
    dist.all_gather_object(everyone, {name: work(name) for name in names[rank::world]})
    return {name: value for share in everyone for name, value in share.items()}


def _say(dist, message: str) -> None:
    if dist is None or dist.get_rank() == 0:
        print(message, file=sys.stderr, flush=True)


def _files(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST, MANIFEST + ".tmp"))


def _describe(path: Path, fsync: bool) -> dict:
    crc, size = 0, 0
    try:
        with open(path, "rb", buffering=0) as f:
            buffer = bytearray(_CHUNK)
            view = memoryview(buffer)
            while n := f.readinto(buffer):
                crc, size = zlib.crc32(view[:n], crc), size + n
            if fsync:
                os.fsync(f.fileno())
    except OSError as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"bytes": size, "crc32": f"{crc:08x}"}


def _problem(folder: Path, name: str, expected: dict) -> str | None:
    if not (folder / name).is_file():
        return f"{name} is missing"
    found = _describe(folder / name, fsync=False)
    if "error" in found:
        return f"{name} cannot be read ({found['error']})"
    if found["bytes"] != expected["bytes"]:
        cut = " (truncated)" if found["bytes"] < expected["bytes"] else ""
        return f"{name} is {found['bytes']} bytes, its manifest says {expected['bytes']}{cut}"
    if found["crc32"] != expected["crc32"]:
        return f"{name} does not match its checksum (corrupted or changed after it was written)"
    return None


def _first_problem(problems: dict) -> str | None:
    found = [problem for _, problem in sorted(problems.items()) if problem]
    return None if not found else found[0] + (f" (and {len(found) - 1} more files)" if len(found) > 1 else "")


def _read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"it has no {MANIFEST}: its save did not finish, or nothing sealed it"
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("checksum") != "crc32" or not isinstance(manifest.get("files"), dict):
            return None, f"its {MANIFEST} is not one this version reads"
    except (OSError, ValueError) as error:
        return None, f"its {MANIFEST} cannot be read ({type(error).__name__}: {error})"
    return manifest, None


def _unusable(folder: Path, problem: str) -> str:
    return (f"checkpoint {folder} cannot be used: {problem}. What to do: delete {folder} (resuming then takes the "
            "checkpoint before it, or starts fresh), or restore it from a copy.")


def _newest_complete(parent: Path, pattern: str) -> Path | None:
    """The newest checkpoint with a manifest (its files are not checked: a resume verifies them)."""
    return next((p for p in _checkpoints(parent, pattern) if _read_manifest(p)[1] is None), None)


def _verifies(folder: Path) -> bool:
    try:
        verify(folder)
        return True
    except CheckpointError:
        return False


def _order(folder: Path):
    return tuple(int(n) for n in re.findall(r"\d+", folder.name)), folder.name


def _checkpoints(parent: Path, pattern: str) -> list[Path]:
    """Finished-looking checkpoint folders, newest first."""
    if not parent.is_dir():
        return []
    found = [p for p in parent.glob(pattern) if p.is_dir() and not p.name.endswith(_UNFINISHED)]
    return sorted(found, key=_order, reverse=True)


def _unfinished(parent: Path, pattern: str) -> list[Path]:
    if not parent.is_dir():
        return []
    return sorted(p for suffix in _UNFINISHED for p in parent.glob(pattern + suffix) if p.is_dir())


def _family(name: str) -> str:
    """The glob of checkpoints named like `name`: step_0012 -> step_*, checkpoint-40 -> checkpoint-*."""
    return re.sub(r"\d+", "*", name)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

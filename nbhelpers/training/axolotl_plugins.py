"""Axolotl plugins the Axolotl notebook adds to any config it trains, for two promises Axolotl alone does not keep.

    plugins:
      - nbhelpers.training.axolotl_plugins.SealCheckpoints
      - nbhelpers.training.axolotl_plugins.Reproducible

- SealCheckpoints: Axolotl's Trainer writes `checkpoint-N` folders in place, and `auto_resume_from_checkpoints`
  takes the highest N, complete or not. This plugin gives each checkpoint its manifest (each file's size and
  checksum, written last: nbhelpers.training.checkpoints) once the Trainer has saved it; resume from
  `checkpoints.newest_verified(output_dir, "checkpoint-*")`, passed as `resume_from_checkpoint`.
- Reproducible: Axolotl seeds only its Trainer, which is made after the model and its LoRA adapters, so every run
  starts from other random adapter weights whatever `seed` says; and with sample packing each epoch's batches come
  from a permutation drawn from the global random state at the moment they are made, so a run resumed mid-epoch
  skips into another order than the one it was trained on (both seen on CPU, 2026-12-01: two runs of one config
  differed from their first gradient, and a resumed run from its first step). This plugin seeds PyTorch with `seed`
  right before the adapters are made, and draws each epoch's permutation from `seed + epoch`.

Precondition: nbhelpers is importable where Axolotl trains (installed, or on PYTHONPATH).
"""
import torch
from axolotl.integrations.base import BasePlugin
from transformers import set_seed

from nbhelpers.training import checkpoints


class SealCheckpoints(BasePlugin):
    """Adds nbhelpers.training.checkpoints.trainer_callback() to the Trainer (it also takes over `save_total_limit`)."""

    def add_callbacks_pre_trainer(self, cfg, model):
        return [checkpoints.trainer_callback()]


class Reproducible(BasePlugin):
    """`seed` decides the LoRA adapters' initial weights and the order of each epoch's packed batches."""

    def pre_model_load(self, cfg):
        if cfg.seed is not None:
            seed_packed_batches(cfg.seed)

    def pre_lora_load(self, cfg, model):
        if cfg.seed is not None:
            set_seed(cfg.seed)


def seed_packed_batches(seed: int) -> None:
    """Each epoch's packed batches come from the permutation of `seed + epoch`, however often they are made."""
    from axolotl.utils.samplers.multipack import MultipackBatchSampler
    from torch.utils.data import RandomSampler

    make = MultipackBatchSampler.generate_batches
    if getattr(make, "_seeded", False):
        return

    def generate_batches(self, set_stats=False):
        if self._batches is None and isinstance(self.sampler, RandomSampler):
            self.sampler.generator = torch.Generator().manual_seed(seed + self.epoch)
        return make(self, set_stats)

    generate_batches._seeded = True
    MultipackBatchSampler.generate_batches = generate_batches

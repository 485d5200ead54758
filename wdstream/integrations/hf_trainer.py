"""Hugging Face ``Trainer`` (and TRL's): ``use_loader(trainer, loader)`` makes a trainer train
from a ``wdstream.DataLoader``, write each rank's loader state into every checkpoint and load
it back on ``resume_from_checkpoint`` (no replay of the batches trained on). See
docs/hf-trainer.md."""

from __future__ import annotations

import math
import os

from wdstream.integrations.accelerate import prepare_loader
from wdstream.integrations.checkpoint import load_loader_state, save_loader_state
from wdstream.stream.load.loader import DataLoader


def use_loader(trainer, loader):
    """Make ``trainer`` train from ``loader`` and checkpoint and resume its state; returns
    ``trainer``.

    Args:
        trainer (transformers.Trainer): a Hugging Face ``Trainer`` (or a TRL trainer).
        loader (wdstream.DataLoader | dataset): the loader to train from; a dataset gets a
            ``wdstream.DataLoader`` with the trainer's batch size, workers and collator.
    """
    import transformers

    args = trainer.args
    if not isinstance(loader, DataLoader):
        loader = DataLoader(loader, batch_size=args.per_device_train_batch_size,
                            num_workers=args.dataloader_num_workers,
                            collate_fn=trainer.data_collator)
    unknown = _unknown_length(loader)
    if args.max_steps <= 0 and unknown:
        raise ValueError(f"the loader's length is unknown ({unknown}): set max_steps in the "
                         "training arguments")
    args.ignore_data_skip = True
    trainer.wdstream_loader = loader
    trainer.get_train_dataloader = lambda: _passes_if(
        bool(unknown), prepare_loader(trainer.accelerator, loader))
    trainer.add_callback(_SaveLoaderState(loader))
    train = trainer.train

    def train_resuming_the_loader(resume_from_checkpoint=None, *rest, **kwargs):
        folder = resume_from_checkpoint
        if folder is True:
            folder = transformers.trainer_utils.get_last_checkpoint(args.output_dir)
        if isinstance(folder, str | os.PathLike):
            load_loader_state(loader, folder)
        return train(resume_from_checkpoint, *rest, **kwargs)

    trainer.train = train_resuming_the_loader
    return trainer


def _unknown_length(loader) -> str:
    """Why ``loader``'s length is unknown ('': it is known)."""
    try:
        len(loader)
    except TypeError as error:
        return str(error)
    return ""


def _passes_if(unsized: bool, loader):
    return Passes(loader) if unsized else loader


class Passes:
    """A loader of unknown length as the Trainer sees it: one epoch that never ends, each pass
    over the data followed by the next. Each rank's passes end at a step of its own; were the
    Trainer to end an epoch on one rank only, that rank's collectives (the loss's all-reduce,
    the epoch's end) would not match the others'. The loader's own epochs and state go on
    as without it; every other attribute is the loader's."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        while True:
            delivered = False
            for batch in self.loader:
                delivered = True
                yield batch
            if not delivered:  # a pass with no batch: the data holds none
                return

    def __getattr__(self, name: str):
        return getattr(self.loader, name)


def steps(loader, epochs: float = 1.0, gradient_accumulation_steps: int = 1) -> int:
    """The optimizer steps of ``epochs`` epochs of ``loader``, as the Trainer counts them: for
    trainers that want ``max_steps`` before they see the loader."""
    per_epoch = max(1, math.ceil(len(loader) / gradient_accumulation_steps))
    return math.ceil(epochs * per_epoch)


def _SaveLoaderState(loader):  # builds the callback class on the import
    import transformers

    class SaveLoaderState(transformers.TrainerCallback):
        """Writes each rank's loader state into each checkpoint folder."""

        def on_save(self, args, state, control, **kwargs):
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)  # made by rank 0, maybe not yet seen here
            save_loader_state(loader, folder)
            return control

    return SaveLoaderState()

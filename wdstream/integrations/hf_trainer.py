"""Hugging Face ``Trainer`` (and TRL's trainers, built on it) training from a wdstream loader.

``use_loader(trainer, loader)`` sets up a trainer instance -- no subclass -- so that:

- it trains from ``loader`` (a ``wdstream.DataLoader``, or a wdstream dataset, for which a
  loader is built with the trainer's batch size, worker count and data collator), prepared by
  the trainer's ``Accelerator`` (kept as it is, batches moved to the device);
- every checkpoint folder gets the loader's state, one file per rank
  (``wdstream_loader-rank{R}.json``, see ``wdstream.integrations.checkpoint``);
- ``trainer.train(resume_from_checkpoint=...)`` (a folder, or ``True`` for the last one) loads
  each rank's state (rank 0's on another world size) before training, and
  ``ignore_data_skip`` is set: the loader
  continues where the checkpoint was taken instead of the Trainer replaying the epoch's
  batches to skip them;
- without ``max_steps``, the Trainer derives the steps from ``len(loader)`` and
  ``num_train_epochs`` (a loader without a known length needs ``max_steps``; refused here).
"""

from __future__ import annotations

import math
import os

from wdstream.integrations.checkpoint import load_loader_state, save_loader_state
from wdstream.stream.loader import DataLoader


def use_loader(trainer, loader):
    """Make ``trainer`` train from ``loader`` and checkpoint and resume its state; returns
    ``trainer``."""
    import transformers

    args = trainer.args
    if not isinstance(loader, DataLoader):
        loader = DataLoader(loader, batch_size=args.per_device_train_batch_size,
                            num_workers=args.dataloader_num_workers,
                            collate_fn=trainer.data_collator)
    if args.max_steps <= 0:
        try:
            len(loader)
        except TypeError as error:
            raise ValueError(f"the loader's length is unknown ({error}): set max_steps in the "
                             "training arguments") from None
    args.ignore_data_skip = True
    trainer.wdstream_loader = loader
    trainer.get_train_dataloader = lambda: trainer.accelerator.prepare(loader)
    trainer.add_callback(_SaveLoaderState(loader, transformers.TrainerCallback))
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


def steps(loader, epochs: float = 1.0, gradient_accumulation_steps: int = 1) -> int:
    """The optimizer steps of ``epochs`` epochs of ``loader``, as the Trainer counts them: for
    trainers that want ``max_steps`` before they see the loader."""
    per_epoch = max(1, math.ceil(len(loader) / gradient_accumulation_steps))
    return math.ceil(epochs * per_epoch)


def _SaveLoaderState(loader, base):  # builds the callback class on the import
    class SaveLoaderState(base):
        """Writes each rank's loader state into each checkpoint folder."""

        def on_save(self, args, state, control, **kwargs):
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)  # made by rank 0, maybe not yet seen here
            save_loader_state(loader, folder)
            return control

    return SaveLoaderState()

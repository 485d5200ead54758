"""Hugging Face Accelerate: ``prepare_loader(accelerator, loader)`` sets a
``wdstream.DataLoader`` up as ``accelerator.prepare`` sets up a torch one: batches moved to the
accelerator's device, each rank's loader state saved and loaded by ``save_state`` /
``load_state``. The loader is not rebuilt (it already gives each rank its share);
``split_batches=True`` is refused. See docs/accelerate.md."""

from __future__ import annotations

import logging
import weakref

from wdstream.errors import OptionError
from wdstream.integrations.checkpoint import load_loader_state, save_loader_state

log = logging.getLogger(__name__)

# per accelerator, the loaders whose checkpoint hooks it holds (each registered once)
_HOOKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class DevicePlacement:
    """Moves a batch's tensors to ``device`` (other values pass through)."""

    def __init__(self, device, non_blocking: bool = False):
        self.device = device
        self.non_blocking = non_blocking

    def __call__(self, batch):
        from accelerate.utils import send_to_device

        return send_to_device(batch, self.device, non_blocking=self.non_blocking)


def prepare_loader(accelerator, loader, device_placement: bool | None = None):
    """Set ``loader`` up for ``accelerator`` and return it (the same object).

    Args:
        accelerator (accelerate.Accelerator): the accelerator that trains; its
            ``split_batches`` must be off (a wdstream ``batch_size`` is per rank already).
        loader (wdstream.DataLoader): the loader to train from. Calling this again (for
            instance once per ``Trainer.train``) registers its checkpoint hooks once.
        device_placement (bool | None): move each batch's tensors to ``accelerator.device``;
            None follows ``accelerator.device_placement``, as ``accelerator.prepare`` does.
    """
    if accelerator.split_batches:
        raise OptionError("Accelerator(split_batches=True) cannot split a wdstream.DataLoader's "
                          "batches: its batch_size is per rank already. Build it with "
                          "batch_size=global_batch // num_processes and leave split_batches off")
    if accelerator.dispatch_batches:
        log.info("dispatch_batches: each rank reads its own share of the wdstream loader's "
                 "batches, as many as dispatching would give it")
    if device_placement is None:
        device_placement = accelerator.device_placement
    loader.place_batches(DevicePlacement(accelerator.device, accelerator.non_blocking)
                         if device_placement else None)
    accelerator.prepare_data_loader(loader)  # lists it among its loaders, returns it as it is
    hooked = _HOOKED.setdefault(accelerator, weakref.WeakSet())
    if loader not in hooked:
        hooked.add(loader)
        accelerator.register_save_state_pre_hook(
            lambda _models, _weights, folder: save_loader_state(loader, folder))
        accelerator.register_load_state_pre_hook(
            lambda _models, folder: load_loader_state(loader, folder))
    return loader

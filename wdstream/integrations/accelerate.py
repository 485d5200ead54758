"""Hugging Face Accelerate: ``accelerator.prepare(..., loader)`` keeps a ``wdstream.DataLoader``
as it is (it already gives each rank its share), and ``adopt`` sets it up as ``prepare``
would: batches moved to the device, each rank's loader state saved and loaded by
``save_state`` / ``load_state``. ``split_batches=True`` is refused. See docs/accelerate.md."""

from __future__ import annotations

import logging

from wdstream.integrations.checkpoint import load_loader_state, save_loader_state

log = logging.getLogger(__name__)


class DevicePlacement:
    """Moves a batch's tensors to ``device`` (other values pass through)."""

    def __init__(self, device, non_blocking: bool = False):
        self.device = device
        self.non_blocking = non_blocking

    def __call__(self, batch):
        from accelerate.utils import send_to_device

        return send_to_device(batch, self.device, non_blocking=self.non_blocking)


def adopt(loader, frame=None) -> None:
    """Set ``loader`` up for the ``Accelerator`` preparing it: the accelerator is found in the
    calling frame of ``Accelerator.prepare_data_loader`` (``frame``); without one, the device
    of Accelerate's process state is used."""
    import accelerate

    accelerator = frame.f_locals.get("self") if frame is not None else None
    if not isinstance(accelerator, accelerate.Accelerator):
        loader._placement = DevicePlacement(accelerate.PartialState().device)
        return
    if accelerator.split_batches:
        raise ValueError("Accelerator(split_batches=True) cannot split a wdstream.DataLoader's "
                         "batches: its batch_size is per rank already. Build it with "
                         "batch_size=global_batch // num_processes and leave split_batches off")
    if accelerator.dispatch_batches:
        log.info("dispatch_batches: each rank reads its own share of the wdstream loader's "
                 "batches, as many as dispatching would give it")
    placement = frame.f_locals.get("device_placement")
    if placement is None:
        placement = accelerator.device_placement
    loader._placement = DevicePlacement(accelerator.device, accelerator.non_blocking) \
        if placement else None
    if getattr(loader, "_accelerator_hooks", None) is not accelerator:
        loader._accelerator_hooks = accelerator
        accelerator.register_save_state_pre_hook(
            lambda _models, _weights, folder: save_loader_state(loader, folder))
        accelerator.register_load_state_pre_hook(
            lambda _models, folder: load_loader_state(loader, folder))

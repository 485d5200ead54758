"""The checks of ``wdstream.DataLoader``'s arguments, made when it is built: torch's arguments
that would break the plan, the order or resume are refused with a reason."""

from __future__ import annotations

from wdstream import options
from wdstream.errors import OptionError, OptionTypeError
from wdstream.stream.contract import Trackable


def check_loader_options(dataset, batch_size, num_workers, collate_fn, drop_last,
                         persistent_workers, bytes_as, tune_malloc, kwargs) -> None:
    owner = "DataLoader"
    if not isinstance(dataset, Trackable):
        raise OptionTypeError("DataLoader: needs a wdstream.StreamingDataset or a stage built "
                              f"on one (Mix, PackedSequences), not {type(dataset).__name__}")
    options.integer(owner, "batch_size", batch_size, minimum=1, allow_none=True)
    options.integer(owner, "num_workers", num_workers, minimum=0)
    options.function(owner, "collate_fn", collate_fn)
    options.boolean(owner, "drop_last", drop_last)
    options.choice(owner, "bytes_as", bytes_as)
    options.boolean(owner, "tune_malloc", tune_malloc)
    if persistent_workers:
        raise OptionError("DataLoader: persistent_workers=True is not supported: every epoch's "
                          "plan and resume position are handed to freshly started workers")
    if kwargs.get("in_order") is False:
        raise OptionError("DataLoader: in_order=False would make the batch order, and so "
                          "resume, non-deterministic")
    if kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
        raise OptionError("DataLoader: the epoch plan decides the order; samplers do not apply")
    if kwargs.get("shuffle"):
        raise OptionError("DataLoader: shuffle=True does not apply; the dataset's shuffle and "
                          "seed decide the order")
    if kwargs.get("prefetch_factor") is not None:
        options.integer(owner, "prefetch_factor", kwargs["prefetch_factor"], minimum=1)
        if num_workers == 0:
            raise OptionError("DataLoader: prefetch_factor needs num_workers > 0")
    if "timeout" in kwargs:
        options.number(owner, "timeout", kwargs["timeout"])

"""Checks of the options a user passes to ``StreamingDataset``, ``DataLoader``, ``Mix``,
``PackedSequences`` and ``wdstream pack``, made when the object is built: a refused value
raises ``OptionError`` (or ``OptionTypeError``) naming the option and what it accepts.
``CHOICES`` is the one table of options that take one of a few values."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Literal, overload

from wdstream.errors import OptionError, OptionTypeError

# decode= names, as webdataset's ImageHandler names them: (PIL mode or None, output, dtype)
IMAGE_MODES = {
    "pil": (None, "pil", None),
    "pill": ("L", "pil", None), "pilrgb": ("RGB", "pil", None), "pilrgba": ("RGBA", "pil", None),
    "l8": ("L", "numpy", "uint8"), "rgb8": ("RGB", "numpy", "uint8"),
    "rgba8": ("RGBA", "numpy", "uint8"),
    "l": ("L", "numpy", "float"), "rgb": ("RGB", "numpy", "float"),
    "rgba": ("RGBA", "numpy", "float"),
    "torchl8": ("L", "torch", "uint8"), "torchrgb8": ("RGB", "torch", "uint8"),
    "torchrgba8": ("RGBA", "torch", "uint8"),
    "torchl": ("L", "torch", "float"), "torchrgb": ("RGB", "torch", "float"),
    "torchrgba": ("RGBA", "torch", "float"), "torch": ("RGB", "torch", "float"),
}

# option -> accepted values, in the order the message lists them
CHOICES: dict[str, tuple] = {
    "opener": ("auto", "cli", "fsspec", "sdk"),
    "on_error": ("raise", "skip"),
    "remainder": ("drop", "pad"),
    "decode": (True, False, *IMAGE_MODES),  # an image mode also decodes images
    "bytes_as": ("bytes", "tensor"),
    "stop": ("first_exhausted", "cycle", "fixed"),
    "long_documents": ("split", "truncate", "drop"),
    "via": ("auto", "cli", "fsspec"),
}


def _same(value, accepted) -> bool:
    # True == 1 and "1" != 1: a value matches only one of its own type
    return type(value) is type(accepted) and value == accepted


def choice(owner: str, name: str, value, accepted: tuple | None = None):
    """``value`` if it is one of ``accepted`` (default: ``CHOICES[name]``)."""
    accepted = CHOICES[name] if accepted is None else accepted
    try:
        if any(_same(value, item) for item in accepted):
            return value
    except Exception:  # a value whose == fails is not one of them
        pass
    listed = ", ".join(repr(item) for item in accepted)
    raise OptionError(f"{owner}: {name}={value!r:.80} is not accepted; use one of {listed}")


@overload
def integer(owner: str, name: str, value, minimum: int | None = None,
            allow_none: Literal[False] = False) -> int: ...
@overload
def integer(owner: str, name: str, value, minimum: int | None = None,
            allow_none: bool = False) -> int | None: ...
def integer(owner: str, name: str, value, minimum: int | None = None,
            allow_none: bool = False) -> int | None:
    """``value`` as an int (not a bool, not a float), at least ``minimum``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionTypeError(f"{owner}: {name} must be an integer"
                              f"{'' if minimum is None else f' >= {minimum}'}"
                              f"{' or None' if allow_none else ''}, not {value!r:.80}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise OptionError(f"{owner}: {name} must be >= {minimum}, not {value}")
    return value


def number(owner: str, name: str, value, minimum: float = 0.0, positive: bool = False) -> float:
    """``value`` as a finite float, at least ``minimum`` (above it when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionTypeError(f"{owner}: {name} must be a number, not {value!r:.80}")
    value = float(value)
    low = value <= minimum if positive else value < minimum
    if not math.isfinite(value) or low:
        bound = f"> {minimum:g}" if positive else f">= {minimum:g}"
        raise OptionError(f"{owner}: {name} must be a finite number {bound}, not {value!r}")
    return value


def boolean(owner: str, name: str, value) -> bool:
    """``value`` if it is True or False (numpy's bools too)."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise OptionTypeError(f"{owner}: {name} must be True or False, not {value!r:.80}")


def function(owner: str, name: str, value) -> Callable | None:
    """``value`` if it is callable or None."""
    if value is None or callable(value):
        return value
    raise OptionTypeError(f"{owner}: {name} must be a callable or None, not "
                          f"{type(value).__name__}")


def mapping(owner: str, name: str, value) -> Mapping | None:
    """``value`` if it is a mapping or None."""
    if value is None or isinstance(value, Mapping):
        return value
    raise OptionTypeError(f"{owner}: {name} must be a dict or None, not "
                          f"{type(value).__name__}")


def loader_arguments(batch_size, num_workers, collate_fn, drop_last, persistent_workers,
                     bytes_as, tune_malloc, kwargs: dict) -> None:
    """``wdstream.DataLoader``'s arguments: torch's arguments that would break the plan, the
    order or resume are refused with a reason."""
    owner = "DataLoader"
    integer(owner, "batch_size", batch_size, minimum=1, allow_none=True)
    integer(owner, "num_workers", num_workers, minimum=0)
    function(owner, "collate_fn", collate_fn)
    boolean(owner, "drop_last", drop_last)
    choice(owner, "bytes_as", bytes_as)
    boolean(owner, "tune_malloc", tune_malloc)
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
        integer(owner, "prefetch_factor", kwargs["prefetch_factor"], minimum=1)
        if num_workers == 0:
            raise OptionError("DataLoader: prefetch_factor needs num_workers > 0")
    if "timeout" in kwargs:
        number(owner, "timeout", kwargs["timeout"])

"""JSON Lines records and JSON members: parsing a line (an object, strict JSON, valid text) and
storing values as JSON that any reader accepts, with errors that name the record."""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable, Sequence

from wdstream.errors import InputError


def _json_default(value):
    """JSON for the Parquet types that json lacks; bytes must go to their own member."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        raise TypeError("holds bytes, which JSON cannot; store it with --field COLUMN=EXT")
    raise TypeError(f"holds a {type(value).__name__}, which JSON cannot")


def to_json(value, where: Callable[[], str]) -> bytes:
    # allow_nan=False: NaN and Infinity are not JSON (strict readers, orjson among them,
    # refuse them), so a record holding one is refused rather than packed unreadable
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          default=_json_default, allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where()}: holds text that is not valid Unicode (a lone "
                         "surrogate)") from None
    except RecursionError:
        raise InputError(f"{where()}: nested too deeply to store as JSON") from None
    except (TypeError, ValueError) as error:
        message = str(error)
        if "Out of range float" in message:
            message = "holds NaN or Infinity, which JSON cannot (they are refused)"
        raise InputError(f"{where()}: {message}") from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (NaN and Infinity are refused)")


# json.loads minus its per-call checks on bytes; NaN and Infinity refused (see to_json)
_decode_json = json.JSONDecoder(parse_constant=_refuse_constant).decode


def parse_json_line(line: bytes, source: str, number: int) -> dict:
    """A JSON Lines record, which must be an object; InputError names the file and line."""
    try:
        value = _decode_json(line.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InputError(f"{source}:{number}: not UTF-8: {error}") from None
    except RecursionError:
        raise InputError(f"{source}:{number}: JSON nested too deeply for this "
                         "reader") from None
    except ValueError as error:
        raise InputError(f"{source}:{number}: malformed JSON: {error}") from None
    if not isinstance(value, dict):
        raise InputError(
            f"{source}:{number}: expected a JSON object, got {type(value).__name__}"
        )
    if not _valid_unicode(line, value):
        raise InputError(f"{source}:{number}: holds a \\u escape of a lone surrogate, "
                         "which is not text (strict JSON readers refuse it)")
    return value


def _valid_unicode(line: bytes, value) -> bool:
    """Whether a parsed line holds only real text: an escaped lone surrogate (``"\\udc80"``)
    parses in Python but cannot be encoded, and strict readers (orjson) refuse it. Only lines
    with a surrogate escape (characters beyond the BMP written as escaped pairs) pay for the
    exact check, which costs a large share of a parse."""
    if b"\\ud" not in line and b"\\uD" not in line:  # nearly every line
        return True
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_text(value, column: str, option: str, where: str) -> InputError:
    """The error for a value to tokenize that is not a string."""
    what = "is null" if value is None else f"holds {type(value).__name__} {value!r:.40}, not text"
    return InputError(f"{where}: column {column!r} {what} (from {option})")


def field_bytes(value, column: str, where: Callable[[], str]) -> bytes:
    if value is None:
        raise InputError(f"{where()}: column {column!r} is null")
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{where()}: column {column!r} holds text that is not valid "
                             "Unicode (a lone surrogate)") from None
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return to_json(value, lambda: f"{where()}: column {column!r}")



def check_json_lines(lines: list[bytes], source: str, numbers: Sequence[int]) -> None:
    """Parse every line; on the first bad one, raise the error that names it."""
    decode = _decode_json
    try:
        for line in lines:
            value = decode(line.decode("utf-8"))
            if type(value) is not dict or not _valid_unicode(line, value):
                raise ValueError
    except (ValueError, RecursionError):  # also UnicodeDecodeError; find the line again
        for line, number in zip(lines, numbers, strict=True):
            parse_json_line(line, source, number)
        raise


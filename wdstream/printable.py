"""Text from storage made safe to show: ``printable`` spells control characters as escapes
(no ANSI escape or forged line reaches a terminal), ``redact`` takes a signed request's
secrets out of every error text and warning (``WdstreamError`` applies it), and
``short_repr`` shows a value read from storage within a bounded length."""

from __future__ import annotations

import re
import reprlib

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped (``keep_newlines``: except ``\\n``,
    for messages that are several lines on purpose)."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char == " " or (keep_newlines and char == "\n"):
            out.append(char)
        elif char in _NAMED:
            out.append(_NAMED[char])
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100
                       else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def printable_json(text: str) -> str:
    """A JSON document with the characters JSON leaves raw (DEL, C1 controls, Unicode format
    characters such as bidirectional overrides) written as ``\\uXXXX`` escapes: the same
    document, safe to print. A lone surrogate (from a name that was not UTF-8) becomes U+FFFD,
    the replacement character, so that the output is valid UTF-8."""
    if text.isprintable():
        return text
    return "".join(_json_char(char) for char in text)


def _json_char(char: str) -> str:
    if char.isprintable() or char in " \n":
        return char
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate (a name that was not UTF-8): no character
        return "\ufffd"
    return f"\\u{code:04x}" if code < 0x10000 else _surrogates(char)


def _surrogates(char: str) -> str:
    code = ord(char) - 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


# Query parameters and header fields whose value is a secret (AWS SigV2/SigV4, GCS V2/V4
# signed URLs, OAuth and SAS tokens), and the fields of S3's SignatureDoesNotMatch reply that
# spell the access key id or the signature.
_SECRET_PARAMETERS = ("X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                      "X-Goog-Signature", "X-Goog-Credential", "GoogleAccessId",
                      "AWSAccessKeyId", "Signature", "Credential", "access_token",
                      "refresh_token", "id_token", "token", "sig")
_SECRET_VALUE = re.compile(
    r"(?i)(?<![\w-])(" + "|".join(map(re.escape, _SECRET_PARAMETERS))
    + r")(\s*(?:=|%3D)\s*|:\s*(?=[^&\s\"'<>,;)]{16}))[^&\s\"'<>,;)]+")  # ": " header-like
_SECRET_ELEMENT = re.compile(
    r"(?i)<(AWSAccessKeyId|SignatureProvided|StringToSign|StringToSignBytes|"
    r"CanonicalRequest|CanonicalRequestBytes|X-Amz-Security-Token)>[^<]*")
REDACTED = "REDACTED"


def redact(text: str) -> str:
    """``text`` with the value of every signed request's secret replaced by ``REDACTED``:
    ``X-Amz-Signature=...``, ``X-Amz-Credential=...``, ``X-Amz-Security-Token=...``,
    ``Signature=...``, ``AWSAccessKeyId=...``, ``X-Goog-Signature=...``,
    ``X-Goog-Credential=...``, ``access_token=...``, ``token=...`` (also URL-encoded,
    ``%3D``), and S3's ``<AWSAccessKeyId>``, ``<SignatureProvided>``, ``<StringToSign>`` and
    ``<CanonicalRequest>`` fields. The rest of a URL stays, so a message still names the
    object."""
    if "=" not in text and "%3" not in text and ":" not in text and "<" not in text:
        return text
    text = _SECRET_VALUE.sub(rf"\1\2{REDACTED}", text)
    return _SECRET_ELEMENT.sub(rf"<\1>{REDACTED}", text)


_SHORT = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 3, 80, 40, 80
_SHORT.maxtuple = _SHORT.maxlist = _SHORT.maxdict = _SHORT.maxset = _SHORT.maxfrozenset = 4


def short_repr(value, limit: int = 200) -> str:
    """``repr(value)`` for a message, escaped and at most ``limit`` characters: containers
    are rendered a few items and levels deep (``reprlib``), so a value that shares its parts
    many times over (YAML aliases) is never expanded whole."""
    text = printable(_SHORT.repr(value))
    return text if len(text) <= limit else text[:limit] + "..."

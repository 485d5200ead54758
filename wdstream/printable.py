"""Text from storage made safe to show on a terminal.

Names and values read from storage (object names, manifest entries, config values) may hold
control characters: an ANSI escape could recolour or rewrite what a terminal shows, a ``\\r`` or
a newline could forge a line of output. ``printable`` spells every such character as an escape
(``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``), the way ``repr`` does, and leaves all other text as it is.
"""

from __future__ import annotations

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

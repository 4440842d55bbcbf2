"""UTF-8 measures of provider text, shared by the assembler and the adapters.

Caps count bytes as they would be sent back (UTF-8), while decoded wire text is ``str``.
``utf8_len`` measures a ``str`` without encoding ASCII text (``isascii()`` is O(1) on
CPython: the string object records it); ``is_utf8`` validates bytes that msgspec skipped
unread (a ``msgspec.Raw`` field), in slices, so no decoded copy of them all is made.
Decoded JSON text never holds a lone surrogate (msgspec rejects one); an engine event
built by hand may, and ``utf8_len`` counts it as the three bytes ``surrogatepass`` gives.
"""

from __future__ import annotations

import codecs

__all__ = ["is_utf8", "utf8_len"]

_SLICE = 1 << 16


def utf8_len(text: str) -> int:
    """The length of ``text`` in UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def is_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8 (checked a slice at a time)."""
    if len(data) <= _SLICE:
        # One slice: a plain decode gives the same verdict at a third of the cost of
        # setting up the incremental decoder (most argument texts are this short).
        try:
            data.decode()
        except UnicodeDecodeError:
            return False
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for start in range(0, len(data), _SLICE):
            decoder.decode(data[start : start + _SLICE])
        decoder.decode(b"", True)
    except UnicodeDecodeError:
        return False
    return True

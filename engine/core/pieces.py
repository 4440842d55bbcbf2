"""Text that arrives in pieces and is joined once: held without a Python object per piece.

Each piece kept apart costs about 57 bytes beside its characters (the ``str`` header
and the list's pointer): text streamed 4 characters at a time was held at 16 to 20
times its size, some 300 MB under the 16 MiB ``max_text_bytes``. Every run of ``RUN``
pieces is therefore joined as it completes, when it is short (``RUN_CHARS``): long
pieces cost little apart, and joined they would be a second copy of text that another
holder (the turn, beside an adapter's check) keeps the same objects of. A piece is
copied into its run once, and once more when the whole text is joined.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

__all__ = ["RUN", "RUN_CHARS", "TextPieces"]

RUN = 64
RUN_CHARS = 16 * 1024


class TextPieces:
    """An append-only text, in joined runs of ``RUN`` pieces and the pieces since."""

    __slots__ = ("_chars", "_pieces", "_runs")

    def __init__(self) -> None:
        self._runs: list[str] = []
        self._pieces: list[str] = []
        self._chars = 0  # of the pieces since the last run

    def add(self, piece: str) -> None:
        pieces = self._pieces
        pieces.append(piece)
        self._chars += len(piece)
        if len(pieces) >= RUN:
            if self._chars <= RUN_CHARS:
                self._runs.append("".join(pieces))
            else:
                self._runs += pieces  # long pieces: kept as they are (see the docstring)
            pieces.clear()
            self._chars = 0

    def __bool__(self) -> bool:
        return bool(self._pieces or self._runs)

    def __len__(self) -> int:
        """How many ``str`` objects hold the text (its runs and the pieces since)."""
        return len(self._runs) + len(self._pieces)

    def __iter__(self) -> Iterator[str]:
        """The text in order, as runs and pieces (to compare it without joining it)."""
        return chain(self._runs, self._pieces)

    def joined(self) -> str:
        if not self._runs:  # (most texts: a short one, or none at all)
            return "".join(self._pieces)
        return "".join(chain(self._runs, self._pieces))

"""Text that arrives in pieces and is joined once: held without a Python object per piece.

Each piece kept apart costs about 57 bytes beside its characters (the ``str`` header
and the list's pointer): text streamed 4 characters at a time was held at 16 to 20
times its size, some 300 MB under the 16 MiB ``max_text_bytes``. Every run of ``RUN``
pieces is therefore joined as it completes; a piece is copied at most once.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

__all__ = ["RUN", "TextPieces"]

RUN = 64


class TextPieces:
    """An append-only text, in joined runs of ``RUN`` pieces and the pieces since."""

    __slots__ = ("_pieces", "_runs")

    def __init__(self) -> None:
        self._runs: list[str] = []
        self._pieces: list[str] = []

    def add(self, piece: str) -> None:
        pieces = self._pieces
        pieces.append(piece)
        if len(pieces) >= RUN:
            self._runs.append("".join(pieces))
            pieces.clear()

    def __bool__(self) -> bool:
        return bool(self._pieces or self._runs)

    def __len__(self) -> int:
        """How many ``str`` objects hold the text (its runs and the pieces since)."""
        return len(self._runs) + len(self._pieces)

    def __iter__(self) -> Iterator[str]:
        """The text in order, as runs and pieces (to compare it without joining it)."""
        return chain(self._runs, self._pieces)

    def joined(self) -> str:
        return "".join(chain(self._runs, self._pieces))

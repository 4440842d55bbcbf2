"""OpenAI Responses: which ``output_text`` parts take their text from a done event.

A part's text normally streams as ``output_text.delta`` events; a part whose text came in
no delta takes it once from a done text (``content_part.done``, ``output_text.done`` or
the part in the message's ``output_item.done``), per part: another part's deltas do not
stop it. That needs the deltas and the done events to name parts alike, which a stream
shows: a delta counts for its part only when it names a message item that
``output_item.added`` announced (by output_index, and by item_id when both give one), and
a part's done text must repeat its deltas. A delta that names no announced part, or a
done text that disagrees with its part's deltas, means the stream indexes parts apart:
from then on no done text is read (doubling a text is worse than dropping a repeat of it).

Owns no engine event: ``openai_responses.py`` emits the text this says to read.
"""

from __future__ import annotations

from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.pieces import TextPieces

__all__ = ["TextParts"]

_Part = tuple[int, int]  # (output_index, content_index)


class TextParts:
    """The text bookkeeping of one Responses stream."""

    __slots__ = ("_messages", "_read", "_streamed", "_unkeyed")

    def __init__(self) -> None:
        # output_index -> item id (or None) of each message item at output_item.added.
        self._messages: dict[int, str | None] = {}
        # Each part's delta texts, to compare with its done text (in joined runs: one
        # object per piece would hold short deltas at many times their size).
        self._streamed: dict[_Part, TextPieces] = {}
        self._read: set[_Part] = set()  # parts whose done text was read
        self._unkeyed = False  # the stream indexes parts apart: no done text is read

    def message(self, output_index: int, item_id: str | None) -> None:
        """A message item announced at output_item.added."""
        self._messages[output_index] = item_id

    def delta(
        self,
        output_index: int | None,
        content_index: int | None,
        item_id: str | None,
        text: str,
    ) -> None:
        """A non-empty text delta; raises when a done text already gave its part's text
        (or, for a delta that names no announced part, any part's)."""
        messages = self._messages
        if output_index is not None and content_index is not None and output_index in messages:
            known = messages[output_index]
            if not item_id or not known or item_id == known:
                part = (output_index, content_index)
                if part in self._read:
                    raise StreamProtocolError("openai_responses: text delta after a done text")
                pieces = self._streamed.get(part)
                if pieces is None:
                    self._streamed[part] = pieces = TextPieces()
                pieces.add(text)
                return
        # A delta that names no announced part: any part's done text could repeat it.
        if self._read:
            raise StreamProtocolError("openai_responses: text delta after a done text")
        self._unkeyed = True

    def done(self, output_index: int, content_index: int, text: object) -> bool:
        """Whether a part's done text is its text (it counts once, and only for a part
        that got no delta). A done text that differs from its part's deltas is not read,
        and stops all later done texts from being read."""
        if self._unkeyed or not isinstance(text, str) or not text:
            return False
        part = (output_index, content_index)
        if part in self._read:
            return False
        pieces = self._streamed.get(part)
        if pieces is not None:
            if not _repeats(pieces, text):
                self._unkeyed = True
            return False
        self._read.add(part)
        return True


def _repeats(pieces: TextPieces, text: str) -> bool:
    """Whether ``text`` is exactly the pieces joined (compared in place, never joined)."""
    at = 0
    for piece in pieces:
        if not text.startswith(piece, at):
            return False
        at += len(piece)
    return at == len(text)

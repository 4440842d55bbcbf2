"""Gemini's unframed text: a raw JSON error body after (or instead of) the SSE frames.

Gemini was seen appending a plain JSON error body (an object, or a list of them, often
pretty-printed, so one line per SSE "event") where frames belong. The lines are held,
under ``max_event_bytes``, until they parse as a body; anything else fails the turn.

Decoding the held text again on every line made a body sent one short line per event
cost O(n^2) time (seconds of a blocked event loop for well under the cap). A body can
only complete on a line that closes a bracket, and past 4 KiB one still open is tried
again only once the held text has doubled since, so holding n bytes costs O(n) decoding;
``finish`` at the stream's end tries what is held one last time.
"""

from __future__ import annotations

import msgspec

from callgate.engine.core.errors import LimitExceeded, StreamProtocolError
from callgate.engine.core.sse import SSEData

from ._gemini_wire import ERROR_DECODER, Error

__all__ = ["UnframedText"]

_CLOSERS = (b"}", b"]")
# Up to this size a body is tried on every line that closes a bracket (a real error body
# is a few hundred bytes: seen at once); past it, only once the held text has doubled.
_EAGER_BYTES = 4 * 1024


class UnframedText:
    """The unframed lines of one stream, and the error bodies they make."""

    __slots__ = ("_held", "_limit", "_nbytes", "_tried_at")

    def __init__(self, max_event_bytes: int) -> None:
        self._limit = max_event_bytes
        self._held: list[bytes] = []
        self._nbytes = 0
        self._tried_at = 0  # the held size at the last attempt that found the body open

    def add(self, data: SSEData) -> list[Error]:
        """One unframed line; the errors of the body it completes, if it completes one."""
        line = bytes(data)  # (rare: a copy costs nothing that matters)
        if not self._held:
            start = line.lstrip()
            if not start:
                return []  # blank lines between frames: nothing held
            if start[:1] not in {b"{", b"["}:
                raise StreamProtocolError("gemini: unframed text that is not a JSON error body")
        self._held.append(line)
        self._nbytes += len(line) + 1
        if self._nbytes > self._limit:
            raise LimitExceeded("max_event_bytes", self._limit, "gemini unframed")
        if not line.rstrip().endswith(_CLOSERS):
            return []
        if self._nbytes > _EAGER_BYTES and self._nbytes < 2 * self._tried_at:
            return []
        return self._body(final=False)

    def finish(self) -> list[Error]:
        """The stream ended: what is held must be a whole body."""
        return self._body(final=True) if self._held else []

    def _body(self, *, final: bool) -> list[Error]:
        text = b"\n".join(self._held)
        try:
            body = ERROR_DECODER.decode(text)
        except msgspec.DecodeError as exc:
            # A pretty-printed body arrives one line per event: wait for the rest.
            if not final and "truncated" in str(exc):
                self._tried_at = self._nbytes
                return []
            raise StreamProtocolError(
                f"gemini: unframed text is not a JSON error body: {exc}"
            ) from None
        self._held.clear()
        self._nbytes = self._tried_at = 0
        bodies = body if isinstance(body, list) else [body]
        errors = [b.error for b in bodies if b.error is not None]
        if not errors or len(errors) != len(bodies):
            raise StreamProtocolError("gemini: unframed JSON that is not an error body")
        return errors

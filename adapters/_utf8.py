"""The adapters' name for the core's UTF-8 measures (``callgate.engine.core.utf8``)."""

from __future__ import annotations

from callgate.engine.core.utf8 import is_utf8, utf8_len

__all__ = ["is_utf8", "utf8_len"]

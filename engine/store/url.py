"""Store URLs: ``open_store(url)`` picks and configures a backend; it does not connect.

Accepted forms:
- ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (three slashes, then
  the path: the SQLAlchemy convention), also ``sqlite:///~/x.db``; one option,
  ``?synchronous=NORMAL`` (default FULL: see SQLiteStore for the durability trade-off);
- ``postgresql://user:pass@host:port/db`` (or ``postgres://``), optionally with
  ``?schema=name`` to keep callgate's tables in their own PostgreSQL schema; other query
  parameters are passed to asyncpg (e.g. ``sslmode``).
- ``None``: SQLite at ``default_path`` (the caller's choice, e.g. the CLI's data dir).
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from callgate.engine.core.errors import ConfigError

from .base import Store
from .postgres import PostgresStore
from .sqlite import SQLiteStore

__all__ = ["open_store", "redact_url"]

_SYNC_MODES: dict[str, Literal["FULL", "NORMAL", "EXTRA"]] = {
    "FULL": "FULL",
    "NORMAL": "NORMAL",
    "EXTRA": "EXTRA",
}


def open_store(url: str | None, *, default_path: str | os.PathLike[str] | None = None) -> Store:
    """A not-yet-started store for ``url``; use ``async with open_store(url) as store``."""
    if url is None:
        if default_path is None:
            raise ConfigError("no store URL and no default SQLite path")
        return SQLiteStore(default_path)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ConfigError(f"SQLite URL must be sqlite:///path, got {redact_url(url)!r}")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        sync = options.pop("synchronous", "FULL").upper()
        if options or sync not in _SYNC_MODES:
            raise ConfigError(f"SQLite URL options: synchronous=FULL|NORMAL|EXTRA, got {url!r}")
        return SQLiteStore(os.path.expanduser(parts.path[1:]), synchronous=_SYNC_MODES[sync])
    if scheme in ("postgresql", "postgres"):
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((v for k, v in query if k == "schema"), None)
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, rest, parts.fragment))
        return PostgresStore(dsn, schema=schema)
    raise ConfigError(f"unknown store URL scheme {parts.scheme!r} (sqlite, postgresql)")


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))

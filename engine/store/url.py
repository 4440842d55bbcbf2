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
import re
from typing import Literal
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

from callgate.engine.core.errors import ConfigError

from .base import Store
from .postgres import PostgresStore
from .sqlite import SQLiteStore

__all__ = ["open_store", "redact_url", "url_secrets"]

UNPARSEABLE = "<unparseable store URL>"
# Query parameters that carry a credential (libpq's names, which asyncpg also reads).
_SECRET_PARAMS = frozenset({"password", "passfile"})
# The userinfo password, found without urlsplit (which refuses some malformed URLs).
_USERINFO_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)@")
# user:password@ up to the last "@": a password with an unencoded "/", "?", "#" or "@"
# ends the authority early for urlsplit (and the pattern above), which then finds no
# password, or half of it, while libpq may still take it whole.
_LOOSE_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^:@/?#]*):(.*)@", re.DOTALL)

_SYNC_MODES: dict[str, Literal["FULL", "NORMAL", "EXTRA"]] = {
    "FULL": "FULL",
    "NORMAL": "NORMAL",
    "EXTRA": "EXTRA",
}


def open_store(
    url: str | None,
    *,
    default_path: str | os.PathLike[str] | None = None,
    migrate: bool = True,
) -> Store:
    """A not-yet-started store for ``url``; use ``async with open_store(url) as store``.
    ``migrate=False``: ``start()`` applies no migration and changes nothing; it refuses a
    database without callgate's schema (``SchemaMissing``) — for read-only commands."""
    if url is None:
        if default_path is None:
            raise ConfigError("no store URL and no default SQLite path")
        return SQLiteStore(default_path, migrate=migrate)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # parsed now, so a bad port is a ConfigError, not later
    except ValueError as exc:
        # The parser's text quotes the piece it choked on: with a userinfo that can be
        # part of a password (an unencoded "?" or "/" in it ends the authority early).
        why = "its authority (user, password, host, port) does not parse" if "@" in url else exc
        raise ConfigError(f"malformed store URL {redact_url(url)!r}: {why}") from None
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ConfigError(f"SQLite URL must be sqlite:///path, got {redact_url(url)!r}")
        if "#" in url:
            raise ConfigError(
                f"SQLite URL must not contain '#' (it would end the path), got {redact_url(url)!r}"
            )
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        sync = options.pop("synchronous", "FULL").upper()
        if options or sync not in _SYNC_MODES:
            raise ConfigError(
                f"SQLite URL options: synchronous=FULL|NORMAL|EXTRA, got {redact_url(url)!r}"
            )
        path = os.path.expanduser(parts.path[1:])
        return SQLiteStore(path, synchronous=_SYNC_MODES[sync], migrate=migrate)
    if scheme in ("postgresql", "postgres"):
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((v for k, v in query if k == "schema"), None)
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, rest, parts.fragment))
        return PostgresStore(dsn, schema=schema, migrate=migrate)
    raise ConfigError(f"unknown store URL scheme {parts.scheme!r} (sqlite, postgresql)")


def _query_secrets(query: str) -> list[str]:
    out = []
    for field in query.split("&"):
        key, sep, value = field.partition("=")
        if sep and value and unquote_plus(key).lower() in _SECRET_PARAMS:
            out.append(value)
    return out


def url_secrets(url: str) -> set[str]:
    """Every spelling (as written, and percent-decoded) of a credential in ``url``: the
    userinfo password and ``password``/``passfile`` query values. Works on malformed URLs
    too, so a message about one can still be scrubbed."""
    raw: list[str] = []
    loose = _LOOSE_USERINFO.match(url)
    if loose and loose.group(3):
        raw.append(loose.group(3))
    match = _USERINFO_PASSWORD.match(url)
    if match:
        _, sep, password = match.group(1).rpartition("@")[2].partition(":")
        if sep and password:
            raw.append(password)
    rest = url.split("#", 1)[0]
    if "?" in rest:
        raw.extend(_query_secrets(rest.split("?", 1)[1]))
    return {s for value in raw for s in (value, unquote_plus(value)) if s}


def _mask_query(query: str) -> str:
    fields = []
    for field in query.split("&"):
        key, sep, _ = field.partition("=")
        secret = sep and unquote_plus(key).lower() in _SECRET_PARAMS
        fields.append(f"{key}=***" if secret else field)
    return "&".join(fields)


def redact_url(url: str) -> str:
    """``url`` with any credential replaced by ``***`` (the userinfo password, and the
    ``password``/``passfile`` query parameters; a fragment too, which no store URL uses),
    for messages and logs. A URL that does not parse is ``<unparseable store URL>``."""
    loose = _LOOSE_USERINFO.match(url)
    if loose and any(c in loose.group(3) for c in "/?#@"):
        # Everything up to the last "@" is masked, whatever a parser makes of it.
        scheme, user = loose.group(1), loose.group(2)
        rest = redact_url(scheme + url[loose.end() :])
        return f"{scheme}{user}:***@{rest[len(scheme) :]}"
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return UNPARSEABLE
    before_fragment, hash_sign, _ = url.partition("#")
    head, question, query = before_fragment.partition("?")
    if password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        head = f"{parts.scheme}://{parts.username or ''}:***@{host}{parts.path}"
    return head + question + _mask_query(query) + ("#***" if hash_sign else "")

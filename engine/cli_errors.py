"""How the store commands (``cli_admin``) turn a refusal into one line on stderr: which
exceptions are refusals and with what exit status, scrubbing the store's credentials out of
a driver's message, and refusing command-line text that is not UTF-8.

It must never print a store URL except through ``redact_url``, nor an argument that could
not be decoded (its bytes may not be printable at all).
"""

from __future__ import annotations

import argparse

from .cli_audit import CliFailure, is_utf8_text
from .core.errors import CallgateError
from .store.errors import StoreUnavailable
from .store.migrations import SchemaMissing
from .store.url import redact_url, url_secrets

__all__ = ["failure_text", "innermost", "refuse_undecodable", "scrub"]

# Paths may hold any bytes the file system allows; every other argument is text that is
# stored, compared or printed, so it must be UTF-8.
_PATH_ARGUMENTS = frozenset({"audit_file"})


# Secrets shorter than this are masked only where they stand as a credential: masked
# everywhere, a one-character password would star out that character all over the
# message (the host address, the already redacted URL), which then says nothing.
_SHORT_SECRET = 4


def scrub(text: str, url: str) -> str:
    """``text`` without the store's credentials, in case a driver quoted the DSN (the
    userinfo password and the ``password``/``passfile`` query values, as written and
    decoded — found even in a URL that does not parse). A secret of fewer than
    ``_SHORT_SECRET`` characters is masked where it is written as one (``:secret@``,
    ``password=secret``, ``passfile=secret``, also quoted); a longer one wherever it
    appears."""
    text = text.replace(url, redact_url(url))
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        if len(secret) >= _SHORT_SECRET:
            text = text.replace(secret, "***")
            continue
        text = text.replace(f":{secret}@", ":***@")
        for key in ("password", "passfile", "PASSWORD", "PASSFILE"):
            # (The conninfo form quotes a value: password='ab'.)
            for quote in ("'", '"', ""):
                text = text.replace(f"{key}={quote}{secret}{quote}", f"{key}={quote}***{quote}")
    return text


def innermost(exc: BaseException) -> BaseException:
    """A task group wraps a single failure in an ExceptionGroup; the failure itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def refuse_undecodable(args: argparse.Namespace, url: str) -> None:
    """``CliFailure`` (status 2) when an argument, or the store URL, holds bytes that are
    not UTF-8 (Python keeps them as lone surrogates, which no store or terminal accepts)."""
    if not is_utf8_text(url):
        raise CliFailure("the store URL is not valid UTF-8", 2)
    for name, value in vars(args).items():
        if isinstance(value, str) and name not in _PATH_ARGUMENTS and not is_utf8_text(value):
            flag = name.replace("_", "-")
            raise CliFailure(f"argument {flag} is not valid UTF-8 text", 2)


def failure_text(exc: BaseException, url: str) -> tuple[int, str] | None:
    """The exit status and message for a refusal; None for a bug (let it propagate)."""
    store = redact_url(url)
    if isinstance(exc, CliFailure):
        return exc.status, str(exc)
    if isinstance(exc, SchemaMissing):
        return 1, (
            f"store {store}: {exc} ({exc.code}); a listing creates nothing: check --store "
            "(or $CALLGATE_STORE)"
        )
    if isinstance(exc, StoreUnavailable):
        return 1, f"store {store}: {exc} ({exc.code})"
    if isinstance(exc, CallgateError):
        code = getattr(exc, "code", None)
        return 1, f"{exc} ({code})" if isinstance(code, str) else str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "asyncpg":
        return 1, "PostgreSQL stores need asyncpg: pip install 'callgate[postgres]'"
    if isinstance(exc, OSError):
        return 1, f"store {store}: {exc}"
    return None

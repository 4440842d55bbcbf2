"""Everything the ``callgate`` command line writes to the operator: the human-readable
lines of stdout and stderr (made safe for a terminal), the ``--json`` documents, and what a
failed write of them means.

It owns:

- ``terminal_text``: the one function every human-readable line passes through. It
  spells out C0 controls (tab and newline included: a line is one line), DEL, C1, the
  line/paragraph separators U+2028/U+2029, the bidi embeddings and overrides
  U+202A-U+202E and isolates U+2066-U+2069 (and lone surrogates, which no terminal
  encoding takes) as ``\\xNN`` / ``\\uNNNN``. Text from outside — a driver's error, an id,
  tenant, tool or reason a host stored, a file name given on the command line — can
  then never move the cursor, clear the screen, reorder what is shown or forge a line.
  ``--json`` output is not passed through it: JSON escapes C0 itself, and a reader of it
  is a program.
- ``say`` / ``say_lines`` / ``say_line`` / ``say_json`` (stdout) and ``warn`` (stderr),
  each flushed at once, so a failed write surfaces where it can still be told apart from
  everything else: as ``OutputFailed``, never as the store's or a file's ``OSError``.
- ``answer_of``: names what a command has recorded before it writes its answer; a failed
  write inside it is ``AnswerLost`` (exit status ``ANSWER_LOST``).
- ``output_failure``: the exit status and the one stderr line for those two.
- ``CliParser``: argparse's own messages (usage, errors quoting an argument) through
  ``terminal_text`` too.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = [
    "ANSWER_LOST",
    "BROKEN_PIPE",
    "UNWRITABLE",
    "AnswerLost",
    "CliParser",
    "OutputFailed",
    "answer_of",
    "output_failure",
    "say",
    "say_json",
    "say_line",
    "say_lines",
    "terminal_text",
    "warn",
]

# A command that recorded something (a decision, a resumed drive) but could not write its
# answer. It must differ from 1 (refused: nothing was done) and 2, so that a script does
# not retry a decision that was in fact taken, nor read the silence as success.
ANSWER_LOST = 4
# A command that changed nothing (a listing, a show, audit verify, decode) and could not
# write its answer: the same status as a closed stdout (``main`` refuses that up front,
# "nothing was done"): the command was run somewhere its answer cannot go. Not 1, which
# says the store or the record refused.
UNWRITABLE = 2
# The reader of stdout went away (``| head``) while a command that changed nothing was
# writing: the shell's own status for a process ended by SIGPIPE; nothing is printed.
BROKEN_PIPE = 141

# No backslash here: stored values are escaped with ``core.audit.escape_controls`` first
# (backslashes doubled there, so its escaping is unambiguous); a whole line is a second,
# idempotent pass that must leave that escaping as it is.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(text: str) -> str:
    """``text`` as one line a terminal shows as it is: every control, separator and bidi
    character (see the module docstring) spelled out as ``\\xNN`` / ``\\uNNNN``."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_spelled, text)


class OutputFailed(Exception):
    """Writing the command's answer to stdout failed (``error``); nothing says what was
    done, so the command changed nothing, or ``answer_of`` turns this into ``AnswerLost``.
    Not an ``OSError``: a failed write must never be mistaken for the store's."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error.strerror or str(error))
        self.error = error


class AnswerLost(Exception):
    """``done`` was recorded, but the answer saying so could not be written (``error``)."""

    def __init__(self, done: str, error: OSError) -> None:
        super().__init__(done)
        self.done = done
        self.error = error


def _write(data: str) -> None:
    stream = sys.stdout
    try:
        stream.write(data)
        stream.flush()  # (a buffered write fails only at the flush: make it fail here)
    except OSError as exc:
        raise OutputFailed(exc) from None


def say_lines(lines: Iterable[str]) -> None:
    """Write ``lines`` to stdout, each through ``terminal_text`` (a newline inside one is
    spelled out, not a line break)."""
    _write("".join(terminal_text(line) + "\n" for line in lines))


def say_line(line: str) -> None:
    """Write one line to stdout (see ``say_lines``)."""
    say_lines([line])


def say(text: str) -> None:
    """Write ``text`` — lines of the CLI's own layout joined by newlines — to stdout, each
    line through ``terminal_text``. Values put into it must already be one line each
    (``escape_controls``): the split keeps only the CLI's own line breaks."""
    say_lines(text.split("\n"))


def say_json(value: Any) -> None:
    """One JSON document on stdout: orjson, unless a value is beyond it (an integer past 64
    bits in a call's arguments): msgspec encodes integers of any size."""
    try:
        data = orjson.dumps(value)
    except TypeError:
        data = msgspec.json.encode(value)
    _write(data.decode() + "\n")


def warn(line: str) -> None:
    """One line on stderr through ``terminal_text``. A failed write of it is dropped: stderr
    is where a failure would be reported, so there is nowhere left to say it; the exit
    status still does."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(terminal_text(line) + "\n")
        stream.flush()
    except OSError:
        pass


@contextmanager
def answer_of(done: str) -> Iterator[None]:
    """The writes of a command's answer once ``done`` (what it recorded, in a few words:
    "approved apr_1 by ann") is durable: a failed write is ``AnswerLost``."""
    try:
        yield
    except OutputFailed as exc:
        raise AnswerLost(done, exc.error) from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered (and the interpreter's final
    flush) must not fail again, nor print an "Exception ignored" traceback at exit."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fileno)
    finally:
        os.close(devnull)


def output_failure(prog: str, exc: OutputFailed | AnswerLost) -> int:
    """The exit status for a failed write of an answer, after its stderr line (none for a
    reader that went away from a command that changed nothing)."""
    _silence_stdout()
    why = exc.error.strerror or type(exc.error).__name__
    if isinstance(exc, AnswerLost):
        warn(
            f"{prog}: {exc.done} was recorded, but its answer could not be written to "
            f"standard output ({why})"
        )
        return ANSWER_LOST
    if isinstance(exc.error, BrokenPipeError) or exc.error.errno == errno.EPIPE:
        return BROKEN_PIPE
    warn(f"{prog}: cannot write the answer to standard output ({why}); nothing was changed")
    return UNWRITABLE


class CliParser(argparse.ArgumentParser):
    """argparse's own output through ``terminal_text``, line by line: its errors quote
    what was typed (``unrecognized arguments: …``), a file name or id pasted from
    elsewhere may hold an escape sequence. Help and usage go to stdout like any answer,
    so a failed write of them is ``OutputFailed`` too."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if not message:
            return
        text = "\n".join(terminal_text(line) for line in message.split("\n"))
        file = file or sys.stderr  # (argparse's own default)
        if file is None:  # (stderr closed)
            return
        if file is sys.stdout:
            _write(text)
        else:
            try:
                file.write(text)
                flush = getattr(file, "flush", None)
                if flush is not None:
                    flush()
            except OSError:
                pass  # (stderr: nowhere left to say it; the exit status still does)

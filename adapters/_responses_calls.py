"""OpenAI Responses: a function call's identity and the terminal event's function calls.

A function call is what its ``output_item.added`` announced: its ``output_item.done``
item, and its item in the terminal event's ``response.output[]`` (``response.completed``
and ``response.incomplete`` carry the full response), must keep its ``call_id``, ``name``
and ``id`` (of the terminal item only the name: compatible servers give it fresh ids).
The terminal output is the response as the server holds it, so it is read against the
stream: a ``function_call`` item in it that no streamed call matches is a
call the turn never received (a protocol error, never a text-only turn), and its
``arguments`` are one more done text of the call (a ``CallDone`` literal), which the
assembler holds to the streamed fragments as it does the other done events. A terminal
literal byte for byte the same as the call's first done literal (as the API sends it)
tells the assembler nothing new, so only a digest of that first literal is kept: the
literal itself would hold a long call's text a second time. (A short literal is its own
fingerprint: kept as it is, it costs less than hashing it.)

Owns no stream state: ``openai_responses.py`` passes the calls it holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import msgspec

from callgate.engine.core.errors import StreamProtocolError
from callgate.engine.core.events import CallDone

from . import _responses_wire as wire

__all__ = ["IDENTITY", "Identity", "digest", "same_call", "terminal_calls"]

# The identity of a function call at output_item.added: (call_id, name, item id).
IDENTITY = ("call_id", "name", "id")
Identity = tuple[str | None, str, str | None]
_READ = (*IDENTITY, "status")  # the members of a terminal function_call item read


# Literals up to this long are their own fingerprint (a digest is 16 bytes, so a short
# literal never equals a long one's digest but by a preimage of BLAKE2b).
_SHORT = 1024
_FUNCTION_CALL = b'"function_call"'


def digest(literal: msgspec.Raw) -> bytes:
    """A done literal's fingerprint: equal fingerprints, byte-identical literals."""
    if len(literal) <= _SHORT:
        return bytes(literal)
    return hashlib.blake2b(literal, digest_size=16).digest()


def same_call(index: int, known: Identity | None, item: Mapping[str, object], where: str) -> None:
    """A function_call item seen ``where`` (output_item.done, the terminal output) is the
    call its output_item.added announced: the echo replays the done item and results
    answer the call_id, so a changed call_id, name or id would send the next request a
    call that was never proposed."""
    if known is None:
        raise StreamProtocolError(
            f"openai_responses: function_call done at output_index {index}, "
            "where no function_call was added"
        )
    if not known[0] and item.get("call_id"):
        # The call was proposed without a call_id (callgate derived one): a call_id now
        # would put another id in the echo than the results answer.
        raise StreamProtocolError(
            f"openai_responses: function_call at output_index {index} gave its "
            f"call_id only at {where}"
        )
    for key, value in zip(IDENTITY, known, strict=True):
        # Only a change counts: a name or item id the added item did not give may come
        # now (the echo replays the done item; results answer the call_id).
        if value is not None and key in item and item[key] != value:
            raise StreamProtocolError(
                f"openai_responses: function_call at output_index {index} changed "
                f"its {key} at {where}"
            )


def terminal_calls(
    output: list[dict[str, msgspec.Raw]] | None,
    calls: Mapping[int, Identity],
    by_item: Mapping[str, int],
    done: set[int],
    told: Mapping[int, bytes],
) -> list[CallDone]:
    """The terminal output's function_call items read against the streamed ``calls``
    (output_index -> identity; ``by_item``: item id -> output_index, -1 for an id two
    calls share; ``done``: the calls whose done signal came; ``told``: the digest of each
    call's first done literal). An item names its call by its id, else by its position
    (the output_index). Returns a ``CallDone`` repeating the arguments of each done call
    that the terminal output gives as completed, unless they are its first done literal
    again. An absent or empty output says nothing (compatible servers send
    ``output: []``)."""
    out: list[CallDone] = []
    matched: set[int] = set()
    decode = wire.JSON.decode
    for position, members in enumerate(output or ()):
        kind = members.get("type")
        if kind is None:
            continue
        # The type as the API writes it, else decoded (an escape may spell it).
        if bytes(kind) != _FUNCTION_CALL and decode(kind) != "function_call":
            continue
        item = {key: decode(members[key]) for key in _READ if key in members}
        item_id = item.get("id")
        index = by_item.get(item_id, -1) if isinstance(item_id, str) and item_id else -1
        if index < 0:
            index = position
        if index not in calls or index in matched:
            raise StreamProtocolError(
                f"openai_responses: the terminal output lists a function_call (output[{position}]) "
                "that never streamed"
            )
        matched.add(index)
        # Only the name is held to the stream here: servers re-render the terminal output
        # with fresh ids (vLLM) or rotate them (GitHub Copilot), and nothing in it is
        # echoed or answered (the done item is; results answer the streamed call_id).
        name = item.get("name")
        if name is not None and name != calls[index][1]:
            raise StreamProtocolError(
                f"openai_responses: function_call at output_index {index} changed its name "
                "at the terminal event"
            )
        status = item.get("status")
        if index in done and (status is None or status == "completed"):
            literal = wire.string_literal(members.get("arguments"), index)
            if literal is not None and told.get(index) != digest(literal):
                out.append(CallDone(index, literal=literal))
    return out

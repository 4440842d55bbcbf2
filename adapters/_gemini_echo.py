"""The Gemini ``model`` echo: the assistant's parts as the next request must repeat them.

Owns the rebuilding of the parts from a ``TurnOutcome``: thought parts (with their
signatures), text parts, ``functionCall`` parts with their own ``thoughtSignature``, and
their order. The decode side (``gemini.GeminiStream``) records a ``gemini_part_order``
provider detail only when the parts came in another order than thoughts, one text part,
calls; the echo then
repeats it (text between calls, each text part's own signature). An order that does not
account for exactly the outcome's thoughts, calls and text falls back to the usual order.
"""

from __future__ import annotations

from typing import Any

from callgate.engine.core.adapter import JSON
from callgate.engine.core.outcome import TurnOutcome

__all__ = ["default_order", "echo_parts"]


def default_order(order: list[list[Any]]) -> bool:
    """Whether the default echo (thoughts, one text part carrying the last text
    signature, calls) repeats the parts in ``order``."""
    stage = 0  # 0: thoughts so far, 1: the text part seen, 2: calls
    for entry in order:
        kind = entry[0]
        if kind == "call":
            stage = 2
        elif stage:
            return False  # a thought or a second text part after the text, or after a call
        elif kind == "text":
            stage = 1
    return True


def _ordered_parts(
    order: Any, text: str, thoughts: dict[int, dict[str, Any]], calls: dict[int, JSON]
) -> list[JSON] | None:
    """The echo's parts in the order the stream gave them; None when ``order`` does not
    account for exactly the turn's thoughts, calls and text (an outcome read back from
    somewhere else), so the caller falls back to the default order."""
    parts: list[JSON] = []
    seen_thoughts: set[int] = set()
    seen_calls: set[int] = set()
    at = 0  # the text is covered by the runs in order, without gaps
    if not isinstance(order, list):
        return None
    for entry in order:
        if not isinstance(entry, list) or not entry:
            return None
        kind = entry[0]
        if kind == "thought" and len(entry) == 2 and entry[1] in thoughts:
            if entry[1] in seen_thoughts:
                return None
            seen_thoughts.add(entry[1])
            parts.append(dict(thoughts[entry[1]]))
        elif kind == "call" and len(entry) == 2 and entry[1] in calls:
            if entry[1] in seen_calls:
                return None
            seen_calls.add(entry[1])
            parts.append(calls[entry[1]])
        elif kind == "text" and len(entry) in (3, 4) and entry[1] == at:
            end = entry[2]
            if not isinstance(end, int) or not at <= end <= len(text):
                return None
            part: JSON = {"text": text[at:end]}
            if len(entry) == 4:
                part["thoughtSignature"] = entry[3]
            parts.append(part)
            at = end
        else:
            return None
    if at != len(text) or len(seen_thoughts) != len(thoughts) or len(seen_calls) != len(calls):
        return None
    return parts


def echo_parts(outcome: TurnOutcome) -> list[JSON]:
    """The parts of the ``model`` content echoing ``outcome`` (empty: nothing to echo)."""
    thoughts: dict[int, dict[str, Any]] = {}
    call_sigs: dict[int, Any] = {}
    text_sig: Any = None
    order: Any = None
    for item in outcome.continuation:
        if item.kind == "thought":
            thoughts[item.index] = item.item
        elif item.kind == "thought_signature":
            call_sigs[item.index] = item.item.get("thoughtSignature")
        elif item.kind == "text_signature":
            text_sig = item.item.get("thoughtSignature")
    for detail in outcome.provider_details:
        if detail.kind == "gemini_part_order":
            order = detail.data.get("parts")
    calls: dict[int, JSON] = {}
    for call in sorted(outcome.calls, key=lambda c: c.index):
        fc: JSON = {
            "name": call.name,
            "args": call.arguments if call.arguments is not None else {},
        }
        if not call.call_id_derived:
            fc["id"] = call.call_id
        part: JSON = {"functionCall": fc}
        sig = call_sigs.get(call.index)
        if sig:
            part["thoughtSignature"] = sig
        calls[call.index] = part
    parts = None
    if order is not None:
        parts = _ordered_parts(order, outcome.text, thoughts, calls)
    if parts is None:
        parts = [dict(thoughts[pos]) for pos in sorted(thoughts)]
        if outcome.text or text_sig:
            text_part: JSON = {"text": outcome.text}
            if text_sig:
                text_part["thoughtSignature"] = text_sig
            parts.append(text_part)
        parts.extend(calls.values())
    return parts

"""Size caps on untrusted stream input, each with the reason for its default.

Every buffer that grows with model or provider output is bounded by one of these.
Exceeding a cap is a typed error (``LimitExceeded``) inside the decoder and an
explicit ``failed`` turn outcome at the decode boundary, never unbounded memory
and never a silently truncated call.
"""

from __future__ import annotations

import msgspec

from .errors import ConfigError

__all__ = ["DEFAULT_LIMITS", "MAX_JSON_DEPTH", "Limits"]

_MiB = 1024 * 1024
# The deepest max_json_depth accepted: every depth up to it is checked for duplicate keys
# by Python's json module on the caller's stack, which must stay under the recursion
# limit (1000 by default) with room for the caller's own frames.
MAX_JSON_DEPTH = 256


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Byte, count and depth caps of one decoded stream (defaults in the README). Past a
    stream cap the turn is ``failed``; past a per-call cap that call is refused."""

    # One SSE line carries one provider event. The largest legitimate single line is a
    # whole-arguments Gemini functionCall or an Anthropic content block with opaque
    # encrypted search results (≈256 KB recorded); 4 MiB leaves >10x headroom.
    max_line_bytes: int = 4 * _MiB
    # Multi-line `data:` fields are joined into one event; twice a line.
    max_event_bytes: int = 8 * _MiB
    # Arguments of one call. Real tool arguments are bytes to kilobytes; 4 MiB is
    # generous and still caps what one call can make us hold.
    max_call_argument_bytes: int = 4 * _MiB
    # All argument bytes of one response together.
    max_response_argument_bytes: int = 16 * _MiB
    # Calls in one response. Providers emit a handful of parallel calls; 128 is far
    # above any observed response and bounds per-call bookkeeping.
    max_calls_per_response: int = 128
    # Nesting depth of one argument object. Tool schemas are shallow; deep nesting is
    # a parser-exhaustion attack, not data.
    max_json_depth: int = 64
    # Assistant text and refusal text of one response.
    max_text_bytes: int = 16 * _MiB
    # Continuation items (reasoning, thinking blocks, signatures) of one response.
    max_continuation_items: int = 1024
    # Their bytes (JSON), with the provider details kept beside them (parts and blocks
    # the adapter does not read, such as Gemini inlineData): a count alone would let 1024
    # items of an event's size each be held. Each value and key in them is charged 48
    # bytes more (core.footprint: decoded, `[]` holds 30 times its JSON), so this is
    # about the memory they hold. Encrypted reasoning and signatures are kilobytes, a
    # server tool's results charge 1.1 to 3.5 times their JSON; a Responses message
    # item with `top_logprobs=20` charges ~13 KB per token (~5,000 tokens fit).
    max_continuation_bytes: int = 64 * _MiB
    # Body bytes of one response, framing included. Memory is bounded by the caps above;
    # this bounds the work: a stream that never ends (keep-alive comments, padding,
    # empty deltas) stops here, not only at the deadline. The streamed content caps
    # (arguments, text) together are 32 MiB, and the smallest fragments providers send
    # (4 bytes of argument in ~110 bytes of event) frame content about 28 times over;
    # continuation items come whole: 1 GiB holds any response within the other caps.
    max_response_bytes: int = 1024 * _MiB

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            # (bool is an int, and a str would fail only at the first decode.)
            if type(value) is not int or value < 0:  # (0 refuses everything: a test's cap)
                raise ConfigError(f"Limits.{name} must be an int >= 0, not {value!r}")
        if self.max_json_depth > MAX_JSON_DEPTH:
            raise ConfigError(
                f"max_json_depth is at most {MAX_JSON_DEPTH}, not {self.max_json_depth}"
            )


DEFAULT_LIMITS = Limits()

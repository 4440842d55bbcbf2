"""A host's tool registry as the CLI imports it (``--registry tests.cli_tools:REGISTRY``):
one irreversible weather tool, so every call pauses for approval. Its handler appends one
line per run to the file named by ``CALLGATE_TEST_EFFECTS``, so a test in another process
can count executions."""

from __future__ import annotations

import os

import msgspec

from callgate.engine.core.registry import Registry, RiskClass, ToolContext, ToolSpec


class WeatherArgs(msgspec.Struct, forbid_unknown_fields=True):
    city: str


def get_weather(args: WeatherArgs, ctx: ToolContext) -> dict[str, object]:
    path = os.environ.get("CALLGATE_TEST_EFFECTS")
    if path:
        with open(path, "a", encoding="utf-8") as effects:
            effects.write(f"{ctx.auth.operation_id} {ctx.call_id} {args.city}\n")
    return {"city": args.city, "forecast": "sunny"}


REGISTRY = Registry(
    [
        ToolSpec(
            name="get_weather",
            description="Current weather for a city.",
            args_type=WeatherArgs,
            handler=get_weather,
            risk=RiskClass.IRREVERSIBLE,
            timeout=5.0,
        )
    ]
)


def make_registry() -> Registry:
    return REGISTRY

"""The tool registry: ToolSpec contract checks, inlined schemas, exact-name lookup,
narrowing, declarations, idempotency keys and redaction."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Annotated, Any, Literal

import msgspec
import pytest

from callgate.engine.core.adapter import ToolDeclaration
from callgate.engine.core.errors import ConfigError
from callgate.engine.core.registry import (
    Registry,
    RiskClass,
    ToolContext,
    ToolSpec,
    args_digest,
)


class Address(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    street: str
    city: str


class Card(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    number: str
    cvc: str


class RefundArgs(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Refund part of an order."""

    order_id: Annotated[str, msgspec.Meta(max_length=32, description="The order to refund")]
    amount_cents: Annotated[int, msgspec.Meta(ge=1)]
    card: Card | None = None
    ship_to: list[Address] = []
    tags: frozenset[str] = frozenset()
    note: str = ""


class Loose(msgspec.Struct):
    x: int


class HoldsLoose(msgspec.Struct, forbid_unknown_fields=True):
    inner: list[Loose]


@dataclasses.dataclass
class DC:
    x: int


class HoldsDataclass(msgspec.Struct, forbid_unknown_fields=True):
    inner: DC


class Node(msgspec.Struct, forbid_unknown_fields=True):
    child: Node | None = None


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


def handler(args: Any, ctx: ToolContext) -> dict[str, object]:
    return {"ok": True}


async def async_handler(args: Any, ctx: ToolContext) -> dict[str, object]:
    return {"ok": True}


class AsyncCallable:
    async def __call__(self, args: Any, ctx: ToolContext) -> None:
        return None


def spec(name: str = "refund", **kw: Any) -> ToolSpec:
    base: dict[str, Any] = {
        "name": name,
        "description": f"{name} tool",
        "args_type": RefundArgs,
        "handler": handler,
    }
    base.update(kw)
    return ToolSpec(**base)


# --- ToolSpec --------------------------------------------------------------------------------


def test_schema_is_inlined_without_refs() -> None:
    s = spec()
    text = json.dumps(s.parameters)
    assert "$ref" not in text and "$defs" not in text
    assert s.parameters["type"] == "object"
    assert s.parameters["additionalProperties"] is False
    assert s.parameters["required"] == ["order_id", "amount_cents"]
    card = s.parameters["properties"]["card"]["anyOf"][0]
    assert card["properties"]["number"] == {"type": "string"}
    assert card["additionalProperties"] is False
    assert s.parameters["properties"]["ship_to"]["items"]["required"] == ["street", "city"]
    assert s.parameters["properties"]["order_id"]["description"] == "The order to refund"


def test_a_field_named_like_a_schema_keyword_is_kept() -> None:
    class Weird(msgspec.Struct, forbid_unknown_fields=True):
        properties: int
        ref: str = msgspec.field(name="$ref", default="")

    s = spec(args_type=Weird)
    assert set(s.parameters["properties"]) == {"properties", "$ref"}
    assert s.parameters["properties"]["$ref"]["type"] == "string"


def test_recursive_argument_types_are_refused() -> None:
    with pytest.raises(ConfigError, match="recursive"):
        spec(args_type=Node)


@pytest.mark.parametrize("args_type", [Loose, HoldsLoose], ids=["top", "nested"])
def test_argument_structs_must_forbid_unknown_fields(args_type: type) -> None:
    with pytest.raises(ConfigError, match="forbid_unknown_fields"):
        spec(args_type=args_type)


def test_dataclass_argument_parts_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"msgspec\.Struct"):
        spec(args_type=HoldsDataclass)


@pytest.mark.parametrize(
    "kw",
    [
        {"name": "has space"},
        {"name": ""},
        {"name": "x" * 65},
        {"name": "9starts_with_digit"},
        {"name": "dotted.name"},
        {"name": "get_order\n"},  # ("$" of a plain match would take the final newline)
        {"args_type": dict},
        {"handler": "not callable"},
        {"risk": "read"},
        {"timeout": 0},
        {"timeout": -1.0},
        {"timeout": float("inf")},
        {"max_result_bytes": 0},
        {"max_concurrency": 0},
        {"max_concurrency": 1.5},
        {"sensitive_paths": ("card.pin",)},
        {"sensitive_paths": ("nope",)},
        {"sensitive_paths": ("",)},
    ],
)
def test_misconfigured_specs_are_config_errors(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        spec(**kw)


def test_spec_accepts_edge_names_and_valid_paths() -> None:
    s = spec(
        name="A-b_" + "c" * 60,
        sensitive_paths=("card.number", "$.card.cvc", "$.ship_to[*].street", "ship_to.*.city"),
    )
    assert len(s.name) == 64


def test_is_side_effect_follows_risk() -> None:
    assert not spec(risk=RiskClass.READ).is_side_effect
    assert spec(risk=RiskClass.WRITE).is_side_effect
    assert spec(risk=RiskClass.IRREVERSIBLE).is_side_effect


def test_is_async_detects_coroutine_handlers() -> None:
    assert not spec().is_async
    assert spec(handler=async_handler).is_async
    assert spec(handler=AsyncCallable()).is_async


def test_spec_is_frozen() -> None:
    s = spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.name = "other"  # type: ignore[misc]


def test_no_argument_tool_has_an_object_schema() -> None:
    s = spec(args_type=Empty)
    assert s.parameters["type"] == "object"
    assert s.parameters["properties"] == {}


# --- identity helpers -----------------------------------------------------------------------


def test_args_digest_is_stable_over_key_and_set_order() -> None:
    a = msgspec.convert({"order_id": "o1", "amount_cents": 5, "tags": ["b", "a", "c"]}, RefundArgs)
    b = msgspec.convert({"tags": ["c", "a", "b"], "amount_cents": 5, "order_id": "o1"}, RefundArgs)
    c = msgspec.convert({"order_id": "o1", "amount_cents": 6}, RefundArgs)
    assert args_digest("refund", a) == args_digest("refund", b)
    assert args_digest("refund", a) != args_digest("refund", c)
    assert args_digest("refund", a) != args_digest("other", a)


def test_idempotency_key_uses_business_fields_and_operation() -> None:
    s = spec(idempotency_fields=lambda a: {"order": a.order_id, "amount": a.amount_cents})
    a = RefundArgs(order_id="o1", amount_cents=5, note="please")
    b = RefundArgs(order_id="o1", amount_cents=5, note="different note, same intent")
    c = RefundArgs(order_id="o1", amount_cents=7)
    assert s.idempotency_key("op1", a) == s.idempotency_key("op1", b)
    assert s.idempotency_key("op1", a) != s.idempotency_key("op1", c)
    assert s.idempotency_key("op1", a) != s.idempotency_key("op2", a)
    plain = spec()
    assert plain.idempotency_key("op1", a) != plain.idempotency_key("op1", b)


def test_redact_replaces_sensitive_values_only() -> None:
    s = spec(sensitive_paths=("card.number", "$.ship_to[*].street"))
    args: dict[str, Any] = {
        "order_id": "o1",
        "amount_cents": 5,
        "card": {"number": "4111", "cvc": "123"},
        "ship_to": [{"street": "a", "city": "x"}, {"street": "b", "city": "y"}],
    }
    out = s.redact(args)
    assert out["card"] == {"number": "[REDACTED]", "cvc": "123"}
    assert [a["street"] for a in out["ship_to"]] == ["[REDACTED]", "[REDACTED]"]
    assert [a["city"] for a in out["ship_to"]] == ["x", "y"]
    assert args["card"]["number"] == "4111", "the input must not be modified"
    assert s.redact({"order_id": "o1", "card": None}) == {"order_id": "o1", "card": None}


# --- Registry --------------------------------------------------------------------------------


def test_duplicate_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="duplicate"):
        Registry([spec("a"), spec("a")])


def test_registry_entries_must_be_toolspecs() -> None:
    with pytest.raises(ConfigError):
        Registry([handler])  # type: ignore[list-item]


def test_get_is_exact_and_only_from_the_registry() -> None:
    reg = Registry([spec("refund"), spec("get_order")])
    assert reg.get("refund") is not None
    assert reg.get("Refund") is None
    assert reg.get("refund ") is None
    # Names that exist elsewhere in the process are still unknown here.
    for name in ("handler", "spec", "print", "__import__", "eval", "os", "__class__"):
        assert reg.get(name) is None
        assert name not in reg
    assert reg.get(None) is None
    assert reg.get(["refund"]) is None


def test_narrow_returns_a_smaller_registry_and_never_adds() -> None:
    reg = Registry([spec("a"), spec("b"), spec("c")])
    small = reg.narrow(["c", "a"])
    assert small.names == ("a", "c")
    assert small.get("b") is None
    assert reg.get("b") is not None, "narrowing must not change the original"
    with pytest.raises(ConfigError, match="zzz"):
        reg.narrow(["a", "zzz"])
    assert len(reg.narrow([])) == 0


def test_declarations_are_sorted_tool_declarations() -> None:
    reg = Registry([spec("zeta"), spec("alpha"), spec("mid")])
    decls = reg.declarations()
    assert [d.name for d in decls] == ["alpha", "mid", "zeta"]
    assert all(isinstance(d, ToolDeclaration) for d in decls)
    assert decls[0].description == "alpha tool"
    assert decls[0].parameters == reg.get("alpha").parameters  # type: ignore[union-attr]
    decls.clear()
    assert len(reg.declarations()) == 3, "callers cannot mutate the registry's declarations"


def test_registry_iterates_in_name_order() -> None:
    reg = Registry([spec("b"), spec("a")])
    assert [s.name for s in reg] == ["a", "b"]
    assert len(reg) == 2
    assert "a" in repr(reg)


def test_examples_that_look_like_refs_are_data() -> None:
    class RefExample(msgspec.Struct, forbid_unknown_fields=True):
        opts: Annotated[dict[str, str], msgspec.Meta(examples=[{"$ref": "#/$defs/Nope"}])] = (
            msgspec.field(default_factory=dict)
        )

    s = spec(args_type=RefExample)
    assert s.parameters["properties"]["opts"]["examples"] == [{"$ref": "#/$defs/Nope"}]


class _Money(msgspec.Struct, forbid_unknown_fields=True):
    amount: Decimal


class _MoneyList(msgspec.Struct, forbid_unknown_fields=True):
    amounts: list[Decimal | None]


class _PositiveMoney(msgspec.Struct, forbid_unknown_fields=True):
    amount: Annotated[Decimal, msgspec.Meta(gt=0)]


class _IntKeyed(msgspec.Struct, forbid_unknown_fields=True):
    by_id: dict[int, str]


def _with_extra(extra: dict[str, Any]) -> type:
    field = Annotated[str, msgspec.Meta(extra_json_schema=extra)]
    return msgspec.defstruct("Extra", [("to", field)], forbid_unknown_fields=True)


@pytest.mark.parametrize(
    ("args_type", "says"),
    [
        # Decimal: a JSON number goes through float, Decimal() repairs strings ("1_000",
        # " 10 ", non-ASCII digits, "NaN"), and "10" / "10.00" are two idempotency keys.
        pytest.param(_Money, "Decimal", id="decimal"),
        pytest.param(_MoneyList, "Decimal", id="decimal-nested"),
        pytest.param(_PositiveMoney, "argument type", id="decimal-constraint-typeerror"),
        pytest.param(_IntKeyed, "dict keys", id="int-keyed-dict"),
        pytest.param(_with_extra({"pattern": "^[a-z]+@corp$"}), "pattern", id="extra-pattern"),
        pytest.param(_with_extra({"maximum": 100}), "maximum", id="extra-maximum"),
        pytest.param(_with_extra({"enum": ["a", "b"]}), "enum", id="extra-enum"),
        pytest.param(_with_extra({"format": "email"}), "format", id="extra-format"),
    ],
)
def test_argument_types_validation_could_not_hold_are_refused(args_type: type, says: str) -> None:
    """What the model is shown must be what validation checks, exactly, without repair."""
    with pytest.raises(ConfigError, match=says):
        spec(args_type=args_type)


def test_descriptive_extra_schema_and_str_like_keys_are_accepted() -> None:
    class Fine(msgspec.Struct, forbid_unknown_fields=True):
        to: Annotated[str, msgspec.Meta(extra_json_schema={"title": "To", "deprecated": False})]
        by_name: dict[str, int] = {}
        by_kind: dict[Literal["a", "b"], int] = {}

    s = spec(args_type=Fine)
    assert s.parameters["properties"]["to"]["title"] == "To"

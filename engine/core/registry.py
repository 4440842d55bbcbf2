"""The tool registry: a fixed allowlist of ``ToolSpec`` objects, and nothing else.

The dispatcher takes everything about a tool (argument type, risk, timeout, approval rule,
authorization, policy, handler, limits, revisions) from a ``ToolSpec`` found in a
``Registry`` by exact name. A name the registry does not hold is unknown: it is never
looked up in globals, modules, attributes or entry points. A registry can be narrowed
to a subset for one user or task.

This module owns the tool contract and the JSON Schema the model is shown. It never
calls a handler, never awaits, and never decides a call's fate (``validation`` does).
"""

from __future__ import annotations

import enum
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec

from .adapter import ToolDeclaration
from .audit import parse_path
from .canonical import digest_fields
from .errors import ConfigError

__all__ = [
    "ApprovalRule",
    "AuthContext",
    "AuthorizeFn",
    "Decision",
    "Handler",
    "PolicyContext",
    "PolicyFn",
    "ReconcileFn",
    "Registry",
    "Revisions",
    "RiskClass",
    "ToolContext",
    "ToolSpec",
    "args_digest",
    "args_to_builtins",
]


class RiskClass(enum.StrEnum):
    """What running a tool can do. Anything but a read goes through the idempotency
    ledger; an irreversible tool needs a person's approval unless its spec says otherwise."""

    READ = "read"  # no side effect (may still be tenant- and data-policy-sensitive)
    WRITE = "write"  # a side effect that can be undone or corrected
    IRREVERSIBLE = "irreversible"  # money moved, mail sent, data deleted


class Decision(msgspec.Struct, frozen=True):
    """An authorization or policy verdict. ``reason`` is for the audit trail only: the
    model sees the fixed envelope text, never host reasons (they may name data)."""

    allowed: bool
    reason: str = ""

    @classmethod
    def allow(cls, reason: str = "") -> Decision:
        return cls(True, reason)

    @classmethod
    def deny(cls, reason: str) -> Decision:
        return cls(False, reason)


class AuthContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who the operation runs for: trusted, supplied by the host, never by the model."""

    tenant: str
    subject: str
    operation_id: str
    roles: frozenset[str] = frozenset()
    attributes: dict[str, Any] = {}


class PolicyContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy or approval rule sees besides the parsed arguments."""

    auth: AuthContext
    tool: str
    risk: RiskClass
    call_id: str
    policy_revision: str


class ToolContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a handler receives besides its arguments (built by the runtime).

    ``idempotency_key`` identifies the business intent (see ``ToolSpec.idempotency_key``):
    a handler with a side effect passes it to the downstream system."""

    auth: AuthContext
    tool: str
    call_id: str
    idempotency_key: str
    attempt: int = 1


class Revisions(msgspec.Struct, frozen=True, kw_only=True):
    """Revision strings bound into every result's audit record; bump one when it changes."""

    input: str = "1"  # argument contract
    output: str = "1"  # result contract
    effect: str = "1"  # what the side effect does
    handler: str = "1"  # handler code
    producer: str = "1"  # the system that produces the result
    policy: str = "1"  # authorization/policy/approval rules


Handler = Callable[[Any, ToolContext], Any]
"""``handler(args, ctx)``: sync (run in a worker thread) or async; returns a JSON-able
value or a msgspec Struct."""
AuthorizeFn = Callable[[AuthContext, Any], bool | Decision]
PolicyFn = Callable[[PolicyContext, Any], Decision | bool]
ApprovalRule = Callable[[Any, PolicyContext], bool]
ReconcileFn = Callable[[str, Any], Awaitable[Any]]
"""``await reconcile(idempotency_key, args)``: the result of an earlier attempt whose
outcome was unknown, or None when the downstream system has no record of it."""

# A name every provider accepts (OpenAI/Anthropic: [a-zA-Z0-9_-]{1,64}; Gemini must
# start with a letter or underscore).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")  # whole name (fullmatch: no "$\n")
# Sensitive paths: "$.card.number", "card.number", "$.items[*].secret", "items.*.secret".
_PATH_SEGMENT = re.compile(r"[^.\[\]]+|\[\*\]")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """The host's contract for one tool. Validated when built (``ConfigError``).

    ``args_type`` must be a ``msgspec.Struct`` with ``forbid_unknown_fields=True`` (and
    so must every Struct nested in it); its JSON Schema, with every ``$ref`` inlined, is
    what the model is shown. ``approval`` is a bool or ``rule(args, PolicyContext)``;
    None means "approve irreversible tools only". ``authorize`` / ``policy`` None means
    "allow". ``max_result_bytes`` / ``max_concurrency`` None defer to the operation's
    ``Budgets``. ``sensitive_paths`` name argument fields to redact in audit records;
    ``sensitive_result_paths`` name fields of the handler's return value to redact there,
    in the audit's path grammar rooted at that value (``$`` the whole value, ``$.token``,
    ``$[*].token``, ``$['a.b']``, ``$[0]``; the leading ``$.`` may be left out). Both
    name JSON keys as the values are encoded: a Struct with ``rename="camel"`` is
    redacted at ``cardNumber``, never at its Python field ``card_number``.
    ``idempotency_fields(args)`` selects the business arguments of the idempotency key
    (None: all arguments).
    """

    name: str
    description: str
    args_type: type[msgspec.Struct]
    handler: Handler
    risk: RiskClass = RiskClass.READ
    schema_version: str = "1"
    # Ten seconds: interactive tool calls should answer in well under that; a slower tool
    # states its own timeout instead of holding the whole operation by default.
    timeout: float = 10.0
    approval: bool | ApprovalRule | None = None
    authorize: AuthorizeFn | None = None
    policy: PolicyFn | None = None
    max_result_bytes: int | None = None
    max_concurrency: int | None = None
    sensitive_paths: tuple[str, ...] = ()
    sensitive_result_paths: tuple[str, ...] = ()
    revisions: Revisions = field(default_factory=Revisions)
    idempotency_fields: Callable[[Any], Any] | None = None
    reconcile: ReconcileFn | None = None
    parameters: dict[str, Any] = field(init=False, repr=False, compare=False)
    # The argument type's info when a set field is reachable (repeats are refused), else
    # None: validation walks the arguments only for those tools.
    set_fields: msgspec.inspect.Type | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"tool name {self.name!r} must match {_NAME.pattern}")
        if not (isinstance(self.args_type, type) and issubclass(self.args_type, msgspec.Struct)):
            raise ConfigError(f"{self.name}: args_type must be a msgspec.Struct subclass")
        if not callable(self.handler):
            raise ConfigError(f"{self.name}: handler must be callable")
        if not isinstance(self.risk, RiskClass):
            raise ConfigError(f"{self.name}: risk must be a RiskClass")
        if not (isinstance(self.timeout, int | float) and math.isfinite(self.timeout)):
            raise ConfigError(f"{self.name}: timeout must be a finite number of seconds")
        if self.timeout <= 0:
            raise ConfigError(f"{self.name}: timeout must be > 0")
        for label, value in (
            ("max_result_bytes", self.max_result_bytes),
            ("max_concurrency", self.max_concurrency),
        ):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{self.name}: {label} must be a positive int or None")
        try:
            info = msgspec.inspect.type_info(self.args_type)
            schema = msgspec.json.schema(self.args_type)
        except (TypeError, ValueError) as exc:  # e.g. a constraint the type cannot carry
            raise ConfigError(f"{self.name}: unusable argument type: {exc}") from None
        has_sets = _check_strict_struct(self.name, info)
        parameters = _inline_schema(self.name, schema)
        for path in self.sensitive_paths:
            _check_sensitive_path(self.name, parameters, path)
        for path in self.sensitive_result_paths:
            _check_result_path(self.name, path)
        object.__setattr__(self, "parameters", parameters)
        object.__setattr__(self, "set_fields", info if has_sets else None)

    @property
    def is_side_effect(self) -> bool:
        """Anything but a read may change the world (and needs the idempotency ledger)."""
        return self.risk is not RiskClass.READ

    @property
    def is_async(self) -> bool:
        """True when the handler is a coroutine function (else it runs in a thread)."""
        handler: Any = self.handler
        return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - async callable objects
        )

    @property
    def policy_revision(self) -> str:
        return self.revisions.policy

    def declaration(self) -> ToolDeclaration:
        """What the model is told about this tool."""
        return ToolDeclaration(self.name, self.description, self.parameters)

    def business_args(self, args: msgspec.Struct) -> Any:
        """The arguments that define the business intent, as JSON builtins."""
        if self.idempotency_fields is None:
            return args_to_builtins(args)
        return msgspec.to_builtins(self.idempotency_fields(args), order="sorted")

    def idempotency_key(self, operation_id: str, args: msgspec.Struct) -> str:
        """SHA-256 hex over (operation, tool, business arguments) in canonical JSON.
        The call id is not part of it: a model retry with a new call id is the same intent.
        Raises ``ConfigError`` if the business arguments have no canonical JSON form."""
        return digest_fields(
            "callgate/idempotency/v1", operation_id, self.name, self.business_args(args)
        )

    def redact(self, arguments: Any) -> Any:
        """A copy of JSON ``arguments`` with every ``sensitive_paths`` value replaced by
        ``"[REDACTED]"`` (for audit records and logs; the handler gets the real values)."""
        out = _deep_copy(arguments)
        for path in self.sensitive_paths:
            _redact_path(out, _segments(path))
        return out


def args_to_builtins(args: msgspec.Struct) -> Any:
    """Arguments as JSON builtins with sorted keys and sets (stable across processes)."""
    return msgspec.to_builtins(args, order="sorted")


def args_digest(tool: str, args: msgspec.Struct) -> str:
    """The canonical digest of ``tool`` + arguments used for duplicate detection and
    approval binding. Raises ``ConfigError`` when the arguments have no canonical JSON
    form (e.g. an integer beyond 64 bits)."""
    return digest_fields("callgate/args/v1", tool, args_to_builtins(args))


class Registry:
    """An immutable allowlist of tools, keyed by exact name.

    ``get`` consults only this registry's own mapping: a name it does not hold is
    unknown, whatever else exists in the process."""

    __slots__ = ("_declarations", "_tools")

    def __init__(self, specs: Iterable[ToolSpec]) -> None:
        tools: dict[str, ToolSpec] = {}
        for spec in specs:
            if not isinstance(spec, ToolSpec):
                raise ConfigError(f"registry entries must be ToolSpec, got {type(spec).__name__}")
            if spec.name in tools:
                raise ConfigError(f"duplicate tool name {spec.name!r}")
            tools[spec.name] = spec
        self._tools: Mapping[str, ToolSpec] = MappingProxyType(dict(sorted(tools.items())))
        self._declarations = tuple(spec.declaration() for spec in self._tools.values())

    def get(self, name: object) -> ToolSpec | None:
        """The tool called exactly ``name``, or None. ``name`` is untrusted model text."""
        return self._tools.get(name) if isinstance(name, str) else None

    def narrow(self, names: Iterable[str]) -> Registry:
        """A new registry holding only ``names`` (for one user or task). Naming a tool this
        registry does not hold is a ``ConfigError``: narrowing never adds capability."""
        wanted = set(names)
        missing = wanted - self._tools.keys()
        if missing:
            raise ConfigError(f"cannot narrow to tools not in the registry: {sorted(missing)}")
        return Registry(spec for name, spec in self._tools.items() if name in wanted)

    def declarations(self) -> list[ToolDeclaration]:
        """Tool declarations for the model request, sorted by name."""
        return list(self._declarations)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"Registry({list(self._tools)})"


# --- argument type checks and schema ------------------------------------------------------


# JSON Schema keywords that only describe (the rest constrain, and ``extra_json_schema``
# constraints are shown to the model but never checked: msgspec.Meta's are).
_ANNOTATIONS = frozenset(
    {"title", "description", "examples", "deprecated", "readOnly", "writeOnly", "$comment"}
)


def _check_strict_struct(tool: str, info: msgspec.inspect.Type) -> bool:
    """Every Struct reachable from the argument type must forbid unknown fields; types
    that silently drop unknown keys (dataclass, TypedDict, ...) are refused, and so are
    the ones validation could not hold to what the model sent: ``Decimal`` (msgspec
    reads a JSON number into it through a float, and ``Decimal()`` reads "1_000", " 10 ",
    "١٠" and "NaN" from a string: a call could run on an amount nobody sent, and "10" and
    "10.00" would be two idempotency keys for one refund), dicts keyed by anything but
    strings (JSON keys are strings: no call could validate), and constraints given in
    ``extra_json_schema`` (never enforced). Returns whether a set type is reachable
    (validation then checks its arrays for repeats: ``sets.repeats_in_sets``)."""
    stack = [info]
    seen: set[type] = set()
    has_sets = False
    while stack:
        t = stack.pop()
        if isinstance(t, msgspec.inspect.Metadata):
            unchecked = sorted(set(t.extra_json_schema or {}) - _ANNOTATIONS)
            if unchecked:
                raise ConfigError(
                    f"{tool}: extra_json_schema keyword(s) {unchecked} would be shown to the "
                    "model but never checked: use msgspec.Meta constraints (ge, le, "
                    "pattern, min_length, ...), which validation enforces"
                )
            stack.append(t.type)
        elif isinstance(t, msgspec.inspect.DecimalType):
            raise ConfigError(
                f"{tool}: Decimal arguments are refused (read through a float from a JSON "
                "number, repaired from a string): use int minor units, or a str with "
                "msgspec.Meta(pattern=...) converted in the handler"
            )
        elif isinstance(t, msgspec.inspect.StructType):
            if t.cls in seen:
                continue
            seen.add(t.cls)
            if not t.forbid_unknown_fields:
                raise ConfigError(
                    f"{tool}: {t.cls.__name__} must set forbid_unknown_fields=True "
                    "(strict arguments: an unknown field is an error, not ignored)"
                )
            stack.extend(f.type for f in t.fields)
        elif isinstance(
            t,
            msgspec.inspect.DataclassType
            | msgspec.inspect.TypedDictType
            | msgspec.inspect.NamedTupleType,
        ):
            raise ConfigError(
                f"{tool}: use msgspec.Struct (forbid_unknown_fields=True) instead of "
                f"{type(t).__name__[:-4]} in argument types"
            )
        elif isinstance(
            t,
            msgspec.inspect.ListType
            | msgspec.inspect.SetType
            | msgspec.inspect.FrozenSetType
            | msgspec.inspect.VarTupleType,
        ):
            has_sets = has_sets or isinstance(
                t, msgspec.inspect.SetType | msgspec.inspect.FrozenSetType
            )
            stack.append(t.item_type)
        elif isinstance(t, msgspec.inspect.TupleType):
            stack.extend(t.item_types)
        elif isinstance(t, msgspec.inspect.DictType):
            if not _str_keyed(t.key_type):
                raise ConfigError(f"{tool}: dict keys in argument types must be str")
            stack.extend((t.key_type, t.value_type))
        elif isinstance(t, msgspec.inspect.UnionType):
            stack.extend(t.types)
    return has_sets


def _str_keyed(key: msgspec.inspect.Type) -> bool:
    while isinstance(key, msgspec.inspect.Metadata):
        key = key.type
    if isinstance(key, msgspec.inspect.LiteralType):
        return all(isinstance(v, str) for v in key.values)
    if isinstance(key, msgspec.inspect.EnumType):
        return all(isinstance(m.value, str) for m in key.cls)
    return isinstance(key, msgspec.inspect.StrType | msgspec.inspect.AnyType)


_DATA_KEYWORDS = frozenset({"default", "enum", "const", "examples"})


def _inline_schema(tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Replace every ``$ref`` with its definition (providers handle ``$ref``/``$defs``
    poorly or not at all). Recursive argument types cannot be inlined: ``ConfigError``."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(node: Any, active: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, active) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.removeprefix("#/$defs/")
            if name in active:
                raise ConfigError(f"{tool}: recursive argument type {name} cannot be inlined")
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return resolve(merged, (*active, name))
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$defs":
                continue
            if key in _DATA_KEYWORDS:  # values, not schemas: a "$ref" key there is data
                out[key] = value
            elif key == "properties":  # property *names* are data, not keywords
                out[key] = {prop: resolve(sub, active) for prop, sub in value.items()}
            else:
                out[key] = resolve(value, active)
        return out

    out = resolve(schema, ())
    if not isinstance(out, dict) or out.get("type") != "object":
        raise ConfigError(f"{tool}: the argument schema must be a JSON object")
    return out


def _segments(path: str) -> list[str]:
    body = path[1:] if path.startswith("$") else path
    return [("*" if seg == "[*]" else seg) for seg in _PATH_SEGMENT.findall(body)]


def _check_result_path(tool: str, path: object) -> None:
    """A result path must parse: a malformed one would fail (or silently leak) only when a
    handler's value is audited, after the handler ran."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{tool}: sensitive result path {path!r} must be a non-empty string")
    try:
        parse_path(path)
    except ConfigError as exc:
        raise ConfigError(f"{tool}: sensitive result path {path!r} is malformed ({exc})") from None


def _check_sensitive_path(tool: str, schema: dict[str, Any], path: str) -> None:
    """A sensitive path must name a field of the schema: a typo would silently leak."""
    segments = _segments(path)
    if not segments:
        raise ConfigError(f"{tool}: empty sensitive path {path!r}")
    nodes = [schema]
    for seg in segments:
        following: list[dict[str, Any]] = []
        for node in _flatten_any_of(nodes):
            if seg == "*":
                for key in ("items", "additionalProperties"):
                    if isinstance(node.get(key), dict):
                        following.append(node[key])
            elif isinstance(node.get("properties"), dict) and seg in node["properties"]:
                following.append(node["properties"][seg])
        if not following:
            raise ConfigError(f"{tool}: sensitive path {path!r} names no argument field")
        nodes = following


def _flatten_any_of(nodes: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(sub for sub in node.get("anyOf", ()) if isinstance(sub, dict))


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_deep_copy(v) for v in value]
    return value


def _redact_path(value: Any, segments: list[str]) -> None:
    if not segments:
        return
    seg, rest = segments[0], segments[1:]
    if isinstance(value, dict):
        keys = list(value) if seg == "*" else [seg] if seg in value else []
        for key in keys:
            if rest:
                _redact_path(value[key], rest)
            else:
                value[key] = "[REDACTED]"
    elif isinstance(value, list) and seg == "*":
        for i, item in enumerate(value):
            if rest:
                _redact_path(item, rest)
            else:
                value[i] = "[REDACTED]"

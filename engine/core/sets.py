"""Set-typed argument fields, held to what the model sent.

msgspec reads a JSON array into a ``set``/``frozenset`` field and drops repeated items:
``[7, 7, 8]`` reaches the handler as ``{7, 8}``. That is a repair (the schema the model
was shown says ``uniqueItems``), so validation refuses such a call instead; this module
finds the repeat. It walks the argument type beside the parsed JSON value, and only for
tools whose argument type holds a set (``ToolSpec.set_fields``, found by the registry's
walk of the type when the spec is built), so other calls pay nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .canonical import canonical_json
from .errors import ConfigError

__all__ = ["repeats_in_sets"]

_I = msgspec.inspect
_SETS = (_I.SetType, _I.FrozenSetType)


def repeats_in_sets(info: _I.Type, value: Any) -> bool:
    """Whether ``value`` (parsed JSON of the arguments) holds, where ``info`` has a set,
    an array with an item repeated (compared by canonical JSON: ``1`` and ``1.0`` are two
    items, as msgspec keeps them apart). A union is searched in every member (a repeat
    any reading of the value would drop is refused)."""
    stack: list[tuple[_I.Type, Any]] = [(info, value)]
    while stack:
        t, v = stack.pop()
        if isinstance(t, _I.Metadata):
            stack.append((t.type, v))
        elif isinstance(t, _SETS) and isinstance(v, list):
            if len(v) != len({_key(item) for item in v}):
                return True
            stack.extend((t.item_type, item) for item in v)
        elif isinstance(t, _I.StructType) and isinstance(v, dict):
            stack.extend((f.type, v[f.encode_name]) for f in t.fields if f.encode_name in v)
        elif isinstance(t, _I.ListType | _I.VarTupleType) and isinstance(v, list):
            stack.extend((t.item_type, item) for item in v)
        elif isinstance(t, _I.TupleType) and isinstance(v, list):
            stack.extend(zip(t.item_types, v, strict=False))
        elif isinstance(t, _I.DictType) and isinstance(v, dict):
            stack.extend((t.value_type, item) for item in v.values())
        elif isinstance(t, _I.UnionType):
            stack.extend((member, v) for member in t.types)
    return False


def _key(item: Any) -> bytes:
    try:
        return canonical_json(item)
    except ConfigError:  # (no canonical form: validation refuses the call anyway)
        return repr(item).encode()

"""What holding a decoded provider value costs, for the caps on what one turn keeps.

Opaque provider JSON (a server tool's block, an unknown step, an ``inlineData`` part, a
reasoning item) is kept decoded until the next request echoes it. Charged by its JSON
size alone, structure got through at many times that size in memory: ``[]`` is 2 bytes
of JSON and about 64 of Python (the list and the pointer to it), ``{"a":1}`` 7 bytes and
about 190, so ``max_continuation_bytes`` of lists of empty lists held over 20 times the
cap. A kept value is therefore charged its JSON size plus ``NODE_BYTES`` for every value
and key in it. Strings and numbers are charged as nodes too, but the characters inside a
string are charged once, whatever they are: a long thought costs what it weighs, and
punctuation in it costs nothing extra (counting brackets in the JSON text would charge
every comma of prose). With this charge structure and ASCII text hold at most about
twice what they are charged (``tests/test_footprint.py`` measures the hostile shapes).
A string with one character past U+00FF is held at 2 or 4 bytes per character, its
ASCII too, while its JSON counts those at one: up to 4 times its charge, as with any
text Python holds (``max_text_bytes`` counts UTF-8 bytes the same way).

The walk that counts the nodes stops as soon as the charge passes the budget it is
given, so a hostile value costs at most that budget's worth of nodes to refuse.
"""

from __future__ import annotations

__all__ = ["NODE_BYTES", "footprint"]

# About a pointer plus the smallest Python object a decoded JSON node can be (an empty
# list is 56 bytes, a one-character string 50, an int 28, a dict's entry and key ~100).
NODE_BYTES = 48


def footprint(value: object, size: int, budget: int) -> int:
    """The charge for holding ``value``, whose JSON is ``size`` bytes: ``size`` plus
    ``NODE_BYTES`` per node (every value, and every key of an object). Counting stops
    once the charge passes ``budget``; what is returned is then only known to be more."""
    limit = (budget - size) // NODE_BYTES  # nodes allowed within the budget
    nodes = 1
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        node = pop()
        # Exact types: decoded JSON holds exact dicts and lists (anything else is a leaf).
        if type(node) is dict:
            nodes += 2 * len(node)  # its keys and its values
            if nodes > limit:
                break
            extend(node.values())
        elif type(node) is list:
            nodes += len(node)
            if nodes > limit:
                break
            extend(node)
    return size + NODE_BYTES * nodes

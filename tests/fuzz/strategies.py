"""Hypothesis strategies the fuzz targets share: JSON values and hostile text."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Every code point, lone surrogates included: names and messages arrive from outside.
any_char = st.characters(codec=None, exclude_categories=[])
any_text = st.text(any_char, max_size=40)
# JSON's own troublemakers, weighted up: structure inside strings, escapes, controls.
tricky_text = st.text(st.sampled_from('[]{}"\\:,\n\r\t\x00\u2028 ') | any_char, max_size=20)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text
)


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """JSON documents (objects, arrays, scalars) of modest size."""
    return st.recursive(
        json_scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
        max_leaves=max_leaves,
    )


def json_depth(value: Any) -> int:
    """How many containers deep ``value`` nests (a scalar: 0). Iterative."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth) for child in children)
    return deepest


def deep_json(depth: int, leaf: str = "0", key: str | None = None) -> str:
    """JSON text: ``leaf`` inside ``depth`` arrays (or objects under ``key``), as text,
    because ``json.dumps`` itself cannot encode what the apiserver accepts."""
    if key is None:
        return "[" * depth + leaf + "]" * depth
    return ('{"' + key + '":') * depth + leaf + "}" * depth


# From a few levels to the apiserver's limit (10,000), weighted to the edges.
deep_depths = st.sampled_from([200, 990, 1_000, 3_000, 10_000]) | st.integers(129, 10_000)

"""The own cost and result shape of each CEL function, for the cost estimator.

Invariants:
- :func:`function_cost` gives a call's own cost (its arguments are charged by the caller)
  and the shape of its result. A function without a rule, or a call whose operands do not
  fit its rule, costs 1 and gives anything (:data:`DYN`).
- Operands are the receiver of a member call first, then the arguments, so ``s.f(x)`` and
  ``f(s, x)`` are charged alike.
- Each rule errs on the expensive side of cel-go's estimate (``checker/cost.go``,
  Kubernetes' ``library/cost.go``); see :mod:`dradriver.cel.cost` for the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dradriver.cel import ast
from dradriver.cel.cost_model import (
    BOOL,
    DOUBLE,
    DYN,
    INT,
    MAX_LIST_VALUE_LENGTH,
    QUANTITY,
    REGEX_LENGTH,
    SEMVER,
    UINT,
    UNBOUNDED,
    Shape,
    bounds,
    cost_add,
    cost_ceil,
    cost_mul,
    element_of,
    field_shape,
    join_shapes,
    list_shape,
    string_shape,
    traversal,
)

__all__ = ["function_cost"]

Cost = tuple[int, Shape]


@dataclass(frozen=True, slots=True)
class _Call:
    """One call as the rules see it."""

    node: ast.Call
    fn: str
    operands: Sequence[Shape]  # the receiver first, like the global form
    args: Sequence[Shape]  # the arguments alone
    overloads: Sequence[str]

    @property
    def first(self) -> Shape:
        return self.operands[0] if self.operands else DYN

    def operand_hi(self, index: int, default: int) -> int:
        """The size bound of operand ``index``, or ``default`` when there is none."""
        return bounds(self.operands[index])[1] if len(self.operands) > index else default


def function_cost(
    node: ast.Call,
    fn: str,
    target: Shape | None,
    args: list[Shape],
    overloads: Sequence[str],
) -> Cost:
    """The own cost of calling ``fn`` and its result's shape (see the module docstring)."""
    rule = _RULES.get(fn)
    if rule is None:
        return 1, DYN
    operands = ([target] if target is not None else []) + args
    return rule(_Call(node, fn, operands, args, overloads))


def _fixed(cost: int, shape: Shape) -> Callable[[_Call], Cost]:
    return lambda _call: (cost, shape)


def _compare(call: _Call) -> Cost:
    sizes = [bounds(s)[1] for s in call.operands if s.sized]
    own = 1 + (traversal(min(sizes)) if len(sizes) == len(call.operands) == 2 else 0)
    return own, BOOL


def _index(call: _Call) -> Cost:
    first = call.first
    return 1, element_of(first) if first.kind != "device" else DYN


def _optional_select(call: _Call) -> Cost:
    selected = call.node.args[1] if len(call.node.args) == 2 else None
    name = selected.value if isinstance(selected, ast.Const) else None
    return 1, field_shape(call.first, name) if isinstance(name, str) else DYN


def _in(call: _Call) -> Cost:
    container = call.operands[1] if len(call.operands) == 2 else DYN
    if container.kind == "map":
        return 1, BOOL
    return 1 + bounds(container)[1], BOOL


def _plus(call: _Call) -> Cost:
    if len(call.operands) != 2:
        return 1, DYN
    a, b = call.operands
    numeric = ("int", "uint", "double")
    if a.kind in numeric or b.kind in numeric or any("int" in o for o in call.overloads):
        return 1, a if a.kind in numeric else b
    lo, hi = a.lo + b.lo, cost_add(bounds(a)[1], bounds(b)[1])
    if a.kind == "list" or b.kind == "list":
        return 1, list_shape(hi, join_shapes(element_of(a), element_of(b)), lo=lo)
    kind = a.kind if a.kind == b.kind and a.kind in ("string", "bytes") else "dyn"
    return traversal(hi), Shape(kind, lo, hi, elem=a.elem or b.elem)


def _arithmetic(call: _Call) -> Cost:
    first = call.first
    return 1, first if first.kind in ("int", "uint", "double") else DYN


def _regex(call: _Call) -> Cost:
    text = bounds(call.first)[1]
    pattern = call.operand_hi(1, UNBOUNDED)
    own = max(1, cost_mul(traversal(text), cost_ceil(pattern * REGEX_LENGTH)))
    if call.fn == "matches":
        return own, BOOL
    if call.fn == "find":
        return own, string_shape(text)
    return own, list_shape(cost_add(text, 1), string_shape(text))


def _string_test(call: _Call) -> Cost:
    return 1 + traversal(bounds(call.first)[1]), BOOL


def _string_transform(call: _Call) -> Cost:
    size = bounds(call.first)[1]
    return 1 + traversal(size), string_shape(size)


def _reverse(call: _Call) -> Cost:
    return _list_copy(call) if call.first.kind == "list" else _string_transform(call)


def _replace(call: _Call) -> Cost:
    if len(call.operands) < 3:
        return 1, DYN
    text = bounds(call.operands[0])[1]
    old = bounds(call.operands[1])
    new = bounds(call.operands[2])[1]
    if old[0] == 0:  # "" is replaced between every character
        grown = cost_add(text, cost_mul(cost_add(text, 1), new))
    else:
        count = text // old[0]
        grown = cost_add(text, cost_mul(count, max(0, new - old[0])))
    return 1 + traversal(cost_add(text, grown)), string_shape(grown)


def _split(call: _Call) -> Cost:
    text = bounds(call.first)[1]
    return 1 + traversal(text), list_shape(cost_add(text, 1), string_shape(text))


def _substring(call: _Call) -> Cost:
    # substring, charAt, and indexOf/lastIndexOf on a string: charged for the string only.
    size = bounds(call.first)[1]
    return 1 + traversal(size), INT if "ndexOf" in call.fn else string_shape(size)


def _string_or_list_search(call: _Call) -> Cost:
    return _list_scan(call) if call.first.kind == "list" else _substring(call)


def _join(call: _Call) -> Cost:
    first = call.first
    n, elem = bounds(first)[1], bounds(element_of(first))[1]
    sep = call.operand_hi(1, 0)
    size = cost_add(cost_mul(n, elem), cost_mul(n, sep))
    return 1 + traversal(size), string_shape(size)


def _format(call: _Call) -> Cost:
    n = call.operand_hi(1, 0)
    widest = max(64, bounds(element_of(call.operands[-1]))[1])
    size = cost_add(bounds(call.first)[1], cost_mul(n, widest))
    return 1 + traversal(size), string_shape(size)


def _quote(call: _Call) -> Cost:
    size = cost_add(cost_mul(2, bounds(call.first)[1]), 2)
    return 1 + traversal(size), string_shape(size)


def _range(call: _Call) -> Cost:
    literal = call.node.args[0] if call.node.args else None
    if isinstance(literal, ast.Const) and isinstance(literal.value, int):
        n = max(0, literal.value)
        return cost_add(1, n), list_shape(n, INT, lo=n)
    return UNBOUNDED, list_shape(UNBOUNDED, INT)


def _sort(call: _Call) -> Cost:
    first = call.first
    n = bounds(first)[1]
    own = cost_mul(n, n) if call.fn == "distinct" else cost_mul(n, max(1, n.bit_length()))
    return cost_add(1, own), first


def _list_copy(call: _Call) -> Cost:
    """``slice`` and ``reverse`` of a list: one step per element."""
    first = call.first
    return cost_add(1, bounds(first)[1]), first


def _flatten(call: _Call) -> Cost:
    first = call.first
    n = bounds(first)[1]
    inner = element_of(first)
    n = cost_mul(n, bounds(inner)[1]) if inner.kind in ("list", "dyn") else n
    return cost_add(1, n), list_shape(n, element_of(inner))


def _set_test(call: _Call) -> Cost:
    return cost_add(1, cost_mul(bounds(call.first)[1], bounds(call.args[-1])[1])), BOOL


def _list_scan(call: _Call) -> Cost:
    """``isSorted``, ``sum``, ``min``, ``max`` and ``indexOf``/``lastIndexOf`` of a list."""
    first = call.first
    fn = call.fn
    shape = BOOL if fn == "isSorted" else INT if "ndexOf" in fn else element_of(first)
    return cost_add(1, bounds(first)[1]), shape


def _parse(call: _Call) -> Cost:
    fn = call.fn
    shape = BOOL if fn.startswith("is") else QUANTITY if fn == "quantity" else SEMVER
    return 1 + traversal(bounds(call.first)[1]), shape


def _optional_value(call: _Call) -> Cost:
    first = call.first
    if call.fn != "orValue":
        return 1, first
    return 1, join_shapes(first, call.args[0] if call.args else DYN)


def _to_string(call: _Call) -> Cost:
    first = call.first
    size = bounds(first)[1] if first.kind in ("string", "bytes") else 32
    return 1 + traversal(size), string_shape(size)


def _to_bytes(call: _Call) -> Cost:
    size = bounds(call.first)[1]
    return 1 + traversal(size), Shape("bytes", 0, size)


_CONVERSIONS = {"int": INT, "uint": UINT, "double": DOUBLE, "bool": BOOL}


def _convert(call: _Call) -> Cost:
    first = call.first
    return 1 + (traversal(first.hi) if first.sized else 0), _CONVERSIONS[call.fn]


def _dyn(call: _Call) -> Cost:
    return 1, call.first


def _rules() -> dict[str, Callable[[_Call], Cost]]:
    groups: list[tuple[tuple[str, ...], Callable[[_Call], Cost]]] = [
        (("_&&_", "_||_"), _fixed(0, BOOL)),
        (("@not_strictly_false", "!_"), _fixed(1, BOOL)),
        (("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"), _compare),
        (("_[_]", "_[?_]"), _index),
        (("_?._",), _optional_select),
        (("@in",), _in),
        (("_+_",), _plus),
        (("_-_", "_*_", "_/_", "_%_", "-_"), _arithmetic),
        (("size",), _fixed(1, INT)),
        (("matches", "find", "findAll"), _regex),
        (("contains", "startsWith", "endsWith"), _string_test),
        (("lowerAscii", "upperAscii", "trim"), _strings_only(_string_transform)),
        (("reverse",), _reverse),
        (("replace",), _replace),
        (("split",), _split),
        (("substring", "charAt"), _strings_only(_substring)),
        (("indexOf", "lastIndexOf"), _string_or_list_search),
        (("join",), _join),
        (("format",), _format),
        (("strings.quote",), _quote),
        (("lists.range",), _range),
        (("sort", "@sortByAssociatedKeys", "distinct"), _sort),
        (("slice",), _list_copy),
        (("flatten",), _flatten),
        (("sets.contains", "sets.equivalent", "sets.intersects"), _set_test),
        (("isSorted", "sum", "min", "max"), _list_scan),
        (("includes",), _fixed(1 + MAX_LIST_VALUE_LENGTH, BOOL)),
        (("quantity", "isQuantity", "semver", "isSemver"), _parse),
        (("compareTo", "sign", "asInteger", "major", "minor", "patch"), _fixed(1, INT)),
        (("isGreaterThan", "isLessThan", "isInteger", "hasValue"), _fixed(1, BOOL)),
        (("asApproximateFloat",), _fixed(1, DOUBLE)),
        (("add", "sub"), _fixed(1, QUANTITY)),
        (("orValue", "value", "optional.of", "optional.ofNonZeroValue"), _optional_value),
        (("optional.none",), _fixed(1, DYN)),
        (("string",), _to_string),
        (("bytes",), _to_bytes),
        (tuple(_CONVERSIONS), _convert),
        (("dyn",), _dyn),
    ]
    rules: dict[str, Callable[[_Call], Cost]] = {}
    for names, rule in groups:
        for name in names:
            assert name not in rules, f"two cost rules for {name}"
            rules[name] = rule
    return rules


def _strings_only(rule: Callable[[_Call], Cost]) -> Callable[[_Call], Cost]:
    """``rule`` for a string receiver; a list receiver costs 1 and gives anything."""
    return lambda call: (1, DYN) if call.first.kind == "list" else rule(call)


_RULES = _rules()

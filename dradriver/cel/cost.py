"""A conservative static cost estimate for DRA selectors, modelled on cel-go's estimator.

Kubernetes refuses a new DRA selector whose *estimated* worst-case cost exceeds
``CELSelectorExpressionMaxCost`` = 1 000 000 (cel.md §5.3). cel-expr-python has no
estimator, so this module walks the checked tree (:mod:`dradriver.cel.ast`, macros expanded)
and computes an upper bound in cel-go's units (``checker/cost.go`` and Kubernetes'
``library/cost.go``):

* identifiers and field selections cost 1, literals 0, list/map/message literals 10/30/40
  plus their parts; calls cost their arguments plus the function's own cost (1 unless
  listed below); ``&&``/``||`` cost both sides, ``?:`` the condition and the dearer branch;
* string work is charged at 0.1 per character (comparison, ``+``, ``contains``,
  ``lowerAscii`` …), ``replace`` also for the (possibly much longer) result; regular
  expressions (``matches``/``find``/``findAll``) at ``ceil(0.1·len(s)) · ceil(0.25·len(re))``;
* a comprehension (``all``, ``exists``, ``map``, ``filter``, two-variable forms, ``cel.bind``)
  costs its range and initial value plus, per element of the range, its condition and step:
  nested comprehensions multiply. List accumulators (``map``/``filter``) grow by the step
  once per element;
* ``lists.range(n)`` builds ``n`` elements (``n`` a literal; otherwise unbounded), list
  functions (``sort``, ``distinct``, ``flatten``, ``sets.*``, ``isSorted``, ``sum`` …) are charged
  per element.

Sizes come from the Kubernetes bounds of a device (ResourceSlice validation): at most 32
attributes and capacities per device (so at most 32 domains and 32 names per domain),
domains of at most 63 and names of at most 32 characters, string and version values of at
most 64 characters, list values of at most 48 elements; ``device.driver`` at most 63.
Anything whose size cannot be bounded (``lists.range`` of a computed number) is taken as
unbounded (2^64 - 1, as cel-go does), so iterating over it exceeds the limit.

Where this differs from cel-go it errs on the expensive side, so an expression accepted
here is within Kubernetes' limit; a few legitimate but loop-heavy selectors that Kubernetes
would accept may be refused.

The shapes and the cost arithmetic are in :mod:`dradriver.cel.cost_model`, each function's
own cost in :mod:`dradriver.cel.cost_functions`; this module walks the tree.
"""

from __future__ import annotations

from dradriver.cel import ast
from dradriver.cel.cost_functions import function_cost
from dradriver.cel.cost_model import (
    BOOL,
    DEVICE,
    DOUBLE,
    DYN,
    INT,
    NULL,
    UNBOUNDED,
    Shape,
    bounds,
    cost_add,
    cost_mul,
    element_of,
    field_shape,
    join_shapes,
    list_shape,
    map_shape,
    string_shape,
)

__all__ = [
    "MAX_COST",
    "UNBOUNDED",
    "estimate",
]

MAX_COST = 1_000_000
"""resource.k8s.io ``CELSelectorExpressionMaxCost``."""

LIST_CREATE = 10
MAP_CREATE = 30
STRUCT_CREATE = 40


class _Estimator:
    """Walks a checked tree: (cost, shape) of each node, children first."""

    def __init__(self, checked: ast.Checked) -> None:
        self.overloads = checked.overloads

    def estimate(self, node: ast.Expr, scope: dict[str, Shape]) -> tuple[int, Shape]:
        if isinstance(node, ast.Const):
            return 0, self._const(node.value)
        if isinstance(node, ast.Ident):
            return 1, scope.get(node.name, DEVICE if node.name == "device" else DYN)
        if isinstance(node, ast.Select):
            cost, operand = self.estimate(node.operand, scope)
            if node.test_only:
                return cost_add(cost, 1), BOOL
            return cost_add(cost, 1), field_shape(operand, node.field)
        if isinstance(node, ast.CreateList):
            total, shape = LIST_CREATE, None
            for element in node.elements:
                cost, s = self.estimate(element, scope)
                total = cost_add(total, cost)
                shape = s if shape is None else join_shapes(shape, s)
            n = len(node.elements)
            return total, list_shape(n, shape or DYN, lo=n)
        if isinstance(node, ast.CreateStruct):
            return self._struct(node, scope)
        if isinstance(node, ast.Comprehension):
            return self._comprehension(node, scope)
        return self._call(node, scope)

    @staticmethod
    def _const(value: object) -> Shape:
        if isinstance(value, bool):
            return BOOL
        if isinstance(value, int):
            return INT
        if isinstance(value, float):
            return DOUBLE
        if isinstance(value, str):
            return string_shape(len(value), len(value))
        if isinstance(value, bytes):
            return Shape("bytes", len(value), len(value))
        return NULL

    def _struct(self, node: ast.CreateStruct, scope: dict[str, Shape]) -> tuple[int, Shape]:
        total = STRUCT_CREATE if node.message_name else MAP_CREATE
        key_shape: Shape | None = None
        value_shape: Shape | None = None
        for key, value in node.entries:
            if not isinstance(key, str):
                cost, k = self.estimate(key, scope)
                total = cost_add(total, cost)
                key_shape = k if key_shape is None else join_shapes(key_shape, k)
            cost, v = self.estimate(value, scope)
            total = cost_add(total, cost)
            value_shape = v if value_shape is None else join_shapes(value_shape, v)
        if node.message_name:
            return total, Shape("message")
        return total, map_shape(len(node.entries), key_shape or DYN, value_shape or DYN)

    def _comprehension(self, node: ast.Comprehension, scope: dict[str, Shape]) -> tuple[int, Shape]:
        range_cost, range_shape = self.estimate(node.iter_range, scope)
        init_cost, accu = self.estimate(node.accu_init, scope)
        iterations = bounds(range_shape)[1]
        inner = dict(scope)
        if range_shape.kind == "map":
            first, second = range_shape.key or DYN, element_of(range_shape)
        else:
            first, second = element_of(range_shape), element_of(range_shape)
        if node.iter_var2:
            inner[node.iter_var] = first if range_shape.kind == "map" else INT
            inner[node.iter_var2] = second
        else:
            inner[node.iter_var] = first
        inner[node.accu_var] = accu
        _, step_shape = self.estimate(node.loop_step, inner)
        if accu.kind == "list" and step_shape.kind == "list" and step_shape.hi > accu.hi:
            # map()/filter(): the accumulator grows by the step once per iteration.
            grown = cost_add(accu.hi, cost_mul(iterations, step_shape.hi - accu.hi))
            accu = list_shape(grown, join_shapes(element_of(accu), element_of(step_shape)))
            inner[node.accu_var] = accu
        condition_cost, _ = self.estimate(node.loop_condition, inner)
        step_cost, _ = self.estimate(node.loop_step, inner)
        result_cost, result_shape = self.estimate(node.result, inner)
        loop = cost_mul(iterations, cost_add(condition_cost, step_cost))
        return cost_add(range_cost, init_cost, loop, result_cost), result_shape

    def _call(self, node: ast.Call, scope: dict[str, Shape]) -> tuple[int, Shape]:
        fn = node.function
        target: Shape | None = None
        total = 0
        if node.target is not None:
            total, target = self.estimate(node.target, scope)
        costs: list[int] = []
        args: list[Shape] = []
        for arg in node.args:
            cost, shape = self.estimate(arg, scope)
            costs.append(cost)
            args.append(shape)
        if fn == "_?_:_" and len(costs) == 3:
            return cost_add(total, costs[0], max(costs[1], costs[2])), join_shapes(args[1], args[2])
        total = cost_add(total, *costs)
        own, shape = function_cost(node, fn, target, args, self.overloads.get(node.id, ()))
        return cost_add(total, own), shape


def estimate(checked: ast.Checked) -> int:
    """The estimated worst-case cost of one evaluation (at most :data:`UNBOUNDED`)."""
    cost, _ = _Estimator(checked).estimate(checked.expr, {})
    return min(cost, UNBOUNDED)

"""Compile and evaluate DRA device selectors with Kubernetes semantics (cel-expr-python).

The environment matches Kubernetes' selector environment (cel.md §5): one variable
``device`` (``driver``, ``attributes`` by domain, ``capacity`` by domain as quantities,
``allowMultipleAllocations``); the CEL extensions Kubernetes enables (bindings, optional
syntax, strings v2, sets, lists, two-variable comprehensions); the Kubernetes Quantity,
Semver, Lists and Regex libraries and ``includes`` (:mod:`dradriver.cel.library`).

Compile time: :func:`compile_selector` type-checks (unknown functions and variables, wrong
argument types, non-bool results are :class:`CompileError`), adds the checks cel-cpp lacks
(:func:`dradriver.cel.rewrite.check`; literal regular expressions must be valid RE2), then
compiles the rewritten source (unknown-domain guard, literal folding). Results are kept in
an LRU cache keyed by the expression text (errors too).

Limits, enforced by :func:`compile_selector` and so for every selector dradriver accepts
(the webhook's :func:`validate_selector`, the allocator's DeviceClass, request and
DeviceClaimParameters selectors): Kubernetes' ``CELSelectorExpressionMaxLength`` (10 KiB,
counted in bytes) and ``CELSelectorExpressionMaxCost`` (1 000 000) for the estimated cost.
cel-expr-python has no estimator; :mod:`dradriver.cel.cost` computes a conservative one
over the checked tree (:mod:`dradriver.cel.ast`). The scheduler skips the cost check for
stored selectors; we do not, so a selector the apiserver would refuse is refused here too.

Evaluation: :meth:`Selector.evaluate` never raises; an error (``no such key``, a failing
function, the iteration budget, a non-bool result, a device whose version attribute is not
semver, and any exception from the binding such as ``MemoryError`` or ``RecursionError``)
is a non-match with a reason. Whether the caller treats that as "does not match"
(our default) or aborts like the scheduler is the allocator's choice.

Budget at run time: cel-cpp has no runtime cost accounting; it stops an evaluation after
10 000 comprehension iterations (nested loops share the budget), raised as ``RuntimeError``
in a few ms. That is stricter than Kubernetes' runtime cost limit (1 000 000) for
loop-heavy selectors and not configurable from Python. Work without loops (string growth
with ``replace``, ``lists.range``) is bounded by the compile-time estimate.

Memory: cel-expr-python 0.1.3 leaks every Python callback's argument tuple and result
(measured here: about 1.2 KB per call with Quantity messages; constant expressions and
selectors without callbacks do not grow). What this adapter does about it:

1. Literal ``quantity("…")``/``semver("…")`` calls are folded into message literals at
   compile time, so the typical ``capacity.compareTo(quantity("16Gi"))`` makes one
   callback per evaluation instead of two.
2. Results of selectors that still call Python are memoised process-wide by (expression,
   device content fingerprint) in a bounded cache, so re-allocating against unchanged
   ResourceSlices makes no new callbacks: leaked memory grows with the number of distinct
   (selector, device) pairs ever seen, not with the number of allocation attempts.
3. Selectors that still call Python are evaluated in a child process that is replaced
   after a number of callbacks (:mod:`dradriver.cel.worker`, :func:`configure`; default
   50 000, about 60 MB): recycling the environment and programs in-process frees nothing
   (the leaked objects keep a reference), the child's exit does. The child also bounds
   the time of one evaluation (5 s). Selectors without callbacks stay in this process.
   In-process callbacks (worker turned off) are counted; :func:`stats` reports them, the
   estimated leak and ``over_budget`` (:func:`set_callback_budget`), and the worker's
   evaluations, starts, recycles and timeouts. Re-measure with
   ``tests/unit/dradriver/cel/test_env_leak.py`` and ``bench/cel_leak.py`` when upgrading
   cel-expr-python.

Evaluations pass the device as ``eval(data=...)``: measured as fast as a reused
``Activation`` for these small inputs (~100 000 evaluations/s without callbacks), and it
keeps nothing per device, whereas a cached Activation holds an arena (~5 KB per device,
growing with every evaluation's temporaries).

The ``device`` variable is built by :mod:`dradriver.cel.device`; compile and runtime errors
are worded by :mod:`dradriver.cel.messages`.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import cel_expr_python.cel as cel

from dradriver.cel import _types, ast, cost, library, rewrite, worker
from dradriver.cel.device import DeviceInput
from dradriver.cel.messages import compile_message, failure_message, runtime_message

__all__ = [
    "EXPRESSION_MAX_LENGTH",
    "LEAK_BYTES_PER_CALLBACK",
    "MATCH",
    "MAX_COST",
    "NO_MATCH",
    "CelStats",
    "CompileError",
    "EvalResult",
    "Selector",
    "compile_selector",
    "configure",
    "set_callback_budget",
    "stats",
    "validate_selector",
]

EXPRESSION_MAX_LENGTH = 10 * 1024
"""resource.k8s.io ``CELSelectorExpressionMaxLength`` (bytes)."""
MAX_COST = cost.MAX_COST
LEAK_BYTES_PER_CALLBACK = 1_200
COMPILE_CACHE_SIZE = 4096
RESULT_CACHE_SIZE = 1 << 20

_CONFIG_YAML = """\
name: kubernetes.dra.selectors
extensions:
  - name: bindings
  - name: optional
  - name: strings
    version: 2
  - name: sets
  - name: lists
  - name: two-var-comprehensions
"""


class CompileError(ValueError):
    """A selector that does not compile; ``message`` is what a user should see."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(f"CEL compile error: {message}")
        self.expression = expression
        self.message = message


@dataclass(frozen=True, slots=True)
class EvalResult:
    """The outcome for one device: ``matched``, or not, with ``error`` when it failed."""

    matched: bool
    error: str | None = None


MATCH = EvalResult(True)
NO_MATCH = EvalResult(False)


@dataclass
class CelStats:
    compiles: int = 0
    compile_cache_hits: int = 0
    evaluations: int = 0
    result_cache_hits: int = 0
    result_cache_size: int = 0
    callback_calls: int = 0
    callback_budget: int = 0
    worker_enabled: bool = False
    worker_evaluations: int = 0
    worker_starts: int = 0
    worker_recycles: int = 0
    worker_timeouts: int = 0
    worker_failures: int = 0
    worker_callbacks: int = 0
    worker_callbacks_total: int = 0

    @property
    def estimated_leak_bytes(self) -> int:
        return self.callback_calls * LEAK_BYTES_PER_CALLBACK

    @property
    def over_budget(self) -> bool:
        return self.callback_calls > self.callback_budget


class _Counters:
    def __init__(self) -> None:
        self.compiles = 0
        self.compile_cache_hits = 0
        self.evaluations = 0
        self.result_cache_hits = 0
        self.callback_budget = 500_000


_COUNTERS = _Counters()
_LOCK = threading.Lock()
_ENV: cel.Env | None = None


def _environment() -> cel.Env:
    global _ENV
    if _ENV is None:
        _ENV = cel.NewEnv(
            _types.POOL,
            config=cel.NewEnvConfigFromYaml(_CONFIG_YAML),
            variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
            extensions=[library.extension()],
        )
    return _ENV


# --- selectors --------------------------------------------------------------------------


class _BoundedCache(OrderedDict[Any, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)


_COMPILED: _BoundedCache = _BoundedCache(COMPILE_CACHE_SIZE)
_RESULTS: dict[tuple[str, str], EvalResult] = {}


class Selector:
    """A compiled selector; :meth:`evaluate` gives the result for one device."""

    __slots__ = ("_program", "estimated_cost", "expression", "rewritten", "uses_callbacks")

    def __init__(
        self, expression: str, rewritten: str, program: cel.Expression, estimated_cost: int = 0
    ) -> None:
        self.expression = expression
        self.rewritten = rewritten
        self._program = program
        self.estimated_cost = estimated_cost
        self.uses_callbacks = bool(rewrite.calls(rewritten) & library.CALLBACK_FUNCTIONS)

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"

    def evaluate(self, device: DeviceInput) -> EvalResult:
        """The result for ``device``; never raises: any failure is a non-match with a reason."""
        try:
            return self._evaluate(device)
        except Exception as e:  # MemoryError, RecursionError, a binding bug, ...
            return EvalResult(False, failure_message(e))

    def _evaluate(self, device: DeviceInput) -> EvalResult:
        if device.error is not None:
            return EvalResult(False, device.error)
        if not self.uses_callbacks:
            return self._run(device)
        key = (self.rewritten, device.fingerprint)
        cached = _RESULTS.get(key)
        if cached is not None:
            _COUNTERS.result_cache_hits += 1
            return cached
        child = _worker()
        if child is None:
            result = self._run(device)
        else:
            _COUNTERS.evaluations += 1
            answer = child.evaluate(self.expression, device.driver, device.device)
            if answer.transient:  # the child failed: try again next time
                return EvalResult(False, answer.error)
            result = (
                MATCH
                if answer.matched
                else NO_MATCH
                if answer.error is None
                else EvalResult(False, answer.error)
            )
        if len(_RESULTS) >= RESULT_CACHE_SIZE:
            _RESULTS.pop(next(iter(_RESULTS)))
        _RESULTS[key] = result
        return result

    def evaluate_here(self, device: DeviceInput) -> EvalResult:
        """Like :meth:`evaluate`, in this process and without the memo cache."""
        try:
            if device.error is not None:
                return EvalResult(False, device.error)
            return self._run(device)
        except Exception as e:
            return EvalResult(False, failure_message(e))

    def _run(self, device: DeviceInput) -> EvalResult:
        _COUNTERS.evaluations += 1
        try:
            value = self._program.eval(data={"device": device.data})
            raw = value.value()
        except RecursionError:
            raise
        except RuntimeError as e:  # the iteration budget, internal errors
            return EvalResult(False, runtime_message(str(e)))
        if raw is True:
            return MATCH
        if raw is False:
            return NO_MATCH
        if value.type() == cel.Type.ERROR:
            return EvalResult(False, runtime_message(str(raw)))
        return EvalResult(
            False,
            f"CEL result of type {value.type().name().lower()} could not be converted to bool",
        )


def compile_selector(expression: str) -> Selector:
    """The compiled selector; raises :class:`CompileError` (cached either way)."""
    with _LOCK:
        cached = _COMPILED.get(expression)
        if cached is not None:
            _COMPILED.move_to_end(expression)
            _COUNTERS.compile_cache_hits += 1
    if cached is None:
        cached = _compile(expression)
        with _LOCK:
            _COUNTERS.compiles += 1
            _COMPILED.put(expression, cached)
    if isinstance(cached, CompileError):
        raise cached
    assert isinstance(cached, Selector)
    return cached


def syntax_tree(expression: str) -> ast.Checked:
    """The checked syntax tree of ``expression`` in the selectors' environment (macros
    expanded); raises :class:`CompileError` for syntax and type errors only (neither the
    length nor the cost limit is applied: for reading selectors the apiserver has stored)."""
    try:
        checked = _environment().compile(expression)
        return ast.decode(checked.serialize())
    except RuntimeError as e:
        raise CompileError(expression, compile_message(str(e))) from e
    except ast.DecodeError as e:
        raise CompileError(expression, f"internal error reading the checked expression: {e}") from e


def validate_selector(expression: str) -> str | None:
    """What is wrong with ``expression`` as a new selector (for admission), or None.

    The same checks as :func:`compile_selector`: Kubernetes' length and estimated cost
    limits, syntax and types, RE2 syntax of literal regular expressions.
    """
    try:
        compile_selector(expression)
    except CompileError as e:
        return e.message
    return None


def _compile(expression: str) -> Selector | CompileError:
    size = len(expression.encode())
    if size > EXPRESSION_MAX_LENGTH:
        return CompileError(
            expression,
            f"expression is {size} bytes long; at most {EXPRESSION_MAX_LENGTH} are allowed "
            "(the Kubernetes limit for a CEL selector)",
        )
    env = _environment()
    try:
        checked = env.compile(expression)
    except RuntimeError as e:
        return CompileError(expression, compile_message(str(e)))
    problem = rewrite.check(expression)
    if problem is not None:
        return CompileError(expression, problem)
    result_type = checked.return_type()
    if result_type != cel.Type.BOOL and result_type != cel.Type.DYN:
        return CompileError(
            expression,
            "must evaluate to bool or the unknown type, not " + _type_name(result_type),
        )
    try:
        tree = ast.decode(checked.serialize())
    except ast.DecodeError as e:  # should not happen; refuse rather than skip the checks
        return CompileError(expression, f"internal error reading the checked expression: {e}")
    problem = regex_literal_problem(tree)
    if problem is not None:
        return CompileError(expression, problem)
    estimated = cost.estimate(tree)
    if estimated > cost.MAX_COST:
        return CompileError(
            expression,
            f"too complex: estimated cost {estimated} exceeds the limit {cost.MAX_COST} "
            "(the Kubernetes cost limit for a CEL selector)",
        )
    rewritten = rewrite.rewrite(expression)
    if rewritten == expression:
        return Selector(expression, expression, checked, estimated)
    try:
        program = env.compile(rewritten)
    except RuntimeError:
        # Inlined comparisons nest deeper; near cel-cpp's parse depth limit keep the calls.
        rewritten = rewrite.rewrite(expression, inline=False)
        try:
            program = env.compile(rewritten) if rewritten != expression else checked
        except RuntimeError as e:  # should not happen: the rewrite keeps valid text valid
            return CompileError(expression, "internal rewrite failed: " + compile_message(str(e)))
    return Selector(expression, rewritten, program, estimated)


def regex_literal_problem(tree: ast.Checked) -> str | None:
    """A literal pattern of ``matches``/``find``/``findAll`` that RE2 rejects, if any."""
    for node in ast.walk(tree.expr):
        if not isinstance(node, ast.Call) or node.function not in library.REGEX_FUNCTIONS:
            continue
        index = 0 if node.target is not None else 1
        if len(node.args) <= index:
            continue
        pattern = node.args[index]
        if isinstance(pattern, ast.Const) and isinstance(pattern.value, str):
            problem = library.regex_problem(pattern.value)
            if problem is not None:
                return f"{node.function}(): {problem}"
    return None


def _type_name(t: cel.Type) -> str:
    name = str(t.name())
    return name.lower() if name.isupper() else name


def set_callback_budget(calls: int) -> None:
    """After how many Python callbacks in this process :func:`stats` reports ``over_budget``.

    With the worker (the default) callbacks happen in the recycled child, not here; see
    :func:`configure` for its recycling threshold.
    """
    _COUNTERS.callback_budget = calls


_WORKER_LOCK = threading.Lock()
_WORKER_ENABLED = os.environ.get("DRADRIVER_CEL_WORKER", "1") != "0"
_WORKER: worker.Worker | None = None


def configure(
    *,
    use_worker: bool | None = None,
    recycle_after: int | None = None,
    timeout: float | None = None,
) -> None:
    """How selectors that call Python are evaluated (see :mod:`dradriver.cel.worker`).

    ``use_worker``: in a recycled child process (default; ``DRADRIVER_CEL_WORKER=0`` turns
    it off) or in this process (the leak then grows without bound). ``recycle_after``: the
    child's callback count after which it is replaced. ``timeout``: seconds an evaluation
    in the child may take before it is stopped and counted as a non-match.
    """
    global _WORKER_ENABLED
    with _WORKER_LOCK:
        if use_worker is not None:
            _WORKER_ENABLED = use_worker
        child = _WORKER or _new_worker()
        if recycle_after is not None:
            child.recycle_after = recycle_after
        if timeout is not None:
            child.timeout = timeout


def _new_worker() -> worker.Worker:
    global _WORKER
    _WORKER = worker.Worker()
    atexit.register(_WORKER.close)
    return _WORKER


def _worker() -> worker.Worker | None:
    if not _WORKER_ENABLED:
        return None
    if _WORKER is not None:
        return _WORKER
    with _WORKER_LOCK:
        return _WORKER or _new_worker()


def stats() -> CelStats:
    w = _WORKER.stats if _WORKER is not None else worker.CelWorkerStats()
    return CelStats(
        compiles=_COUNTERS.compiles,
        compile_cache_hits=_COUNTERS.compile_cache_hits,
        evaluations=_COUNTERS.evaluations,
        result_cache_hits=_COUNTERS.result_cache_hits,
        result_cache_size=len(_RESULTS),
        callback_calls=library.CALLBACKS.calls,
        callback_budget=_COUNTERS.callback_budget,
        worker_enabled=_WORKER_ENABLED,
        worker_evaluations=w.evaluations,
        worker_starts=w.starts,
        worker_recycles=w.recycles,
        worker_timeouts=w.timeouts,
        worker_failures=w.failures,
        worker_callbacks=w.callbacks,
        worker_callbacks_total=w.callbacks_total,
    )


def clear_caches() -> None:
    """Forget compiled selectors and memoised results (tests)."""
    with _LOCK:
        _COMPILED.clear()
        _RESULTS.clear()

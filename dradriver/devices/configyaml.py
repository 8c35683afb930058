"""The driver configuration's YAML, read with bounds: :func:`load_yaml` and the error type.

Invariants: whatever the text, reading it raises :class:`DriverConfigError` and nothing else;
the parser is given at most :data:`MAX_CONFIG_BYTES` and builds at most :data:`MAX_NODES`
values, :data:`MAX_NESTING` deep, with no recursive or exploding aliases and no duplicate keys.
Other documents that are configuration too (an imported device-plugin configuration) are read
through the same function.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import yaml

from dradriver.errors import FieldError, FieldErrors

UNKNOWN_KEY = "unknown key (check its spelling and indentation)"


class DriverConfigError(FieldErrors):
    """The driver configuration file cannot be read or is invalid.

    ``file`` names it; ``errors`` are the field errors as text (``path: message``). Several
    errors read one per line, since a person fixes them in an editor.
    """

    def __init__(self, file: str, *errors: FieldError | str) -> None:
        super().__init__(*errors, subject=file)
        self.file = file
        self.errors = [str(e) for e in self.field_errors]
        if len(self.errors) != 1:
            lines = "\n".join(f"  {e}" for e in self.errors)
            self.args = (f"{file}: {len(self.errors)} errors:\n{lines}",)


# Bounds on what the YAML parser is given and builds, so that odd input is a
# DriverConfigError instead of a RecursionError, a hang or memory exhaustion. A real
# configuration is a few KiB, at most a dozen levels deep, and a few thousand values (the
# ``count`` shorthand stands for up to 100 000 devices in one entry). PyYAML's pure-Python
# scanner reads about 50 000 tokens/s, so 1 MiB takes up to ~20 s; libyaml's CSafeLoader
# is not used because its composer recurses in C, where no recursion limit applies.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_NESTING = 64
"""Levels of mappings and sequences, counted after aliases are expanded."""
MAX_NODES = 200_000
"""Scalars, mappings and sequences after aliases are expanded: a document of a few hundred
bytes can stand for billions of values through aliases of aliases ("billion laughs")."""
MAX_REPORTED_ERRORS = 50

# What SafeConstructor raises, besides YAMLError, for a scalar it resolved but cannot
# convert: ``2001-02-30`` (ValueError), ``!!bool maybe`` (KeyError), ``!!timestamp x``
# (AttributeError), a 5 000-digit integer (ValueError).
_SCALAR_ERRORS = (ValueError, TypeError, LookupError, AttributeError, OverflowError)


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses duplicate and unhashable keys, nesting deeper than
    :data:`MAX_NESTING` (PyYAML's composer and constructor recurse) and more than
    :data:`MAX_NODES` nodes while composing, and
    turns a scalar it cannot convert into a ConstructorError that points at it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        self._nodes += 1  # stop scanning early: the expanded count checked later is larger
        try:
            problem = None
            if self._depth > MAX_NESTING:
                problem = f"nested deeper than {MAX_NESTING} levels"
            elif self._nodes > MAX_NODES:
                problem = f"more than {MAX_NODES} values (keys, scalars, mappings and sequences)"
            if problem is not None:
                event = self.peek_event()  # type: ignore[no-untyped-call]  # (types-pyyaml)
                raise yaml.composer.ComposerError(None, None, problem, event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except _SCALAR_ERRORS as err:
            value = f" {node.value!r}" if isinstance(node, yaml.ScalarNode) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value{value}: {err}", node.start_mark
            ) from err


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        mark = key_node.start_mark
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a scalar, not a {type(key).__name__}", mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen.add(key)
    return dict(loader.construct_mapping(node, deep=True))


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expansion_problem(root: yaml.Node) -> str | None:
    """Why the composed document is too big once its aliases are expanded, if it is.

    An alias is the same node object as its anchor, so the walk is over a graph: sizes and
    heights are memoised per node (linear in the text, whatever the expansion), and a node
    reached from inside itself is a recursive alias. Iterative: the graph may be deep.
    """
    done: dict[int, tuple[int, int]] = {}  # id -> (expanded nodes, height)
    started: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finishing = stack.pop()
        key = id(node)
        if finishing:
            children = [done[id(c)] for c in _children(node)]
            size = 1 + sum(s for s, _ in children)
            height = 1 + max((h for _, h in children), default=0)
            if size > MAX_NODES:
                return (
                    f"the document has more than {MAX_NODES} values (keys, scalars, mappings "
                    "and sequences, counting each use of an alias in full)"
                )
            if height > MAX_NESTING:
                return f"the document is nested deeper than {MAX_NESTING} levels through aliases"
            done[key] = (size, height)
            started.discard(key)
            continue
        if key in done:
            continue
        if key in started:
            return f"recursive alias (line {node.start_mark.line + 1}): a value contains itself"
        started.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in done)
    return None


def load_yaml(text: str, file: str) -> Any:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise DriverConfigError(
            file, f"the configuration is {size} bytes long; at most {MAX_CONFIG_BYTES} are allowed"
        )
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)  # reads the stream: a ReaderError for a NUL, a surrogate
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _expansion_problem(node)
        if problem is not None:
            raise DriverConfigError(file, problem)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise DriverConfigError(file, f"not valid YAML: {err}") from err
    finally:
        if loader is not None:
            loader.dispose()


def config_error(file: str, errors: Sequence[FieldError]) -> DriverConfigError:
    """At most :data:`MAX_REPORTED_ERRORS` of ``errors``: a list of 100 000 bad entries must
    not make a message of megabytes."""
    if len(errors) <= MAX_REPORTED_ERRORS:
        return DriverConfigError(file, *errors)
    more = len(errors) - MAX_REPORTED_ERRORS
    return DriverConfigError(file, *errors[:MAX_REPORTED_ERRORS], f"... and {more} more errors")

"""Performance anti-patterns in Python, found statically in its syntax tree.

Three patterns that make code quadratic where it need not be, each reported with its
line:

- ``nested_loop_same_sequence``: a loop (or comprehension clause) inside another over
  the same sequence (``for a in xs: for b in xs:``, ``range(len(xs))`` twice): every
  pair is visited, often where a set or a dict would find the match at once. Loops over
  constants only (``range(3)``) are a fixed grid, not a sequence, and are left alone.
- ``string_concatenation_in_loop``: ``s += ...`` or ``s = s + ...`` on a string inside a
  loop: each step copies the whole string; ``"".join(parts)`` copies it once. A name
  counts as a string when every assignment to it in its scope is a string (a literal,
  an f-string, ``str(...)``, a ``.join``/``.format`` call), or when what is added is one.
- ``list_membership_in_loop``: ``x in items`` inside a loop, where ``items`` is a list
  (every assignment to it in its scope is a list display, a list comprehension or
  ``list(...)``, or a parameter annotated ``list``) or is built right there
  (``x in [y for ...]``, ``x in list(...)``): each test scans the list; a set answers at
  once. A list display of constants is left alone: Python turns it into a constant
  tuple, and it is short.

Blind spots: the analysis follows names within one function (no data flow across
calls, attributes or reassignment order), so ``self.items`` or a list passed in without
an annotation is not recognised.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PerformanceIssue", "IssueType", "find_performance_issues"]

IssueType = Literal[
    "nested_loop_same_sequence", "string_concatenation_in_loop", "list_membership_in_loop"
]

_MESSAGES: dict[IssueType, str] = {
    "nested_loop_same_sequence": (
        "a loop nested in a loop over the same sequence visits every pair; "
        "a set or a dict can often find the match at once"
    ),
    "string_concatenation_in_loop": (
        "a string built by concatenation in a loop is copied at each step; "
        "collect the parts and ''.join() them once"
    ),
    "list_membership_in_loop": (
        "a membership test on a list in a loop scans the list each time; a set answers at once"
    ),
}

_Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
_Comprehension = ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp


@dataclass(frozen=True)
class PerformanceIssue:
    """One anti-pattern and where it is."""

    line: int
    type: IssueType
    message: str


@dataclass
class _Kinds:
    """What each name of one scope is bound to: "list", "str", or "other"."""

    kinds: dict[str, str] = field(default_factory=dict)

    def bind(self, name: str, kind: str) -> None:
        known = self.kinds.get(name)
        self.kinds[name] = kind if known in (None, kind) else "other"

    def of(self, name: str) -> str | None:
        return self.kinds.get(name)


def find_performance_issues(tree: ast.AST) -> list[PerformanceIssue]:
    """The anti-patterns in ``tree`` (see the module), by line."""
    issues: list[PerformanceIssue] = []
    for scope in _scopes(tree):
        kinds = _bindings(scope)
        _Loops(kinds, issues).scope(scope)
    unique = {(i.line, i.type): i for i in issues}
    return sorted(unique.values(), key=lambda i: (i.line, i.type))


def _scopes(tree: ast.AST) -> Iterator[_Scope]:
    if isinstance(tree, _Scope):
        yield tree
    for node in ast.walk(tree):
        if node is not tree and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
    if not isinstance(tree, _Scope):  # a bare statement or expression: one scope
        yield ast.Module(body=[tree] if isinstance(tree, ast.stmt) else [], type_ignores=[])


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` that are not inside a function nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _bindings(scope: _Scope) -> _Kinds:
    kinds = _Kinds()
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = scope.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            kinds.bind(arg.arg, _annotation_kind(arg.annotation))
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    if not _extends(target, node.value):  # s = s + t keeps what s is
                        kinds.bind(target.id, _value_kind(node.value))
                else:
                    for name in _names(target):
                        kinds.bind(name, "other")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kind = _value_kind(node.value) if node.value is not None else "other"
            annotated = _annotation_kind(node.annotation)
            kinds.bind(node.target.id, kind if kind != "other" else annotated)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension | ast.With):
            for target in _targets(node):
                for name in _names(target):
                    kinds.bind(name, "other")
        elif isinstance(node, ast.NamedExpr):
            kinds.bind(node.target.id, _value_kind(node.value))
    return kinds


def _extends(target: ast.Name, value: ast.expr) -> bool:
    """``value`` is ``target + ...``."""
    return (
        isinstance(value, ast.BinOp)
        and isinstance(value.op, ast.Add)
        and isinstance(value.left, ast.Name)
        and value.left.id == target.id
    )


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
        return [node.target]
    if isinstance(node, ast.With):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    return []


def _names(target: ast.expr) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def _annotation_kind(annotation: ast.expr | None) -> str:
    if annotation is None:
        return "other"
    base = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
    if name in ("list", "List"):
        return "list"
    return "str" if name == "str" else "other"


def _value_kind(value: ast.expr) -> str:
    if isinstance(value, ast.List | ast.ListComp):
        return "list"
    if _is_string(value):
        return "str"
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "list":
        return "list"
    return "other"


def _is_string(value: ast.expr) -> bool:
    """A string by its form: a literal, an f-string, ``str(...)``, a ``.join`` or
    ``.format`` call, or a sum with a string in it."""
    if isinstance(value, ast.Constant):
        return isinstance(value.value, str)
    if isinstance(value, ast.JoinedStr):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in ("str", "repr", "chr")
        if isinstance(func, ast.Attribute) and func.attr in ("join", "format"):
            return isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add | ast.Mod):
        return _is_string(value.left) or _is_string(value.right)
    return False


def _data(sequence: ast.expr) -> bool:
    """Whether ``sequence`` reads a name other than the functions it calls."""
    called = {id(n.func) for n in ast.walk(sequence) if isinstance(n, ast.Call)}
    return any(isinstance(n, ast.Name) and id(n) not in called for n in ast.walk(sequence))


@dataclass
class _Loops:
    """Walks one scope with the stack of loops around each node."""

    kinds: _Kinds
    issues: list[PerformanceIssue]

    def report(self, node: ast.AST, kind: IssueType) -> None:
        self.issues.append(PerformanceIssue(getattr(node, "lineno", 0), kind, _MESSAGES[kind]))

    def scope(self, scope: _Scope) -> None:
        for node in scope.body:
            self.visit(node, [])

    def visit(self, node: ast.AST, loops: list[ast.expr | None]) -> None:
        """``loops``: the sequence each enclosing loop runs over (None for ``while``)."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            return  # a scope of its own, walked on its own
        if isinstance(node, ast.For | ast.AsyncFor):
            self.visit(node.iter, loops)
            self.nested(node, node.iter, loops)
            inner = [*loops, node.iter]
            for child in [node.target, *node.body]:
                self.visit(child, inner)
            for child in node.orelse:
                self.visit(child, loops)
            return
        if isinstance(node, ast.While):
            self.visit(node.test, [*loops, None])
            for child in node.body:
                self.visit(child, [*loops, None])
            for child in node.orelse:
                self.visit(child, loops)
            return
        if isinstance(node, _Comprehension):
            self.comprehension(node, loops)
            return
        if loops:
            self.in_loop(node)
        for child in ast.iter_child_nodes(node):
            self.visit(child, loops)

    def comprehension(self, node: _Comprehension, loops: list[ast.expr | None]) -> None:
        inner = list(loops)
        for generator in node.generators:
            self.visit(generator.iter, inner)
            self.nested(generator.iter, generator.iter, inner)
            inner = [*inner, generator.iter]
            for condition in generator.ifs:
                self.visit(condition, inner)
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.visit(element, inner)

    def nested(self, node: ast.AST, sequence: ast.expr, loops: list[ast.expr | None]) -> None:
        if not _data(sequence):
            return  # constants only (range(3)): a fixed grid
        shape = ast.dump(sequence)
        if any(outer is not None and ast.dump(outer) == shape for outer in loops):
            self.report(node, "nested_loop_same_sequence")

    def in_loop(self, node: ast.AST) -> None:
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            added = node.target
            if isinstance(added, ast.Name) and (
                self.kinds.of(added.id) == "str" or _is_string(node.value)
            ):
                self.report(node, "string_concatenation_in_loop")
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.BinOp)
                and _extends(target, value)
                and (self.kinds.of(target.id) == "str" or _is_string(value.right))
            ):
                self.report(node, "string_concatenation_in_loop")
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.In | ast.NotIn) and self.is_list(right):
                    self.report(node, "list_membership_in_loop")

    def is_list(self, value: ast.expr) -> bool:
        if isinstance(value, ast.Name):
            return self.kinds.of(value.id) == "list"
        if isinstance(value, ast.ListComp):
            return True
        if isinstance(value, ast.List):  # a display of constants is folded into a tuple
            return not all(isinstance(e, ast.Constant) for e in value.elts)
        return (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "list"
        )

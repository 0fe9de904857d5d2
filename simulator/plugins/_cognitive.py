"""Cognitive complexity of Python, as SonarSource defines it.

G. Ann Campbell's white paper "Cognitive Complexity" (SonarSource) counts what makes
code hard to follow, not the paths through it:

- +1 for each break in the linear flow: ``if``, ``elif``, ``else``, a conditional
  expression, ``match``, ``for``, ``while``, ``except``, each sequence of like boolean
  operators (``a and b and c`` is one, ``a and b or c`` two), and each function in a
  recursion cycle;
- + the nesting level for the structures that nest (``if``, conditional expression,
  ``match``, loops, ``except``); ``elif``, ``else`` and boolean sequences take none;
- the nesting level rises inside those structures' bodies, and inside nested functions
  and lambdas; ``try``, ``finally``, ``with`` and class bodies do not raise it; method
  calls are free, and so is shorthand (comprehensions).

Python's own constructs follow SonarSource's Python analyser: an ``else`` of a loop or
of a ``try`` counts like an ``if``'s; a function nested in a function adds a level
unless its parent only wraps it (a decorator: the parent holds nothing else but
``return name``); a class resets the level. The paper's lambdas (they add a level) and
recursion (+1 per function in a cycle, found by name: calls to a function of the same
code, or ``self.name``/``cls.name`` to a method of the same class) are counted as the
paper says.

A top-level function or a method is a block of its own; nested functions and lambdas
count towards the block around them, as in the paper. Code outside any function is the
block ``<module>``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["CognitiveBlock", "MODULE_BLOCK", "cognitive_blocks"]

MODULE_BLOCK = "<module>"
"""The name of the block that holds the code outside any function."""

_Function = ast.FunctionDef | ast.AsyncFunctionDef
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_TRY_STAR: type[ast.Try] = getattr(ast, "TryStar", ast.Try)  # ``except*``, Python 3.11+


@dataclass(frozen=True)
class CognitiveBlock:
    """One function's (or the module's) cognitive complexity."""

    name: str
    """``f``, ``Class.method``, or ``<module>``."""
    line: int | None
    """The line of its ``def`` (1 for the module); None in a tree without positions."""
    complexity: int


@dataclass
class _Block:
    name: str
    line: int | None
    complexity: int = 0


_Parent = ast.FunctionDef | ast.AsyncFunctionDef | None
"""The function whose body a walk is in; None at module or class level."""


@dataclass
class _Walk:
    """Walks a tree once, adding each increment to the block it lies in."""

    owner_of: dict[int, _Block] = field(default_factory=dict)
    """Each function node (by id) to the block it counts towards."""

    # -- statements -----------------------------------------------------------------

    def body(self, stmts: Sequence[ast.stmt], nesting: int, block: _Block, parent: _Parent) -> None:
        for stmt in stmts:
            self.stmt(stmt, nesting, block, parent)

    def stmt(self, node: ast.stmt, nesting: int, block: _Block, parent: _Parent) -> None:
        if isinstance(node, ast.If):
            self.if_(node, nesting, block, parent, elif_=False)
        elif isinstance(node, _LOOPS):
            block.complexity += 1 + nesting
            self.expr(node.test if isinstance(node, ast.While) else node.iter, nesting, block)
            self.body(node.body, nesting + 1, block, parent)
            self.else_(node.orelse, nesting, block, parent)
        elif isinstance(node, ast.Try | _TRY_STAR):
            self.body(node.body, nesting, block, parent)
            for handler in node.handlers:
                block.complexity += 1 + nesting
                self.exprs([handler.type] if handler.type else [], nesting, block)
                self.body(handler.body, nesting + 1, block, parent)
            self.else_(node.orelse, nesting, block, parent)
            self.body(node.finalbody, nesting, block, parent)
        elif isinstance(node, ast.Match):
            block.complexity += 1 + nesting
            self.expr(node.subject, nesting, block)
            for case in node.cases:
                self.exprs([case.guard] if case.guard else [], nesting + 1, block)
                self.body(case.body, nesting + 1, block, parent)
        elif isinstance(node, _Function):
            self.function(node, nesting, block, parent)
        elif isinstance(node, ast.ClassDef):
            self.exprs(_class_heads(node), nesting, block)
            self.body(node.body, 0, block, None)  # a class starts again from level 0
        else:  # with, assignments, returns...: only what they hold can count
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.stmt(child, nesting, block, parent)
                else:
                    self.inner(child, nesting, block)

    def if_(
        self, node: ast.If, nesting: int, block: _Block, parent: _Parent, *, elif_: bool
    ) -> None:
        block.complexity += 1 if elif_ else 1 + nesting
        self.expr(node.test, nesting, block)
        self.body(node.body, nesting + 1, block, parent)
        orelse = node.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If) and _is_elif(node, orelse[0]):
            self.if_(orelse[0], nesting, block, parent, elif_=True)
        else:
            self.else_(orelse, nesting, block, parent)

    def else_(
        self, orelse: Sequence[ast.stmt], nesting: int, block: _Block, parent: _Parent
    ) -> None:
        if orelse:
            block.complexity += 1
            self.body(orelse, nesting + 1, block, parent)

    def function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef,
        nesting: int,
        block: _Block,
        parent: _Parent,
    ) -> None:
        """A function counting towards ``block``: one level deeper than where it is
        defined in a function, as deep in a function that only wraps it, from level 0
        at module or class level."""
        self.exprs(_heads(node), nesting, block)
        self.owner_of[id(node)] = block
        if parent is None:
            level = 0
        elif _only_wraps(parent, node):
            level = nesting
        else:
            level = nesting + 1
        self.body(node.body, level, block, node)

    # -- expressions ----------------------------------------------------------------

    def exprs(self, nodes: Iterable[ast.expr], nesting: int, block: _Block) -> None:
        for node in nodes:
            self.expr(node, nesting, block)

    def expr(self, node: ast.expr, nesting: int, block: _Block) -> None:
        if isinstance(node, ast.IfExp):
            block.complexity += 1 + nesting
            self.exprs((node.test, node.body, node.orelse), nesting + 1, block)
        elif isinstance(node, ast.BoolOp):
            block.complexity += _runs(_operators(node))
            self.exprs(_operands(node), nesting, block)
        elif isinstance(node, ast.Lambda):
            self.exprs([*node.args.defaults, *filter(None, node.args.kw_defaults)], nesting, block)
            self.expr(node.body, nesting + 1, block)
        else:  # comprehensions are shorthand: free, but what they hold counts
            for child in ast.iter_child_nodes(node):
                self.inner(child, nesting, block)

    def inner(self, node: ast.AST, nesting: int, block: _Block) -> None:
        """An expression, or a part of one (a keyword argument, a comprehension's
        clause, a with-item)."""
        if isinstance(node, ast.expr):
            self.expr(node, nesting, block)
        else:
            for child in ast.iter_child_nodes(node):
                self.inner(child, nesting, block)


def _heads(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    """What is evaluated where a function is defined: decorators and defaults."""
    return [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)]


def _class_heads(node: ast.ClassDef) -> list[ast.expr]:
    """What is evaluated where a class is defined: decorators, bases, keywords."""
    return [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]


def _is_elif(parent: ast.If, child: ast.If) -> bool:
    """``elif`` rather than ``else:`` holding only an ``if``: the ``elif`` keyword sits in
    the column of its ``if``, a nested ``if`` further right. A tree without positions
    reads as ``elif`` (the two mean the same)."""
    column = getattr(child, "col_offset", None)
    return column is None or column == getattr(parent, "col_offset", None)


def _only_wraps(parent: ast.FunctionDef | ast.AsyncFunctionDef, child: ast.stmt) -> bool:
    """The parent holds nothing but ``child``, a docstring and ``return name``: it is
    a decorator wrapping ``child``."""
    return all(
        stmt is child
        or (isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Name))
        or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
        for stmt in parent.body
    )


def _operators(node: ast.BoolOp) -> list[type[ast.boolop]]:
    """The boolean operators of an expression in reading order, nested ones inline."""
    out: list[type[ast.boolop]] = []
    for index, value in enumerate(node.values):
        if index:
            out.append(type(node.op))
        if isinstance(value, ast.BoolOp):
            out.extend(_operators(value))
    return out


def _operands(node: ast.BoolOp) -> list[ast.expr]:
    """What the boolean operators of an expression join (nested sequences opened)."""
    out: list[ast.expr] = []
    for value in node.values:
        out.extend(_operands(value) if isinstance(value, ast.BoolOp) else [value])
    return out


def _runs(operators: Sequence[type[ast.boolop]]) -> int:
    """How many sequences of like operators: ``and, and, or`` is two."""
    return sum(1 for i, op in enumerate(operators) if i == 0 or op is not operators[i - 1])


# -- blocks and recursion ---------------------------------------------------------------


def cognitive_blocks(tree: ast.Module) -> list[CognitiveBlock]:
    """The cognitive complexity of each top-level function and each method, in source
    order, after that of the code outside them (``<module>``, listed when there is such
    code)."""
    walk = _Walk()
    module = _Block(MODULE_BLOCK, 1)
    blocks: list[_Block] = []
    executable = _place(tree.body, "", walk, module, blocks)
    _add_recursion(tree, walk.owner_of)
    if executable or module.complexity:
        blocks.insert(0, module)
    return [CognitiveBlock(b.name, b.line, b.complexity) for b in blocks]


def _place(
    stmts: Sequence[ast.stmt], prefix: str, walk: _Walk, module: _Block, blocks: list[_Block]
) -> bool:
    """Walk module- or class-level statements: each function a block of its own, the
    rest towards ``module``. Whether any of the rest is more than imports and
    docstrings."""
    executable = False
    for stmt in stmts:
        if isinstance(stmt, _Function):
            block = _Block(f"{prefix}{stmt.name}", getattr(stmt, "lineno", None))
            blocks.append(block)
            walk.function(stmt, 0, block, None)
        elif isinstance(stmt, ast.ClassDef):
            walk.exprs(_class_heads(stmt), 0, module)
            inner = _place(stmt.body, f"{prefix}{stmt.name}.", walk, module, blocks)
            executable = executable or inner
        else:
            executable = executable or not _inert(stmt)
            walk.stmt(stmt, 0, module, None)
    return executable


def _inert(stmt: ast.stmt) -> bool:
    """Imports, ``pass`` and docstrings: code outside functions with nothing to follow."""
    if isinstance(stmt, ast.Import | ast.ImportFrom | ast.Pass):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)


_Key = tuple[str | None, str]
"""A function by the class it is a method of (None: not a method) and its name."""


def _add_recursion(tree: ast.Module, owner_of: dict[int, _Block]) -> None:
    """+1 to the block of each function that can be called again from within itself,
    directly or through other functions of the same code."""
    functions: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str | None]] = []
    _collect_functions(tree, None, functions)
    by_key: dict[_Key, list[int]] = {}
    for fn, cls in functions:
        by_key.setdefault((cls, fn.name), []).append(id(fn))
    calls: dict[int, set[int]] = {}
    for fn, cls in functions:
        calls[id(fn)] = {
            target
            for name, on_class in _calls(fn)
            for target in by_key.get((cls if on_class else None, name), [])
        }
    for fn, _ in functions:
        if id(fn) in owner_of and _reaches(calls, id(fn)):
            owner_of[id(fn)].complexity += 1


def _collect_functions(
    node: ast.AST,
    cls: str | None,
    out: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str | None]],
) -> None:
    """Every function in ``node`` with the class it is a method of."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _Function):
            out.append((child, cls))
            _collect_functions(child, None, out)
        elif isinstance(child, ast.ClassDef):
            _collect_functions(child, child.name, out)
        else:
            _collect_functions(child, cls, out)


def _calls(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, bool]]:
    """The names ``fn`` itself calls (not its nested functions): ``(name, False)`` for
    ``name(...)``, ``(name, True)`` for ``self.name(...)`` or ``cls.name(...)``."""
    out: list[tuple[str, bool]] = []
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _Function | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            target = node.func
            if isinstance(target, ast.Name):
                out.append((target.id, False))
            elif (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in ("self", "cls")
            ):
                out.append((target.attr, True))
        stack.extend(ast.iter_child_nodes(node))
    return out


def _reaches(calls: dict[int, set[int]], start: int) -> bool:
    """Whether the function ``start`` can be called again from within itself."""
    seen: set[int] = set()
    stack = list(calls.get(start, ()))
    while stack:
        current = stack.pop()
        if current == start:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(calls.get(current, ()))
    return False

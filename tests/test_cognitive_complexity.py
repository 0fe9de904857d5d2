"""Cognitive complexity, as SonarSource's white paper defines it, on Python.

The cases are the paper's worked examples written as Python (its Java ``switch`` is a
``match``; a labelled ``continue`` has no Python form, so that example breaks out and
uses the loop's ``else``), then the rules one at a time, then the Python constructs
the paper does not cover.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from convsim.plugins import PythonComplexityAnalyzer, cognitive_blocks


def cognitive(source: str) -> dict[str, int]:
    """Each block's cognitive complexity, by name."""
    tree = ast.parse(textwrap.dedent(source))
    return {block.name: block.complexity for block in cognitive_blocks(tree)}


# -- the white paper's worked examples ---------------------------------------------------

SUM_OF_PRIMES = """
def sum_of_primes(limit):
    total = 0
    for i in range(1, limit + 1):   # +1
        for j in range(2, i):       # +2 (nesting 1)
            if i % j == 0:          # +3 (nesting 2)
                break
        else:                       # +1
            total += i
    return total
"""

GET_WORDS = """
def get_words(number):
    match number:                   # +1
        case 1:
            return "one"
        case 2:
            return "a couple"
        case 3:
            return "a few"
        case _:
            return "lots"
"""


def test_the_papers_two_methods_same_paths_different_understandability() -> None:
    """The paper's opening example: two methods a reader finds very unequal, which
    cyclomatic complexity nearly equates."""
    analyzer = PythonComplexityAnalyzer()
    primes = analyzer.analyze(ast.parse(SUM_OF_PRIMES))
    words = analyzer.analyze(ast.parse(GET_WORDS))
    assert primes["cognitive_complexity"] == 7
    assert words["cognitive_complexity"] == 1
    assert abs(primes["cyclomatic_complexity"] - words["cyclomatic_complexity"]) <= 1


def test_the_papers_nesting_example() -> None:
    assert cognitive(
        """
        def my_method():
            try:
                if condition1:                      # +1
                    for i in range(10):             # +2 (nesting 1)
                        while condition2:           # +3 (nesting 2)
                            pass
            except (ExcType1, ExcType2):            # +1
                if condition2:                      # +2 (nesting 1)
                    pass
        """
    ) == {"my_method": 9}


def test_the_papers_boolean_operator_sequences() -> None:
    assert cognitive(
        """
        def f():
            if (a                   # +1 for the if
                    and b and c     # +1
                    or d or e       # +1
                    and g):         # +1
                pass
        """
    ) == {"f": 4}


def test_the_papers_nested_function_adds_a_level() -> None:
    """The paper's lambda holding an ``if`` (+2: nesting 1); in Python a nested def."""
    assert cognitive(
        """
        def my_method2():
            def r():
                if condition1:      # +2 (nesting 1)
                    pass
            return r()
        """
    ) == {"my_method2": 2}


def test_a_lambda_adds_a_level() -> None:
    assert cognitive("def f(xs):\n    return sorted(xs, key=lambda x: 1 if x else 0)\n") == {"f": 2}


def test_each_function_in_a_recursion_cycle_costs_one() -> None:
    assert cognitive(
        """
        def fact(n):
            if n <= 1:                   # +1
                return 1
            return n * fact(n - 1)       # +1: recursion

        def is_even(n):
            return n == 0 or is_odd(n - 1)     # +1 (or), +1: in a cycle

        def is_odd(n):
            return n != 0 and is_even(n - 1)   # +1 (and), +1: in a cycle

        def helper(n):
            return fact(n)               # calls a recursive function: not in a cycle
        """
    ) == {"fact": 2, "is_even": 2, "is_odd": 2, "helper": 0}


def test_a_method_calling_itself_through_self_is_recursion() -> None:
    assert cognitive(
        """
        class Tree:
            def depth(self, node):
                if node is None:                              # +1
                    return 0
                return 1 + max(self.depth(c) for c in node)   # +1: recursion
        """
    ) == {"Tree.depth": 2}


# -- the rules, one at a time ------------------------------------------------------------


def code(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (code("def f(a):", "    return a"), 0),
        (code("def f(a):", "    if a:", "        pass"), 1),
        # elif and else: +1 each, no nesting increment
        (
            code(
                "def f(a, b):",
                "    if a:",
                "        pass",
                "    elif b:",
                "        pass",
                "    else:",
                "        pass",
            ),
            3,
        ),
        # an else holding an if is nested, unlike elif: +1 else, +2 if
        (
            code(
                "def f(a, b):",
                "    if a:",
                "        pass",
                "    else:",
                "        if b:",
                "            pass",
            ),
            4,
        ),
        # a conditional expression nests like an if
        (code("def f(a, b):", "    if a:", "        return 1 if b else 2"), 3),
        # sequences of like operators: one each, however long
        (code("def f(a, b, c):", "    return a and b and c"), 1),
        (code("def f(a, b, c, d):", "    return a or b and c or d"), 3),
        (code("def f(a, b, c):", "    return a and not (b and c)"), 2),
        # try and finally are free; each except is +1 and nests
        (
            code(
                "def f():",
                "    try:",
                "        g()",
                "    except ValueError:",
                "        pass",
                "    finally:",
                "        h()",
            ),
            1,
        ),
        (
            code(
                "def f():",
                "    try:",
                "        g()",
                "    except A:",
                "        pass",
                "    except B:",
                "        pass",
            ),
            2,
        ),
        # with is free and does not nest
        (code("def f(p):", "    with open(p) as fh:", "        if fh:", "            pass"), 1),
        # loops: +1 and nest; a loop's else is +1
        (code("def f(xs):", "    while xs:", "        for x in xs:", "            pass"), 3),
        (code("def f(xs):", "    for x in xs:", "        pass", "    else:", "        pass"), 2),
        # a comprehension is shorthand: free
        (code("def f(xs):", "    return [x for x in xs if x]"), 0),
        # break and continue have no labels in Python: free
        (code("def f(xs):", "    for x in xs:", "        if x:", "            break"), 3),
    ],
)
def test_each_rule(source: str, expected: int) -> None:
    assert cognitive(source) == {"f": expected}


def test_a_decorator_does_not_add_a_level_to_the_function_it_wraps() -> None:
    assert cognitive(
        """
        def logged(fn):
            def wrapper(*args):
                if args:                 # +1: wrapper starts at logged's level
                    return fn(*args)
                return None
            return wrapper
        """
    ) == {"logged": 1}


def test_a_class_starts_again_from_level_zero() -> None:
    assert cognitive(
        """
        def factory(flag):
            if flag:                     # +1
                class Local:
                    def m(self, x):
                        if x:            # +1: the class resets the level
                            pass
                return Local
        """
    ) == {"factory": 2}


# -- blocks ---------------------------------------------------------------------------


def test_methods_and_functions_are_blocks_and_code_outside_them_too() -> None:
    blocks = cognitive(
        '''
        """A module."""
        import os

        class Shop:
            def price(self, item):
                if item:
                    return 1
                return 0

        def main():
            for arg in os.environ:
                pass

        if __name__ == "__main__":
            main()
        '''
    )
    assert blocks == {"<module>": 1, "Shop.price": 1, "main": 1}


def test_only_imports_and_definitions_make_no_module_block() -> None:
    assert cognitive('"""doc"""\nimport os\n\ndef f():\n    pass\n') == {"f": 0}


def test_a_tree_built_without_positions_is_measured() -> None:
    source = "def f(a, b):\n    if a:\n        pass\n    elif b:\n        pass\n"
    bare = ast.parse(source)
    for node in ast.walk(bare):  # a tree made by code rather than parsed has none
        for attribute in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(node, attribute):
                delattr(node, attribute)
    assert [b.complexity for b in cognitive_blocks(bare)] == [2]
    analysed = PythonComplexityAnalyzer().analyze(bare)
    assert analysed["cognitive_complexity"] == 2 and analysed["cyclomatic_complexity"] == 3

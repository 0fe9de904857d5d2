"""Tests of the safe prompt templates (``convsim.scenarios.Template``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convsim import ConvsimError, TemplateError
from convsim.scenarios import Template


def render(source: str, **values: object) -> str:
    return Template.parse(source).render(values)


# -- rendering ----------------------------------------------------------------------


def test_renders_named_placeholders() -> None:
    assert render("Hello {name}, you are {age}.", name="Ada", age=36) == "Hello Ada, you are 36."


def test_same_placeholder_may_appear_twice() -> None:
    assert render("{x}-{x}", x="ab") == "ab-ab"


def test_template_without_placeholders_renders_verbatim() -> None:
    assert render("plain text, no fields") == "plain text, no fields"
    assert render("") == ""


def test_non_string_values_are_rendered_with_str() -> None:
    assert render("{n} {f} {b}", n=3, f=2.5, b=True) == "3 2.5 True"


def test_extra_values_are_ignored() -> None:
    assert render("{a}", a="1", unused="2") == "1"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{", "{"),
        ("}}", "}"),
        ("{{literal}}", "{literal}"),
        ("a {{b}} {c}", "a {b} C"),
        ("{{{c}}}", "{C}"),
    ],
)
def test_doubled_braces_are_literal(source: str, expected: str) -> None:
    assert render(source, c="C") == expected


def test_doubled_braces_do_not_count_as_fields() -> None:
    assert Template.parse("{{x}} and {{y}}").fields == frozenset()


@pytest.mark.parametrize(
    ("source", "value", "expected"),
    [
        ("{x:.2f}", 3.14159, "3.14"),
        ("{x:.2f}", 2, "2.00"),
        ("{x:>5}", "ab", "   ab"),
        ("{x:<5}|", "ab", "ab   |"),
        ("{x:*^7}", "ab", "**ab***"),
        ("{x:,}", 1234567, "1,234,567"),
        ("{x:05d}", 42, "00042"),
        ("{x:}", "as-is", "as-is"),
    ],
)
def test_format_spec_is_applied(source: str, value: object, expected: str) -> None:
    assert render(source, x=value) == expected


def test_format_spec_that_does_not_fit_the_value_is_a_template_error() -> None:
    template = Template.parse("{price:.2f}")
    with pytest.raises(TemplateError, match="price"):
        template.render({"price": "not a number"})


def test_fields_lists_each_variable_once() -> None:
    template = Template.parse("{a} {b:.1f} {a} {{c}} {_d1}")
    assert template.fields == frozenset({"a", "b", "_d1"})
    assert template.source == "{a} {b:.1f} {a} {{c}} {_d1}"


def test_width_just_below_the_limit_is_accepted() -> None:
    assert render("{x:>999}", x="y") == " " * 998 + "y"


# -- rejection at parse time --------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("{x.__class__}", id="attribute"),
        pytest.param("{x.__class__.__mro__}", id="attribute-chain"),
        pytest.param("{x[0]}", id="index"),
        pytest.param("{x[key]}", id="key"),
        pytest.param("{}", id="empty"),
        pytest.param("{0}", id="positional"),
        pytest.param("{0.real}", id="positional-attribute"),
        pytest.param("{x!r}", id="conversion-r"),
        pytest.param("{x!s}", id="conversion-s"),
        pytest.param("{x!a:>3}", id="conversion-with-spec"),
        pytest.param("{x:{y}}", id="nested"),
        pytest.param("{x:>{width}}", id="nested-width"),
        pytest.param("{x:>100000}", id="huge-width"),
        pytest.param("{x:>1000}", id="width-1000"),
        pytest.param("{x:.1000}", id="huge-precision"),
        pytest.param("{x", id="unclosed-brace"),
        pytest.param("text { more", id="lone-open-brace"),
        pytest.param("text } more", id="lone-close-brace"),
        pytest.param("}", id="only-close-brace"),
        pytest.param("{", id="only-open-brace"),
        pytest.param("{ x }", id="spaces"),
        pytest.param("{x-y}", id="not-an-identifier"),
        pytest.param("{1x}", id="leading-digit"),
    ],
)
def test_unsafe_or_malformed_templates_are_rejected(source: str) -> None:
    with pytest.raises(TemplateError):
        Template.parse(source)


def test_template_error_is_a_convsim_error() -> None:
    with pytest.raises(ConvsimError):
        Template.parse("{x.__class__}")


def test_rejection_message_names_the_offending_placeholder() -> None:
    with pytest.raises(TemplateError, match=r"\{x\.__class__\}"):
        Template.parse("Hi {x.__class__}")


def test_unbalanced_brace_message_suggests_doubling() -> None:
    with pytest.raises(TemplateError, match=r"'\{\{' or '\}\}'"):
        Template.parse("a } b")


def test_placeholder_name_with_trailing_newline_is_rejected() -> None:
    with pytest.raises(TemplateError):
        Template.parse("{x\n}")


# -- missing variables ----------------------------------------------------------------


def test_missing_variable_raises_naming_it() -> None:
    template = Template.parse("Hello {name}, about {topic}")
    with pytest.raises(TemplateError, match=r"\{topic\}"):
        template.render({"name": "Ada"})


def test_missing_variable_with_format_spec_raises_naming_it() -> None:
    with pytest.raises(TemplateError, match=r"\{price\}"):
        Template.parse("{price:.2f}").render({})


# -- values are data, never templates --------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["{secret}", "{x.__class__}", "{x[0]}", "{0}", "{}", "{{", "}}", "{", "}", "{x!r}"],
)
def test_values_are_inserted_literally(value: str) -> None:
    template = Template.parse("<{v}>")
    out = template.render({"v": value, "secret": "LEAKED", "x": "X"})
    assert out == f"<{value}>"
    assert "LEAKED" not in out


def test_value_with_placeholder_is_not_reinterpreted_with_a_format_spec() -> None:
    out = render("{v:>16}", v="{secret}", secret="LEAKED")
    assert out == "        {secret}"


def test_rendered_output_is_not_parsed_again() -> None:
    # A value with braces: the rendered text is a final string, not a new template.
    first = render("{a}", a="{b}")
    assert first == "{b}"
    assert render("{a}{b}", a="{b}", b="B") == "{b}B"


# -- properties -----------------------------------------------------------------------


@given(st.text())
def test_any_text_value_renders_verbatim(value: str) -> None:
    assert Template.parse("A{v}B").render({"v": value}) == "A" + value + "B"


@given(st.text())
def test_escaped_text_round_trips_as_a_literal(text: str) -> None:
    source = text.replace("{", "{{").replace("}", "}}")
    template = Template.parse(source)
    assert template.fields == frozenset()
    assert template.render({}) == text

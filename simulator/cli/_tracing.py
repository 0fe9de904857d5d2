"""The tracing options of ``convsim run`` and ``convsim load``: ``--otel`` (spans and
metrics through OpenTelemetry) and ``--request-id-header`` (an id sent with every
request, to find it in the server's logs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from ._options import OptionalValue

__all__ = ["otel_exported", "tracing_options", "with_request_id_header"]

F = TypeVar("F", bound=Callable[..., Any])


def tracing_options(func: F) -> F:
    """``--otel[=otlp|console]`` and ``--request-id-header NAME``; a command with them is
    an :class:`~convsim.cli._options.OptionalValueCommand`."""
    func = click.option(
        "--request-id-header",
        "request_id_header",
        metavar="NAME",
        default=None,
        help="Send a fresh id with every request in this header (e.g. x-request-id) and "
        "record it with the request, to find it in the server's logs.",
    )(func)
    return click.option(
        "--otel",
        "otel",
        cls=OptionalValue,
        type=click.Choice(["otlp", "console"]),
        flag_value="otlp",
        default=None,
        help="Trace the run with OpenTelemetry (needs convsim[otel]): --otel (otlp) "
        "exports spans and metrics over OTLP/HTTP as the standard OTEL_EXPORTER_OTLP_* "
        "variables say; --otel=console prints them to stderr.",
    )(func)


def with_request_id_header(model_args: tuple[str, ...], name: str | None) -> tuple[str, ...]:
    """``model_args`` with the model argument ``--request-id-header`` stands for."""
    return model_args if name is None else (*model_args, f"request_id_header={name}")


@contextmanager
def otel_exported(export: str | None) -> Iterator[None]:
    """Within the block, this process's spans and metrics go where ``export`` says
    (nothing is set up when it is None); what is buffered is exported at its end."""
    if export is None:
        yield
        return
    from .._otel import set_up_sdk

    setup = set_up_sdk("console" if export == "console" else "otlp")
    try:
        yield
    finally:
        setup.shutdown()

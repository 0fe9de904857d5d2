"""``convsim mock-server``: the mock model server on a port."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import anyio
import click
from rich.markup import escape

from .._gc import tune_gc_for_throughput
from ._console import (
    EXIT_BAD_INPUT,
)
from ._console import stderr as _stderr
from ._spelling import respell_distribution

if TYPE_CHECKING:
    pass


class _DelayType(click.ParamType):
    """Milliseconds, or a distribution of them: fixed:MS, uniform:MIN,MAX,
    normal:MEAN,STD[,MIN,MAX], lognormal:MEAN,STD[,MIN,MAX], exp:MEAN."""

    name = "DELAY"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        from ..adapters.mock import Delay

        if isinstance(value, str):
            value = respell_distribution(value, param.opts[0] if param else "delay")
        try:
            return Delay.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _parse_faults(_ctx: Any, _param: Any, value: str | None) -> dict[str, float] | None:
    if value is None:
        return None
    weights: dict[str, float] = {}
    for item in value.split(","):
        kind, sep, weight = item.strip().partition("=")
        try:
            weights[kind] = float(weight) if sep else 1.0
        except ValueError:
            raise click.BadParameter(f"{item.strip()!r}: expected KIND or KIND=WEIGHT") from None
    return weights


@click.command("mock-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="0: a free port."
)
@click.option(
    "--ttft-ms", type=_DelayType(), default="0", show_default=True, help="Time to first token."
)
@click.option(
    "--itl-ms", type=_DelayType(), default="0", show_default=True, help="Inter-token latency."
)
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Every answer has exactly N words.",
)
@click.option(
    "--reasoning-tokens",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Chat answers reason first: N words of reasoning_content before the answer.",
)
@click.option(
    "--fault-rate",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Fraction of generation requests that get an injected fault.",
)
@click.option(
    "--faults",
    callback=_parse_faults,
    default=None,
    metavar="KIND[=W],...",
    help="Fault mix over: 429; 500; drop (the connection closes); malformed (a 200 of "
    "broken JSON); html (a 200 with a proxy's HTML page); truncated_sse, stream_error, "
    "stream_drop (a stream that ends, reports an error, or drops after a few words); "
    "lone_surrogate (half an emoji in the text); split_surrogate (an emoji split across two "
    "stream events); malformed_tool_args (a tool call's arguments cut short, in answers "
    "that call a tool). Default: all but malformed_tool_args, equally.",
)
@click.option(
    "--retry-after",
    "retry_after_s",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Retry-After (seconds) of an injected 429.",
)
@click.option(
    "--rpm", type=click.IntRange(min=1), default=None, help="Requests per minute, then 429."
)
@click.option(
    "--memory-turns",
    type=click.IntRange(min=1),
    default=None,
    help="The model sees only the last K user messages.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--model", "model_name", default="mock-model", show_default=True)
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option(
    "--message-overhead-tokens",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Prompt tokens a chat template would add per message.",
)
@click.option(
    "--usage/--no-usage",
    default=True,
    show_default=True,
    help="Report token usage (--no-usage: none, even when a stream asks for it).",
)
@click.option(
    "--tokenize/--no-tokenize",
    default=True,
    show_default=True,
    help="Serve POST /tokenize (--no-tokenize: 404, a server without a tokenizer).",
)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=True,
    show_default=True,
    help="Simulate a prefix cache and report cached prompt tokens in usage.",
)
@click.option(
    "--max-running",
    type=click.IntRange(min=1),
    default=None,
    help="Answer at most N requests at once; the others wait (their TTFT includes it).",
)
def mock_server(
    host: str,
    port: int,
    ttft_ms: Any,
    itl_ms: Any,
    output_tokens: int | None,
    reasoning_tokens: int,
    fault_rate: float,
    faults: dict[str, float] | None,
    retry_after_s: float,
    rpm: int | None,
    memory_turns: int | None,
    seed: int,
    model_name: str,
    api_key: str | None,
    message_overhead_tokens: int,
    usage: bool,
    tokenize: bool,
    prefix_cache: bool,
    max_running: int | None,
) -> None:
    """Serve a mock OpenAI-compatible model until SIGINT or SIGTERM.

    Endpoints: /v1/models, /v1/chat/completions, /v1/completions, /generate and
    /tokenize; min_tokens and ignore_eos are honoured as vLLM does.
    Delays take milliseconds or a distribution of them: fixed:MS, uniform:MIN,MAX,
    normal:MEAN,STD[,MIN,MAX], lognormal:MEAN,STD[,MIN,MAX], exp:MEAN.
    """
    from pydantic import ValidationError

    from .._errors import describe_validation_error
    from ..adapters.mock import MockServerConfig

    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "output_tokens": output_tokens,
        "reasoning_tokens": reasoning_tokens,
        "fault_rate": fault_rate,
        "retry_after_s": retry_after_s,
        "rpm": rpm,
        "memory_turns": memory_turns,
        "seed": seed,
        "model": model_name,
        "api_key": api_key,
        "message_overhead_tokens": message_overhead_tokens,
        "usage": usage,
        "tokenize": tokenize,
        "prefix_cache": prefix_cache,
        "max_running": max_running,
    }
    if faults is not None:
        settings["faults"] = faults
    try:
        config = MockServerConfig(**settings)
    except ValidationError as exc:
        raise click.UsageError(describe_validation_error(exc, "mock server option")) from None
    tune_gc_for_throughput()
    try:
        anyio.run(_serve_mock, config, backend="asyncio")
    except OSError as exc:  # the address is taken or cannot be bound
        _stderr().print(
            f"[bold red]error:[/] cannot listen on {escape(host)}:{port}: {escape(str(exc))}",
            highlight=False,
        )
        sys.exit(EXIT_BAD_INPUT)


async def _serve_mock(config: Any) -> None:
    """Serve until SIGINT/SIGTERM (the receiver is open before the address is printed)."""
    import structlog

    from ..adapters.mock import MockModelServer

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with MockModelServer(config) as server:
            _stderr().print(f"listening on {server.url}", highlight=False)
            structlog.get_logger("convsim.cli").info(
                "mock_server_listening", url=server.url, base_url=server.base_url
            )
            async for _ in signals:
                break

"""Cost before and during a run: ``--dry-run``'s figures (worked out by hand here),
``--max-cost`` stopping a run cleanly and ``--resume`` finishing it, the price table
(a user's file over the bundled one, cached-input prices) and models without a price."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner
from structlog.testing import capture_logs

from convsim import Simulator
from convsim._errors import ConfigError
from convsim.adapters import Completion, Cost, GenerationParams, Message, Usage
from convsim.adapters._anthropic import _usage as anthropic_usage
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._openai import _usage as openai_usage
from convsim.adapters._pricing import PRICING_ENV, read_price_file
from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.results._sinks import JsonlSink, manifest_path
from tests.conftest import FakeAdapter, write_pack

pytestmark = pytest.mark.anyio

# 40 characters: 10 tokens at four characters a token, 14 with the message's framing
TEXT_A = "a" * 40
TEXT_B = "b" * 40
TURNS = [
    {"turn_id": "t0", "prompt_template": TEXT_A, "config": {"max_tokens": 10}},
    {"turn_id": "t1", "prompt_template": TEXT_B, "config": {"max_tokens": 20}},
]
PRICED = ["--model-arg", "input_price=1000", "--model-arg", "output_price=2000"]


def pack(tmp_path: Path, *, n: int = 2, turns: list[dict[str, Any]] | None = None) -> Path:
    scenarios = [
        {"scenario_id": f"s{i}", "scenario_description": f"scenario {i}", "variables": {}}
        for i in range(n)
    ]
    flows = {"default": {"turns": turns or TURNS}}
    return write_pack(tmp_path / "pack", flows, scenarios)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": "200", **(env or {})}).invoke(
        main, list(args), catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as portal:
        yield portal


@pytest.fixture
def mock(portal: BlockingPortal) -> Iterator[MockModelServer]:
    with portal.wrap_async_context_manager(MockModelServer(MockServerConfig())) as server:
        yield server


def target(server: MockModelServer) -> list[str]:
    return ["--model", "openai-compatible:mock-model", "--base-url", server.base_url]


# -- --dry-run ------------------------------------------------------------------------------


def test_dry_run_prints_the_figures_worked_out_by_hand_and_calls_nothing(
    tmp_path: Path, mock: MockModelServer
) -> None:
    # per conversation: call 1's prompt is t0 (14 tokens); call 2's is t0, the answer
    # (4 tokens of framing; low: empty, high: its cap of 10) and t1 (14): 32 low, 42
    # high. Two conversations: prompts 92 to 112 tokens, answers at most 2 * 30 = 60.
    # At $1000 and $2000 a million: low 92 * 0.001 = $0.092, high 0.112 + 0.120 = $0.232
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = invoke(
        "run", str(pack(tmp_path)), *target(mock), *PRICED, "--dry-run", "--out", str(out)
    )
    assert code == 0, stderr
    assert "2 conversations, 4 turns; no model was called" in stdout
    assert (
        "model (openai-compatible:mock-model): 4 calls, prompt tokens 92 - 112, "
        "answer tokens at most 60, cost $0.0920 - $0.2320"
    ) in stdout
    assert "cost: $0.0920 - $0.2320" in stdout
    assert mock.statistics().requests == 0  # no preflight, no call
    assert not out.exists() and not manifest_path(out).exists()


def test_dry_run_counts_calls_by_role_and_trials(tmp_path: Path) -> None:
    turns = [
        {"turn_id": "t0", "prompt_template": TEXT_A, "config": {"max_tokens": 10}},
        {"turn_id": "t1", "prompt_template": "Ask about {scenario}", "role": "user"},
    ]
    code, stdout, stderr = invoke(
        "run", str(pack(tmp_path, turns=turns)), "--user-model", "scripted",
        "--judge", "scripted", "--judge-samples", "2", "--metrics", "judge:helpful",
        "--trials", "3", "--max-tokens", "50", "--dry-run",
    )  # fmt: skip
    assert code == 0, stderr
    # 2 scenarios x 3 trials; each: 2 model calls, 1 user call, 2 turns x 2 judge samples
    assert "6 conversations, 12 turns" in stdout
    assert "model (scripted): 12 calls" in stdout
    assert "user (scripted): 6 calls" in stdout
    assert "judge (scripted/scripted): 24 calls" in stdout
    assert "cost: $0.0000 - $0.0000" in stdout  # offline models are free


async def test_the_estimate_bounds_the_prompts_the_model_is_sent(tmp_path: Path) -> None:
    """The low bound is what the prompts take with empty answers; answers of the
    FakeAdapter are short, so the real prompts fall inside the range."""
    model = FakeAdapter(lambda messages, params: "")
    async with Simulator(model) as sim:
        estimate = sim.estimate(pack(tmp_path, n=1))
        results = [r async for r in sim.run(pack(tmp_path, n=1))]
    assert results[0].status.value == "DONE"
    sent = sum((len(m.content) + 3) // 4 + 4 for messages, _ in model.calls for m in messages)
    model_role = estimate.roles["model"]
    assert model_role.prompt_tokens_low == sent == 32 + 14


def test_an_answer_without_a_cap_leaves_the_high_bound_unknown(
    tmp_path: Path, mock: MockModelServer
) -> None:
    turns = [{"turn_id": "t0", "prompt_template": TEXT_A}]
    code, stdout, _ = invoke(
        "run", str(pack(tmp_path, turns=turns)), *target(mock), *PRICED, "--dry-run"
    )
    assert code == 0
    assert "answer tokens no cap" in stdout
    assert "cost: $0.0280 - unbounded (no max_tokens cap)" in stdout  # 2 x 14 tokens


# -- --max-cost -----------------------------------------------------------------------------


class PricedAdapter(FakeAdapter):
    """A fake model at $0.01 a token, answering with ``words`` words."""

    def __init__(self, words: int = 3) -> None:
        super().__init__(lambda messages, params: " ".join(["w"] * words))

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        done = await super().generate(messages, params)
        prompt = sum(len(m.content) // 4 for m in messages)
        usage = Usage(prompt_tokens=prompt, completion_tokens=3, total_tokens=prompt + 3)
        return done.model_copy(update={"usage": usage})

    def estimate_cost(self, usage: Usage) -> Cost | None:
        prompt, completion = usage.prompt_tokens * 0.01, usage.completion_tokens * 0.01
        return Cost(prompt_cost=prompt, completion_cost=completion, total_cost=prompt + completion)


async def test_max_cost_starts_no_conversation_that_could_pass_it(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    packed = pack(tmp_path, n=6)
    async with Simulator(PricedAdapter(), concurrency=1, max_cost=1.5) as sim:
        bound = sim.estimate(packed, limit=1).cost_high
        handle = sim.run(packed, sink=JsonlSink(out))
        results = [r async for r in handle]
        stats = handle.statistics()
    assert bound is not None and bound <= 1.5  # the first conversation fits
    spent = sum(r.cost_usd or 0.0 for r in results)
    assert 0 < len(results) < 6 and spent <= 1.5
    assert {r.status.value for r in results} == {"DONE"}  # none cut short
    assert stats.stopped == "max_cost" and stats.cost_stop is not None
    assert stats.cost_usd == pytest.approx(spent)
    assert stats.started == len(results)  # the rest never started, nor were recorded
    assert len(out.read_text().splitlines()) == len(results)
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["stopped"] == "max_cost" and manifest["settings"]["max_cost"] == 1.5


async def test_max_cost_needs_a_price_for_every_model(tmp_path: Path) -> None:
    class Unpriced(FakeAdapter):
        def estimate_cost(self, usage: Usage) -> Cost | None:
            return None

    async with Simulator(Unpriced(name="free-or-not"), max_cost=1.0) as sim:
        with pytest.raises(ConfigError, match=r"none for free-or-not \(model\)"):
            sim.run(pack(tmp_path))


def test_max_cost_stops_cleanly_and_resume_runs_the_rest(
    tmp_path: Path, mock: MockModelServer
) -> None:
    out = tmp_path / "r.jsonl"
    packed = str(pack(tmp_path, n=6))
    common = [*target(mock), *PRICED, "--out", str(out), "--concurrency", "1", "--no-progress"]
    _, estimate, _ = invoke("run", packed, *common, "--dry-run", "--limit", "1")
    assert "cost: $" in estimate
    code, _, stderr = invoke("run", packed, *common, "--max-cost", "0.2")
    assert code == 6, stderr
    assert "stopped: max_cost" in stderr and "--resume" in stderr
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(first) < 6 and {r["status"] for r in first} == {"DONE"}
    assert sum(r["cost_usd"] for r in first) <= 0.2
    assert json.loads(manifest_path(out).read_text())["stopped"] == "max_cost"

    code, _, stderr = invoke("run", packed, *common, "--resume")
    assert code == 0, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["conversation_id"] for r in rows) == [f"s{i}" for i in range(6)]
    assert json.loads(manifest_path(out).read_text())["stopped"] is None


def test_max_cost_with_a_model_without_a_price_is_bad_input(
    tmp_path: Path, mock: MockModelServer
) -> None:
    out = tmp_path / "r.jsonl"
    code, _, stderr = invoke(
        "run", str(pack(tmp_path)), *target(mock), "--max-cost", "1", "--out", str(out)
    )
    assert code == 2
    assert "none for openai-compatible:mock-model (model)" in stderr
    assert "Traceback" not in stderr and not out.exists()


# -- models without a price -----------------------------------------------------------------


def test_a_model_without_a_price_is_named_and_its_cost_is_unknown(
    tmp_path: Path, mock: MockModelServer
) -> None:
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = invoke(
        "run", str(pack(tmp_path)), *target(mock), "--out", str(out), "--no-progress"
    )
    assert code == 0, stderr
    assert "cost unknown for openai-compatible:mock-model (model) (no price)" in stdout
    assert "$0.0000" not in stdout  # never shown as free
    summary = json.loads(out.with_name("r.summary.json").read_text())
    assert summary["unpriced"] == ["openai-compatible:mock-model (model)"]
    assert summary["cost_usd"] is None


# -- the price table ------------------------------------------------------------------------


def test_a_price_file_overrides_the_bundled_one_and_prices_cached_tokens(
    tmp_path: Path, mock: MockModelServer
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "openai-compatible": {"mock-model": [1000, 2000, 100]},
                "openai": {"gpt-4o-mini": {"input": 1, "output": 2}},
            }
        )
    )
    code, stdout, stderr = invoke(
        "run", str(pack(tmp_path)), *target(mock), "--dry-run", env={PRICING_ENV: str(prices)}
    )
    assert code == 0, stderr
    assert "cost: $0.0920 - $0.2320" in stdout  # as with input_price/output_price

    env = {PRICING_ENV: str(prices)}
    adapter = OpenAICompatibleAdapter({"model": "mock-model", "base_url": mock.base_url}, env=env)
    cost = adapter.estimate_cost(
        Usage(prompt_tokens=1000, completion_tokens=0, cached_prompt_tokens=400)
    )
    assert cost is not None and cost.total_cost == pytest.approx((600 * 1000 + 400 * 100) / 1e6)
    # an argument's input price is not mixed with the file's cached price
    given = OpenAICompatibleAdapter(
        {"model": "mock-model", "base_url": mock.base_url, "input_price": 10}, env=env
    ).estimate_cost(Usage(prompt_tokens=1000, cached_prompt_tokens=400))
    assert given is not None and given.total_cost == pytest.approx(1000 * 10 / 1e6)
    # the bundled entries the file does not name are kept, the ones it names replaced
    table = read_price_file(prices)
    assert table.price_of("openai", "gpt-4o-mini") == (1.0, 2.0, None)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ('{"openai": {"gpt-4o": [2.5, "ten"]}}', "openai.gpt-4o.output"),
        ('{"openai": {"gpt-4o": [2.5]}}', "openai.gpt-4o"),
        ('{"openai": {"gpt-4o": {"input": 1, "outptu": 2}}}', "'outptu'"),
        ('{"openai": {"gpt-4o": [-1, 2]}}', "openai.gpt-4o.input"),
        ('{"openai": [1, 2]}', "openai"),
        ("{not json", "not a JSON price file"),
    ],
)
def test_a_bad_price_file_is_bad_input_naming_file_and_field(
    tmp_path: Path, mock: MockModelServer, content: str, field: str
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(content)
    code, _, stderr = invoke(
        "run", str(pack(tmp_path)), *target(mock), "--dry-run", env={PRICING_ENV: str(prices)}
    )
    assert code == 2
    assert str(prices) in stderr and field in stderr
    assert "Traceback" not in stderr


def test_a_missing_price_file_is_bad_input(tmp_path: Path, mock: MockModelServer) -> None:
    args = [*target(mock), "--model-arg", f"pricing_file={tmp_path / 'none.json'}"]
    code, _, stderr = invoke("run", str(pack(tmp_path)), *args, "--dry-run")
    assert code == 2 and "none.json: cannot read the price file" in stderr


def test_servers_report_cached_prompt_tokens() -> None:
    openai = openai_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    )
    assert openai is not None and (openai.prompt_tokens, openai.cached_prompt_tokens) == (100, 64)
    # Anthropic counts cache reads and writes apart from input_tokens
    anthropic = anthropic_usage(
        {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 80,
            "cache_creation_input_tokens": 10,
        }
    )
    assert anthropic is not None
    assert (anthropic.prompt_tokens, anthropic.cached_prompt_tokens) == (100, 80)
    assert (Usage(cached_prompt_tokens=3) + Usage(cached_prompt_tokens=4)).cached_prompt_tokens == 7


async def test_a_cost_stop_ends_admission_at_once(tmp_path: Path) -> None:
    """The conversations after the stop are not walked one by one (each logging the
    stop again): admission ends where the cap was reached."""
    packed = pack(tmp_path, n=300)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with capture_logs() as logs:
            async with Simulator(
                PricedAdapter(), concurrency=64, max_cost=1.5, max_loop_lag=None
            ) as sim:
                results = [r async for r in sim.run(packed)]
    finally:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    assert 0 < len(results) < 300
    stops = [e for e in logs if e["event"] == "run_stopped_early"]
    assert len(stops) == 1 and stops[0]["reason"] == "max_cost"

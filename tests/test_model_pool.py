"""One owner for building models: the pool builds adapters from references (one per
distinct reference), shares one set of budgets, sizes pools, splits rpm/tpm among
workers, checks endpoints and closes what it built (and nothing else)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from conftest import FakeAdapter
from hypothesis import given
from hypothesis import strategies as st

import convsim
from convsim import ConfigError, EndpointError, ModelRef, Simulator, SimulatorConfig
from convsim.adapters import ADAPTERS, Budgets, ModelAdapter, ModelPool, split_limits
from convsim.adapters._openai import OpenAICompatibleAdapter
from convsim.adapters._scripted import ScriptedAdapter

pytestmark = pytest.mark.anyio


class Endpoint(FakeAdapter):
    """A fake adapter with a connection key, a check and a close that can be made to
    fail or wait."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(name=str(config.get("model", "fake")))
        self.config = dict(config)
        self.checks = 0
        self.shared: list[Budgets] = []
        self.sized: list[int] = []

    def connection_key(self) -> str | None:
        return self.config.get("key")

    def rate_limits(self) -> convsim.adapters.RateLimits:
        cap = self.config.get("concurrency")
        return convsim.adapters.RateLimits(concurrency=None if cap is None else int(cap))

    def share_budgets(self, budgets: Budgets) -> None:
        self.shared.append(budgets)

    def size_pool(self, concurrency: int) -> None:
        self.sized.append(concurrency)

    async def preflight(self) -> None:
        self.checks += 1
        gate = self.config.get("gate")
        if gate is not None:
            await gate.wait()
        if self.config.get("down"):
            raise EndpointError("http://down.test/v1: connection refused", url="http://down.test")

    async def aclose(self) -> None:
        await anyio.lowlevel.checkpoint()  # a real close awaits: it must run when cancelled
        self.closed = True
        if self.config.get("close_fails"):
            raise OSError(f"{self.name} would not close")


def registry() -> Any:
    copy = ADAPTERS.copy()
    copy.register("endpoint", Endpoint)
    return copy


def pool(**kwargs: Any) -> ModelPool:
    return ModelPool(registry=registry(), **kwargs)


# -- one adapter per distinct reference -------------------------------------------------


def test_one_adapter_per_distinct_reference() -> None:
    models = pool()
    first = models.get("endpoint:a", {"key": "k"})
    assert models.get("endpoint:a", {"key": "k"}) is first
    assert models.get("endpoint", {"model": "a", "key": "k"}) is first  # the same model
    assert models.get(ModelRef(spec="endpoint:a", args={"key": "k"})) is first
    other_args = models.get("endpoint:a", {"key": "k2"})
    other_model = models.get("endpoint:b", {"key": "k"})
    assert len({id(first), id(other_args), id(other_model)}) == 3
    assert models.adapters() == [first, other_args, other_model]


def test_a_callers_adapter_is_taken_as_it_is_and_held_once() -> None:
    models = pool(concurrency=8)
    mine = Endpoint({"model": "mine"})
    assert models.get(mine, role="model under test") is mine
    assert models.get(mine, role="judge") is mine
    assert models.adapters() == [mine]
    assert mine.sized == []  # the caller's pool stays as the caller made it
    assert mine.shared == [models.budgets]


def test_bad_references_fail_clearly_and_leave_nothing_behind() -> None:
    models = pool()
    with pytest.raises(ConfigError, match="invalid model spec"):
        models.get("no spec!")
    with pytest.raises(convsim.RegistryError, match="no-such"):
        models.get("no-such:m")
    with pytest.raises(ConfigError, match="go with a model spec, not an adapter"):
        models.get(Endpoint({}), {"key": "k"})
    with pytest.raises(ConfigError, match="carries its arguments"):
        models.get(ModelRef(spec="endpoint:a"), {"key": "k"})
    with pytest.raises(ConfigError, match="a int is not a model: give a spec"):
        models.get(42)  # type: ignore[arg-type]
    odd = registry()
    odd.register("odd", lambda config: object())
    with pytest.raises(ConfigError, match="odd: the registered factory made a object"):
        ModelPool(registry=odd).get("odd")
    with pytest.raises(ConfigError, match="concurrency must be at least 1"):
        ModelPool(concurrency=0)
    assert models.adapters() == []


# -- budgets and pool sizes -------------------------------------------------------------


def test_everything_built_shares_one_budgets_object() -> None:
    models = pool()
    a, b = models.get("endpoint:a"), models.get("endpoint:b")
    assert a.shared == b.shared == [models.budgets]
    given_budgets = Budgets()
    assert ModelPool(budgets=given_budgets).budgets is given_budgets


def test_http_adapters_with_one_key_share_one_rate_budget() -> None:
    models = ModelPool(concurrency=5)
    args = {"base_url": "http://llm.test/v1", "api_key": "sk-a"}
    a = models.get("openai-compatible:a", {**args, "rpm": 600})
    b = models.get("openai-compatible:b", {**args, "rpm": 60})
    other = models.get("openai-compatible:c", {**args, "api_key": "sk-b"})
    assert isinstance(a, OpenAICompatibleAdapter) and isinstance(b, OpenAICompatibleAdapter)
    assert isinstance(other, OpenAICompatibleAdapter)
    assert a.budget() is b.budget() and a.budget().limits.rpm == 60  # the stricter
    assert other.budget() is not a.budget()
    assert len(models.budgets.statistics()) == 2


def test_pools_are_sized_for_the_concurrency_unless_set() -> None:
    models = ModelPool(concurrency=5)
    unset = models.get("openai-compatible:a", {"base_url": "http://llm.test/v1"})
    own = models.get("openai-compatible:b", {"base_url": "http://llm.test/v1", "concurrency": 3})
    mine = OpenAICompatibleAdapter({"model": "c", "base_url": "http://llm.test/v1"}, env={})
    models.get(mine)
    unsized = ModelPool().get("openai-compatible:a", {"base_url": "http://llm.test/v1"})
    assert unset.rate_limits().concurrency == 5
    assert own.rate_limits().concurrency == 3
    assert mine.rate_limits().concurrency == 64  # a caller's adapter keeps its own
    assert unsized.rate_limits().concurrency == 64


def test_connections_needed_counts_each_server_model_at_its_cap() -> None:
    models = pool(concurrency=10)
    models.get("endpoint:a", {"key": "k1"})  # no cap of its own: the concurrency
    models.get("endpoint:b", {"key": "k2", "concurrency": 3})  # its own, smaller cap
    models.get("endpoint:c", {"key": "k3", "concurrency": 50})  # never above the concurrency
    models.get("endpoint:d")  # no server: no connections
    assert models.connections_needed() == 10 + 3 + 10


async def test_an_adapter_with_only_the_default_hooks_works() -> None:
    reg = registry()
    reg.register("plain", lambda config: FakeAdapter(name="plain"))
    async with ModelPool(concurrency=4, registry=reg) as models:
        plain = models.get("plain", role="model under test")
        scripted = models.get("scripted")
        await models.preflight()
        answer = await plain.generate(
            [convsim.adapters.Message(role="user", content="hi")],
            convsim.adapters.GenerationParams(),
        )
        assert answer.text == "reply 1"
        assert isinstance(scripted, ScriptedAdapter)
        assert models.connections_needed() == 0  # neither talks to a server
    assert isinstance(plain, FakeAdapter) and plain.closed


def test_an_adapter_written_for_bind_budgets_still_gets_the_budgets() -> None:
    bound: list[tuple[Budgets, int | None]] = []

    class Legacy(FakeAdapter):
        def bind_budgets(self, budgets: Budgets, *, concurrency: int | None = None) -> None:
            bound.append((budgets, concurrency))

    models = ModelPool(concurrency=6)
    with pytest.warns(DeprecationWarning, match=r"share_budgets\(budgets\) and size_pool"):
        models.get(Legacy())
    reg = registry()
    reg.register("legacy", lambda config: Legacy())
    built = ModelPool(concurrency=6, registry=reg)
    with pytest.warns(DeprecationWarning):
        built.get("legacy")
    assert bound == [(models.budgets, None), (built.budgets, 6)]


# -- splitting rpm and tpm among workers --------------------------------------------------


def test_split_limits_deals_whole_units_and_copies_the_rest() -> None:
    shares = split_limits({"rpm": "100", "tpm": 90_000, "base_url": "x"}, 3)
    assert [s["rpm"] for s in shares] == [34, 33, 33]
    assert [s["tpm"] for s in shares] == [30_000] * 3
    assert all(s["base_url"] == "x" for s in shares)
    assert split_limits({"rpm": "2"}, 4) == [{"rpm": 0.5}] * 4  # below one each: fractions
    assert split_limits({"rpm": 7.5}, 2) == [{"rpm": 3.75}] * 2  # a fraction stays one
    assert split_limits({"base_url": "x"}, 2) == [{"base_url": "x"}] * 2
    assert split_limits({"rpm": "60"}, 1) == [{"rpm": 60}]


@pytest.mark.parametrize(
    ("args", "workers", "message"),
    [
        ({"rpm": "fast"}, 2, "model argument rpm='fast' is not a number"),
        ({"tpm": "-5"}, 2, "model argument tpm='-5' must be a number above 0"),
        ({"rpm": "nan"}, 2, "must be a number above 0"),
        ({"rpm": "60"}, 0, "cannot split model limits among 0 workers"),
    ],
)
def test_split_limits_refuses_what_cannot_be_split(
    args: dict[str, Any], workers: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        split_limits(args, workers)


@given(total=st.integers(min_value=1, max_value=10**7), workers=st.integers(1, 64))
def test_whole_shares_add_up_exactly_and_none_is_zero(total: int, workers: int) -> None:
    parts = [s["rpm"] for s in split_limits({"rpm": str(total)}, workers)]
    assert len(parts) == workers
    if total >= workers:
        assert sum(parts) == total
        assert min(parts) >= 1 and max(parts) - min(parts) <= 1
    else:
        assert all(p > 0 for p in parts) and math.isclose(sum(parts), total)


@given(
    total=st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False),
    workers=st.integers(1, 64),
)
def test_any_total_splits_into_positive_shares_that_add_up(total: float, workers: int) -> None:
    parts = [s["tpm"] for s in split_limits({"tpm": total}, workers)]
    assert all(p > 0 for p in parts)
    assert math.isclose(sum(parts), total, rel_tol=1e-9)


# -- the check before a run ---------------------------------------------------------------


async def test_preflight_names_the_failing_endpoint_by_its_role_else_its_reference() -> None:
    models = pool()
    models.get("endpoint:up", {"key": "k1"}, role="model under test")
    models.get("endpoint:down", {"key": "k2", "down": True}, role="judge")
    with pytest.raises(EndpointError, match=r"^judge: http://down\.test/v1: connection refused"):
        await models.preflight()
    unnamed = pool()
    unnamed.get("endpoint:down", {"down": True})
    with pytest.raises(EndpointError, match=r"^endpoint:down: http://down\.test") as caught:
        await unnamed.preflight()
    assert caught.value.url == "http://down.test"
    both = pool()
    both.get("endpoint:down", {"down": True}, role="simulated user")
    both.get("endpoint:down", {"down": True}, role="judge")
    with pytest.raises(EndpointError, match=r"^simulated user and judge: "):
        await both.preflight()


async def test_preflight_checks_each_endpoint_once() -> None:
    models = pool()
    a = models.get("endpoint:a", {"key": "shared"})
    b = models.get("endpoint:b", {"key": "shared"})  # the same server and key
    c = models.get("endpoint:c")  # no key: checked on its own
    mine = Endpoint({"model": "mine"})
    models.get(mine, role="judge")
    models.get(mine, role="simulated user")
    await models.preflight()
    assert (a.checks, b.checks, c.checks, mine.checks) == (1, 0, 1, 1)


# -- closing --------------------------------------------------------------------------------


async def test_close_closes_what_was_built_and_nothing_else() -> None:
    mine = Endpoint({"model": "mine"})
    async with pool() as models:
        built = [models.get("endpoint:a"), models.get("endpoint:b")]
        models.get(mine)
    assert all(a.closed for a in built)
    assert not mine.closed
    assert models.adapters() == []


async def test_one_failing_close_does_not_keep_the_others_open() -> None:
    models = pool()
    first = models.get("endpoint:a", {"close_fails": True})
    second = models.get("endpoint:b", {"close_fails": True})
    third = models.get("endpoint:c")
    with pytest.raises(OSError, match="a would not close"):
        await models.aclose()
    assert first.closed and second.closed and third.closed


async def test_the_bodys_error_wins_over_a_failing_close() -> None:
    with pytest.raises(KeyError):
        async with pool() as models:
            failing = models.get("endpoint:a", {"close_fails": True})
            raise KeyError("the body's")
    assert failing.closed


async def test_a_closed_pool_builds_afresh_rather_than_hand_out_closed_adapters() -> None:
    models = pool()
    old = models.get("endpoint:a")
    await models.aclose()
    new = models.get("endpoint:a")
    assert new is not old and not new.closed


async def test_cancelled_while_building_closes_what_was_built() -> None:
    gate = anyio.Event()
    mine = Endpoint({"model": "mine"})
    built: list[ModelAdapter] = []

    async def set_up() -> None:
        async with pool() as models:
            built.append(models.get("endpoint:a"))
            models.get(mine)
            built.append(models.get("endpoint:slow", {"gate": gate}))
            await models.preflight()  # waits on the gate: cancelled here
            built.append(models.get("endpoint:never"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(set_up)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert len(built) == 2 and all(a.closed for a in built)
    assert not mine.closed and not gate.is_set()


async def test_a_failed_build_closes_the_ones_before_it() -> None:
    with pytest.raises(convsim.RegistryError):
        async with pool() as models:
            first = models.get("endpoint:a")
            models.get("no-such:m")
    assert first.closed


# -- the callers -----------------------------------------------------------------------------


async def test_the_simulator_builds_one_adapter_for_a_reference_used_twice() -> None:
    reg = registry()
    config = SimulatorConfig(
        model=ModelRef(spec="endpoint:m", args={"key": "k"}),
        judge={"model": ModelRef(spec="endpoint:m", args={"key": "k"})},
        user_model=ModelRef(spec="endpoint:u", args={"close_fails": True}),
        concurrency=7,
    )
    sim = Simulator(config, adapter_registry=reg)
    assert sim.judge is not None and sim.judge.adapter is sim.model
    assert isinstance(sim.model, Endpoint) and isinstance(sim.user_model, Endpoint)
    assert sim.model.sized == [7] and sim.model.shared == [sim.budgets]
    with pytest.raises(OSError, match="would not close"):
        async with sim:
            pass
    assert sim.model.checks == 1 and sim.model.closed and sim.user_model.closed


def test_each_load_worker_gets_its_share_of_the_limits() -> None:
    from convsim.load._plan import LoadPlan, _model_args

    plan = LoadPlan(model_args={"rpm": "100", "tpm": "9000", "stream": "false"})
    shares = [_model_args(plan, w, 3) for w in range(3)]
    assert [s["rpm"] for s in shares] == [34, 33, 33]
    assert sum(s["tpm"] for s in shares) == 9000
    assert all(s["stream"] == "false" and s["max_retries"] == "0" for s in shares)
    probe = _model_args(LoadPlan(), stream=False)
    assert probe == {"stream": "false", "max_retries": "0", "http": "lean"}  # the lean seam

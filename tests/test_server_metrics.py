"""Server metrics in load runs (``--server-metrics``): each server family's names mapped
to the common set from two scrapes of its real text format, figures a server does not
expose left null, scrapes that fail or find no metrics, the interval driven by an
injected sleep, and a whole run against the mock server's ``/metrics``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from click.testing import CliRunner

from convsim.adapters.mock import MockModelServer, MockServerConfig
from convsim.cli import main
from convsim.load._scraper import NotPrometheus, ServerScraper, metrics_url, parse_exposition
from convsim.load._server_figures import Scrape, server_figures, server_sample

# -- captured-format pages, two scrapes each (values moved as a load would move them) ---

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {usage}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {preempted}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {prompt}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {generated}
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {queries}
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {hits}
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {ttft_sum}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.02",model_name="Qwen/Qwen3-0.6B"}} {b1}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.04",model_name="Qwen/Qwen3-0.6B"}} {b2}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="Qwen/Qwen3-0.6B"}} {b3}
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="Qwen/Qwen3-0.6B"}} {b3}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="Qwen/Qwen3-0.6B"}} {b3}
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
"""

SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="Llama-3.1-8B"}} {prompt}
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="Llama-3.1-8B"}} {generated}
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{cache_source="device",model_name="Llama-3.1-8B"}} {hits}
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="Llama-3.1-8B"}} {usage}
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="Llama-3.1-8B"}} 0.007507552643049313
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="Llama-3.1-8B"}} {running}
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="Llama-3.1-8B"}} {waiting}
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{{model_name="Llama-3.1-8B"}} {ttft_sum}
sglang:time_to_first_token_seconds_bucket{{le="0.02",model_name="Llama-3.1-8B"}} {b1}
sglang:time_to_first_token_seconds_bucket{{le="0.04",model_name="Llama-3.1-8B"}} {b2}
sglang:time_to_first_token_seconds_bucket{{le="0.1",model_name="Llama-3.1-8B"}} {b3}
sglang:time_to_first_token_seconds_bucket{{le="+Inf",model_name="Llama-3.1-8B"}} {b3}
sglang:time_to_first_token_seconds_count{{model_name="Llama-3.1-8B"}} {b3}
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size {waiting}
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size {running}
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
# TYPE tgi_request_count counter
tgi_request_count 253
# TYPE tgi_request_input_length histogram
tgi_request_input_length_bucket{{le="1000"}} 10
tgi_request_input_length_bucket{{le="+Inf"}} 10
tgi_request_input_length_sum {prompt}
tgi_request_input_length_count 10
# TYPE tgi_request_generated_tokens histogram
tgi_request_generated_tokens_bucket{{le="1000"}} 10
tgi_request_generated_tokens_bucket{{le="+Inf"}} 10
tgi_request_generated_tokens_sum {generated}
tgi_request_generated_tokens_count 10
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {generated}
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio {usage}
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {running}
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {waiting}
"""

FIRST = dict(
    running=2, waiting=0, usage=0.10, preempted=1, prompt=1000, generated=500,
    queries=1000, hits=200, ttft_sum=1.0, b1=10, b2=30, b3=40,
)  # fmt: skip
LATER = dict(
    running=6, waiting=4, usage=0.30, preempted=3, prompt=21000, generated=4500,
    queries=21000, hits=15200, ttft_sum=3.0, b1=30, b2=70, b3=80,
)  # fmt: skip
"""Ten seconds apart: 20,000 prompt tokens (15,000 of them cached), 4,000 generated,
two preemptions, and 40 more first tokens (20 under 20 ms, 20 between 20 and 40 ms)
taking 2 s in all."""


def _scrapes(page: str, point: int = 0) -> list[Scrape]:
    return [
        Scrape(0.0, point, parse_exposition(page.format(**FIRST))),
        Scrape(10.0, point, parse_exposition(page.format(**LATER))),
    ]


def test_vllm_names_map_to_the_common_set() -> None:
    figures = server_figures("http://h:8000/metrics", _scrapes(VLLM))
    assert figures is not None and figures.family == "vllm"
    assert (figures.scrapes, figures.span_s) == (2, 10.0)
    assert figures.kv_cache_usage is not None
    assert (figures.kv_cache_usage.mean, figures.kv_cache_usage.max) == pytest.approx((0.2, 0.3))
    assert figures.running is not None and figures.running.last == 6
    assert figures.waiting is not None and figures.waiting.max == 4
    assert figures.preemptions == 2
    assert figures.prompt_throughput == pytest.approx(2000.0)  # 20,000 tokens in 10 s
    assert figures.generation_throughput == pytest.approx(400.0)
    assert figures.prefix_cache_hit_rate == pytest.approx(15000 / 20000)
    assert figures.ttft is not None
    assert figures.ttft.count == 40 and figures.ttft.mean_ms == pytest.approx(50.0)
    assert figures.ttft.p50_ms == pytest.approx(20.0)  # the 20th of 40, at the bucket's edge
    # raw: the server's own series (not the process's, not the buckets)
    assert 'vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-0.6B"}' in figures.raw
    assert not any(k.startswith("python_") or "_bucket" in k for k in figures.raw)


def test_sglang_names_map_to_the_common_set() -> None:
    figures = server_figures("u", _scrapes(SGLANG))
    assert figures is not None and figures.family == "sglang"
    assert figures.kv_cache_usage is not None and figures.kv_cache_usage.last == 0.3
    assert figures.running is not None and figures.waiting is not None
    assert (figures.running.last, figures.waiting.last) == (6, 4)
    assert figures.prompt_throughput == pytest.approx(2000.0)
    # hit rate from the counters' change, not the server's own (lifetime) gauge
    assert figures.prefix_cache_hit_rate == pytest.approx(15000 / 20000)
    assert figures.ttft is not None and figures.ttft.mean_ms == pytest.approx(50.0)
    assert figures.preemptions is None  # not in this page: null, not 0


def test_tgi_names_map_and_what_tgi_lacks_is_null() -> None:
    figures = server_figures("u", _scrapes(TGI))
    assert figures is not None and figures.family == "tgi"
    assert figures.running is not None and figures.running.last == 6
    assert figures.waiting is not None and figures.waiting.last == 4
    assert figures.prompt_throughput == pytest.approx(2000.0)  # the input lengths' sum
    assert figures.generation_throughput == pytest.approx(400.0)
    assert figures.kv_cache_usage is None
    assert figures.prefix_cache_hit_rate is None
    assert figures.preemptions is None and figures.ttft is None


def test_llamacpp_names_map_to_the_common_set() -> None:
    figures = server_figures("u", _scrapes(LLAMACPP))
    assert figures is not None and figures.family == "llamacpp"
    assert figures.kv_cache_usage is not None and figures.kv_cache_usage.max == 0.3
    assert figures.running is not None and figures.waiting is not None
    assert (figures.running.mean, figures.waiting.mean) == (4, 2)
    assert figures.prompt_throughput == pytest.approx(2000.0)
    assert figures.generation_throughput == pytest.approx(400.0)
    assert figures.prefix_cache_hit_rate is None and figures.ttft is None


def test_one_scrape_gives_gauges_but_no_rates() -> None:
    figures = server_figures("u", _scrapes(VLLM)[:1])
    assert figures is not None and figures.running is not None
    assert figures.span_s is None
    assert figures.prompt_throughput is None and figures.prefix_cache_hit_rate is None
    assert figures.ttft is None and figures.preemptions is None


def test_a_counter_that_went_down_gives_no_rate() -> None:
    """The server restarted between the scrapes: its counters began again."""
    later, first = _scrapes(VLLM)
    restarted = [Scrape(0.0, 0, first.samples), Scrape(10.0, 0, later.samples)]
    figures = server_figures("u", restarted)
    assert figures is not None
    assert figures.prompt_throughput is None and figures.preemptions is None
    assert figures.prefix_cache_hit_rate is None


def test_unknown_names_keep_raw_series_and_no_figures() -> None:
    page = "# TYPE my_queue gauge\nmy_queue 3\n"
    figures = server_figures("u", [Scrape(0.0, 0, parse_exposition(page))] * 2)
    assert figures is not None and figures.family is None
    assert figures.running is None and figures.kv_cache_usage is None
    assert figures.raw == {"my_queue": 3.0}


def test_raw_is_bounded() -> None:
    page = "".join(f'vllm:x{{i="{i}"}} {i}\n' for i in range(1000))
    figures = server_figures("u", [Scrape(0.0, 0, parse_exposition(page))])
    assert figures is not None and len(figures.raw) == 256


def test_the_timeline_has_gauges_at_each_scrape_and_rates_since_the_one_before() -> None:
    first, later = _scrapes(VLLM)
    start = server_sample(first, None)
    assert start.running == 2 and start.prompt_throughput is None
    moved = server_sample(later, first)
    assert moved.prompt_throughput == pytest.approx(2000.0)
    assert moved.prefix_cache_hit_rate == pytest.approx(0.75)
    other_point = server_sample(Scrape(20.0, 1, later.samples), later)
    assert other_point.prompt_throughput is None  # no rate across two points


@pytest.mark.parametrize(
    "text", ["<html><body>Not here</body></html>", '{"detail": "Not Found"}', ""]
)
def test_what_is_not_prometheus_text_is_told_apart(text: str) -> None:
    with pytest.raises(NotPrometheus):
        parse_exposition(text)


def test_the_default_url_is_the_base_urls_origin() -> None:
    assert metrics_url("auto", "http://10.0.0.2:8000/v1") == "http://10.0.0.2:8000/metrics"
    assert metrics_url("auto", "https://host/api/v1/") == "https://host/metrics"
    assert metrics_url("http://h:9090/m", "http://x/v1") == "http://h:9090/m"
    assert metrics_url("auto", None) is None and metrics_url("auto", "not a url") is None


# -- the scraper ---------------------------------------------------------------------


def _page(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, text=VLLM.format(**FIRST))


async def _scraper(
    handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any
) -> tuple[ServerScraper, list[str]]:
    told: list[str] = []
    scraper = ServerScraper(
        "http://h/metrics", report=told.append, transport=httpx.MockTransport(handler), **kwargs
    )
    return scraper, told


@pytest.mark.anyio
async def test_each_point_is_scraped_at_its_start_every_interval_and_its_end() -> None:
    slept: list[float] = []
    three_done = anyio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) > 3:
            three_done.set()
            await anyio.sleep_forever()

    scraper, told = await _scraper(_page, interval_s=2.5, sleep=sleep)
    async with scraper, scraper.watching(0):
        await three_done.wait()  # the point lasts three intervals
    figures = scraper.figures(0)
    assert figures is not None and figures.scrapes == 5  # start, 3 intervals, end
    assert slept == [2.5] * 4 and told == []
    assert [s.point for s in scraper.timeline()] == [0] * 5


@pytest.mark.anyio
async def test_a_short_point_still_gets_a_start_and_an_end() -> None:
    async def never(_seconds: float) -> None:
        await anyio.sleep_forever()

    scraper, _ = await _scraper(_page, sleep=never)
    async with scraper:
        async with scraper.watching(0):
            pass
        async with scraper.watching(1):
            pass
    first, second = scraper.figures(0), scraper.figures(1)
    assert first is not None and second is not None
    assert (first.scrapes, second.scrapes) == (2, 2)
    assert scraper.figures(2) is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("response", "said"),
    [
        (httpx.Response(404, text="Unknown path /metrics"), "answered HTTP 404"),
        (httpx.Response(200, text="<html>a proxy's page</html>"), "something else than"),
    ],
)
async def test_an_endpoint_without_metrics_is_told_once_and_given_up(
    response: httpx.Response, said: str
) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return response

    scraper, told = await _scraper(handler)
    async with scraper:
        for point in range(3):
            async with scraper.watching(point):
                pass
    assert len(calls) == 1  # not asked again
    assert len(told) == 1 and said in told[0] and "going on without them" in told[0]
    assert scraper.figures(0) is None and scraper.timeline() == []


@pytest.mark.anyio
async def test_a_failed_scrape_is_counted_and_the_next_is_tried() -> None:
    answers = iter([httpx.ConnectError("refused"), None, httpx.ReadTimeout("slow"), None])

    def handler(request: httpx.Request) -> httpx.Response:
        error = next(answers)
        if error is not None:
            raise error
        return _page(request)

    scraper, told = await _scraper(handler)
    async with scraper:
        for _ in range(4):
            await scraper.scrape(0)
    figures = scraper.figures(0)
    assert figures is not None and (figures.scrapes, figures.failed_scrapes) == (2, 2)
    assert len(told) == 1 and "ConnectError" in told[0]


@pytest.mark.anyio
async def test_an_error_in_the_point_comes_out_as_itself() -> None:
    scraper, _ = await _scraper(_page)
    with pytest.raises(KeyError):
        async with scraper, scraper.watching(0):
            raise KeyError("the point failed")


# -- a whole run against the mock server ---------------------------------------------


@pytest.fixture(scope="module")
def mock() -> Iterator[Any]:
    with start_blocking_portal() as portal:
        server = MockModelServer(MockServerConfig(ttft_ms=2, itl_ms=0))
        with portal.wrap_async_context_manager(server) as running:
            yield running


def _load(mock: Any, tmp_path: Path, *more: str) -> tuple[int, str, str, dict[str, Any]]:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        main,
        [
            "load", "--model", "openai-compatible:mock-model", "--base-url", mock.base_url,
            "--synthetic", "turns=4,input_tokens=64,output_tokens=16", "-c", "2",
            "--max-requests", "40", "--no-calibrate", "--out", str(out), *more,
        ],
        catch_exceptions=False,
    )  # fmt: skip
    data = json.loads(out.read_text()) if out.exists() else {}
    return result.exit_code, result.stdout, result.stderr, data


def test_a_run_against_the_mock_reads_its_metrics(mock: Any, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    code, stdout, stderr, data = _load(mock, tmp_path, "--server-metrics", "--html", str(html))
    assert code == 0, stderr
    figures = data["server_metrics"]
    assert figures["url"] == mock.url + "/metrics" and figures["family"] == "vllm"
    assert figures["scrapes"] >= 2 and figures["failed_scrapes"] == 0
    assert figures["prompt_throughput"] > 0 and figures["generation_throughput"] > 0
    assert 0 < figures["prefix_cache_hit_rate"] < 1
    assert figures["running"]["max"] <= 2  # two sessions at a time
    assert figures["waiting"]["max"] == 0 and figures["preemptions"] == 0
    assert figures["ttft"]["count"] >= 40
    assert any(k.startswith("vllm:prefix_cache_hits_total") for k in figures["raw"])
    timeline = data["server_metrics_timeline"]
    assert len(timeline) == figures["scrapes"] and timeline[0]["point"] == 0
    assert "server (vllm" in stdout
    page = html.read_text()
    assert 'id="server-metrics"' in page and 'id="plot-server"' in page


def test_an_endpoint_that_is_not_there_is_told_and_the_run_goes_on(
    mock: Any, tmp_path: Path
) -> None:
    code, _, stderr, data = _load(mock, tmp_path, f"--server-metrics={mock.url}/nowhere")
    assert code == 0, stderr
    assert stderr.count("server metrics:") == 1 and "answered HTTP 404" in stderr
    assert data["server_metrics"] is None and data["server_metrics_timeline"] == []
    assert data["requests"]["completed"] >= 40


def test_without_the_option_nothing_is_scraped(mock: Any, tmp_path: Path) -> None:
    before = mock.statistics().by_endpoint["/metrics"]
    code, _, stderr, data = _load(mock, tmp_path)
    assert code == 0, stderr
    assert data["server_metrics"] is None and data["server_metrics_timeline"] is None
    assert mock.statistics().by_endpoint["/metrics"] == before


@pytest.mark.parametrize("interval", ["0", "-1", "x"])
def test_a_bad_interval_is_bad_input(interval: str) -> None:
    result = CliRunner().invoke(
        main,
        ["load", "--model", "scripted", "-c", "1", "--server-metrics-interval", interval],
    )
    assert result.exit_code == 2 and "--server-metrics-interval" in result.stderr

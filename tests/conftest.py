from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

# the guide's integration tests (tests/guide) get their live service from here
from _guide_service import guide_service, live_service_for_integration_tests  # noqa: F401

from convsim.adapters import Completion, GenerationParams, Message, ModelAdapter, ModelInfo, Usage

_DATASETS_CACHE = "HF_DATASETS_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    """Datasets the tests load from files are cached in a folder of the run's own, not in
    the user's ~/.cache/huggingface (each run left thousands of entries there)."""
    if _DATASETS_CACHE not in os.environ:
        import tempfile

        os.environ[_DATASETS_CACHE] = tempfile.mkdtemp(prefix="convsim-tests-datasets-")
        config.stash[_OWN_CACHE] = os.environ[_DATASETS_CACHE]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_CACHE, None)
    if own is not None:
        import shutil

        shutil.rmtree(own, ignore_errors=True)


_OWN_CACHE = pytest.StashKey[str]()


DATA = Path(__file__).parent / "data"


def write_pack(folder: Path, flows: dict[str, Any], scenarios: list[dict[str, Any]]) -> Path:
    """A multi-turn pack folder from flows and scenario dicts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "turn_configs.yml").write_text(
        yaml.safe_dump(flows, sort_keys=False), encoding="utf-8"
    )
    (folder / "scenarios.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in scenarios), encoding="utf-8"
    )
    return folder


_SERIAL_GROUPS = {
    "test_ray.py": "ray",  # each test starts a Ray of its own: one at a time
    "test_guide_service.py": "guide-service",  # the guide's service on port 8000
    "test_guide_service_fixture.py": "guide-service",
    "test_integration.py": "guide-service",
}
"""Test files whose tests run in one pytest-xdist worker, one after another: they hold a
fixed port, or take every core themselves. Every other test may run on any worker."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scope scheduling, with each test its own scope except the groups
    above. (Its ``xdist_group`` marks do not group under pytest 9.2: xdist renames the
    node ids through an attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class _Grouped(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return _SERIAL_GROUPS.get(file, nodeid)

    return _Grouped(config, log)


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ManualClock(asyncio.SelectorEventLoop):
    """An asyncio event loop whose clock stands still until the test moves it on.

    Deadlines (conversation timeouts, grace periods) then pass exactly when the test says
    so, however slow or loaded the machine is: trio's MockClock, for asyncio. Work that
    needs no time (fake adapters answering, events, worker threads) runs as usual.
    """

    def __init__(self) -> None:
        self._now = time.monotonic()
        super().__init__()

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


manual_clock = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"loop_factory": ManualClock}), id="manual_clock")]
)
"""Run the test on a :class:`ManualClock`; :func:`clock` moves it. The global test timeout
guards against hangs: deadlines on this clock only pass when the test moves it."""


def clock() -> ManualClock:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, ManualClock), "the test needs @manual_clock"
    return loop


class FakeAdapter(ModelAdapter):
    """A test adapter: answers or raises per call, records what it was sent. Only
    generate() is its own work; the hooks are ModelAdapter's defaults but for its name."""

    def __init__(self, behave=None, *, name: str = "fake") -> None:
        self.behave = behave or (lambda messages, params: f"reply {len(messages)}")
        self.calls: list[tuple[tuple[Message, ...], GenerationParams]] = []
        self.name = name
        self.closed = False

    def model_info(self) -> ModelInfo:
        return ModelInfo(model_id=self.name, model_type="fake", provider="tests")

    async def generate(self, messages: Sequence[Message], params: GenerationParams) -> Completion:
        self.calls.append((tuple(messages), params))
        out = self.behave(messages, params)
        if hasattr(out, "__await__"):
            out = await out
        if isinstance(out, BaseException):
            raise out
        return Completion(
            text=out, usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        )

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fake_adapter() -> type[FakeAdapter]:
    return FakeAdapter


class Convsim:
    """``python -m convsim ARGS`` in a subprocess, its stderr read line by line as it
    comes (stdout is not kept), so that a test can wait for what the run prints.
    Leaving the ``with`` block kills the process if it is still running."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "convsim", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> Convsim:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self._stderr.append(line)
                self._lines.put(line)
        self._lines.put(None)

    def wait_for_line(self, text: str, timeout: float = 30) -> None:
        """Wait until stderr has a line containing ``text`` (a hang guard, not a clock)."""
        give_up = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, give_up - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"convsim printed no {text!r} in {timeout} s:\n{self.stderr}")
            if line is None:
                pytest.fail(f"convsim ended before printing {text!r}:\n{self.stderr}")
            if text in line:
                return

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """Poll ``condition`` until it holds (for what only shows on disk), while the
        process runs. A hang guard, not a clock: the test never assumes it took a while."""
        give_up = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"convsim ended before {what}:\n{self.stderr}"
            assert time.monotonic() < give_up, f"no {what} in {timeout} s:\n{self.stderr}"
            time.sleep(0.01)

    def interrupt(self, signum: int = signal.SIGINT) -> None:
        """Send ``signum`` (SIGINT: what Ctrl-C sends) to the process alone."""
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 30) -> int:
        """Wait for the process to end; its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

"""What the developer guide's integration tests (tests/guide/test_integration.py,
marked ``integration``) expect around them, served for real: a live ``convsim serve`` at
``localhost:8000`` that takes the key ``test-key``. tests/conftest.py takes its fixtures
(a conftest.py of tests/guide would be a second module named ``conftest``).

The service it starts has the key ``test-key`` (imported: ``serve keys create
--key-stdin``), an operator endpoint named as the guide's model (``openai/gpt-3.5-turbo``,
an ``openai`` model whose base_url is the mock model server on loopback), and the
guide's task class installed as a package registers it (``installed/``, entry-point
group ``convsim.tasks``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml
from _service import LoopbackProcess, Server

__all__ = ["guide_service", "live_service_for_integration_tests"]

GUIDE_PORT = 8000
GUIDE_KEY = "test-key"
GUIDE_MODEL = "openai/gpt-3.5-turbo"
INSTALLED = Path(__file__).parent / "guide" / "installed"
_PORT_WAIT_S = 30.0
"""Shorter than the test timeout (60 s), so that a busy port fails saying so."""


def _wait_for_port(port: int) -> None:
    """Wait until nothing listens on 127.0.0.1:``port`` (another run of these tests on
    this host may hold it for a while); fail saying who should free it."""
    deadline = time.monotonic() + _PORT_WAIT_S
    while True:
        with socket.socket() as probe:
            # as uvicorn binds: connections of an earlier server waiting out TIME_WAIT
            # do not hold the port, only a listener does
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"127.0.0.1:{port} is in use: the guide's integration tests need it "
                "(their client is at http://localhost:8000)"
            )
        time.sleep(0.5)


class _MockModel(LoopbackProcess):
    """``convsim mock-server`` in a subprocess on a free loopback port."""

    what = "the mock model server"
    ready_path = "/v1/models"

    def command(self) -> list[str]:
        return ["mock-server", "--port", str(self.port)]


@pytest.fixture(scope="session")
def guide_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``convsim serve`` at 127.0.0.1:8000 as the guide's integration tests expect it."""
    with serving_the_guide(tmp_path_factory.mktemp("guide-service")) as server:
        yield server


@contextmanager
def serving_the_guide(tmp: Path, port: int = GUIDE_PORT) -> Iterator[Server]:
    """The guide's service on 127.0.0.1:``port``, its files in ``tmp``; whatever it
    started is stopped when it ends, also when it could not start."""
    model = _MockModel(tmp / "model.log")
    with ExitStack() as started:
        started.callback(model.stop)
        model.start()
        settings = {
            "endpoints": {
                GUIDE_MODEL: {
                    "model": "openai:gpt-3.5-turbo",
                    "args": {"base_url": f"{model.url}/v1", "api_key_env": "GUIDE_MODEL_KEY"},
                }
            }
        }
        config = tmp / "service.yml"
        config.write_text(yaml.safe_dump(settings), encoding="utf-8")
        path = os.pathsep.join(p for p in (str(INSTALLED), os.environ.get("PYTHONPATH")) if p)
        env = {"PYTHONPATH": path, "GUIDE_MODEL_KEY": "mock-server-needs-no-key"}
        server = Server(tmp, ["--config", str(config)], env=env, port=port)
        subprocess.run(
            [sys.executable, "-m", "convsim", "serve", "keys", "create", "--db", str(server.db),
             "--name", "guide", "--key-stdin"],
            input=f"{GUIDE_KEY}\n", text=True, capture_output=True, check=True,
        )  # fmt: skip
        _wait_for_port(port)
        started.callback(server.stop)
        server.start()
        yield server


@pytest.fixture(autouse=True)
def live_service_for_integration_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("integration") is not None:
        request.getfixturevalue("guide_service")

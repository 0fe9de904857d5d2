"""The guide's live service (tests/_guide_service.py) leaves nothing running when it
cannot start: a leaked model server would outlive the test run."""

from __future__ import annotations

import socket
from pathlib import Path

import _guide_service
import psutil
import pytest
from _guide_service import serving_the_guide


def _running_children() -> set[psutil.Process]:
    return {
        child
        for child in psutil.Process().children(recursive=True)
        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    }


@pytest.mark.slow
def test_a_taken_port_fails_saying_so_and_stops_the_model_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_guide_service, "_PORT_WAIT_S", 0.0)
    before = _running_children()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        in_use = pytest.raises(pytest.fail.Exception, match=f"127.0.0.1:{port} is in use")
        with in_use, serving_the_guide(tmp_path, port):
            raise AssertionError("started on a taken port")
    assert _running_children() - before == set()

"""A mock OpenAI-compatible model server for load tests, adapter tests and demos.

```python
from convsim.adapters.mock import MockModelServer, MockServerConfig

async with MockModelServer(MockServerConfig(ttft_ms="uniform:20:80", fault_rate=0.05)) as server:
    ...  # point an OpenAI client at server.base_url
```

The command line runs the same server: ``convsim mock-server --port 8000 --ttft-ms 50``.
"""

from __future__ import annotations

from ._mock_server import Delay as Delay
from ._mock_server import FaultKind as FaultKind
from ._mock_server import MockModelServer as MockModelServer
from ._mock_server import MockServerConfig as MockServerConfig
from ._mock_server import MockServerStatistics as MockServerStatistics

__all__ = ["MockServerConfig", "MockModelServer", "MockServerStatistics", "Delay", "FaultKind"]

"""A mock OpenAI-compatible model server for load tests, adapter tests and demos.

```python
from convsim.adapters.mock import MockModelServer, MockServerConfig

async with MockModelServer(MockServerConfig(ttft_ms="uniform:20,80", fault_rate=0.05)) as server:
    ...  # point an OpenAI client at server.base_url
```

The command line runs the same server: ``convsim mock-server --port 8000 --ttft-ms 50``.

The package, bottom up: ``_delay`` (delays and their forms), ``_wire`` (requests read
and checked, error bodies), ``_faults`` (fault kinds and their responses), ``_config``
(the config and the statistics), ``_tokens`` (the mock tokenizer and logprobs),
``_answer`` (the mock model's reply and its cut), ``_replies`` (answers encoded as JSON
bodies and server-sent events), ``_prefix_cache`` (the simulated prefix cache),
``_metrics`` (``/metrics`` in the Prometheus text format), ``_server`` (the aiohttp
server).
"""

from __future__ import annotations

from convsim._lazy import publish as _publish

from ._config import MockServerConfig as MockServerConfig
from ._config import MockServerStatistics as MockServerStatistics
from ._delay import Delay as Delay
from ._faults import FaultKind as FaultKind
from ._server import MockModelServer as MockModelServer

__all__ = ["MockServerConfig", "MockModelServer", "MockServerStatistics", "Delay", "FaultKind"]

# Public classes name their public path (in reprs, docs and pickles), as httpx's do.
for _name in ("MockServerConfig", "MockModelServer", "MockServerStatistics", "Delay"):
    _publish(globals()[_name], _name, __name__)
del _name

"""A ``Simulator`` inside an application's running asyncio loop, as the README shows.

CI runs it on the core install (no extras): every conversation of a bundled pack must
come back finished, with its scores, from the scripted model.
"""

from __future__ import annotations

import asyncio

from convsim import Simulator, Status, load_pack

PACK = "customer_support"


async def main() -> None:
    """Run the pack in this loop and check what came back."""
    expected = {c.conversation_id for c in load_pack(PACK).conversations}
    async with Simulator(model="scripted", concurrency=8) as sim:
        results = [result async for result in sim.run(PACK)]
    came_back = {result.conversation_id for result in results}
    assert came_back == expected, f"missing {sorted(expected - came_back)}"
    unfinished = [r.conversation_id for r in results if r.status is not Status.DONE]
    assert not unfinished, f"not DONE: {unfinished}"
    unscored = [r.conversation_id for r in results if not r.scores]
    assert not unscored, f"no scores: {unscored}"
    print(f"embedded Simulator: {len(results)} conversations of {PACK}, all DONE and scored")


if __name__ == "__main__":
    asyncio.run(main())

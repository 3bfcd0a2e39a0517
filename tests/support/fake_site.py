"""A site's inference endpoint faked in-process on a free loopback port, for tests of
what the control plane sends to sites (batch shards)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web


@contextlib.asynccontextmanager
async def fake_infer_site(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]], model: str = "m"
) -> AsyncIterator[int]:
    """Serve `handler` at /v2/models/<model>/infer until the block ends; yields the port."""
    app = web.Application()
    app.router.add_post(f"/v2/models/{model}/infer", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()

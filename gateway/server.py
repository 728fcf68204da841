"""Running the gateway process."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from gateway.config import Config
from gateway.db import make_engine, upgrade

log = logging.getLogger("goclaw")


def build_app() -> web.Application:
    """The aiohttp application (health only at this stage)."""
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/healthz", healthz)
    return app


async def serve_forever(cfg: Config) -> None:
    """Migrate, start the web server, and run until SIGINT/SIGTERM."""
    engine = make_engine(cfg.database.url)
    await upgrade(engine)
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.server.host, cfg.server.port)
    await site.start()
    log.info("goclaw listening on http://%s:%s", cfg.server.host, cfg.server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await engine.dispose()

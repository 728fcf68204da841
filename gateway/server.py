"""Running the gateway process."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from gateway.app import Gateway
from gateway.config import Config
from gateway.resume import resume_unanswered
from gateway.web.app import dashboard_open

log = logging.getLogger("goclaw")


async def serve_forever(cfg: Config) -> None:
    """Start the gateway, serve the web app, and run until SIGINT/SIGTERM."""
    gw = Gateway(cfg)
    await gw.start(channels=False)
    runner = web.AppRunner(gw.web, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.server.host, cfg.server.port)
        await site.start()
        log.info("goclaw listening on http://%s:%s (model: %s)", cfg.server.host, cfg.server.port, gw.provider.name)
        if cfg.server.dashboard_token is None:
            if dashboard_open(cfg):
                log.warning("server.dashboard_token is not set: the web chat is open to anyone on this machine")
            else:
                log.warning("server.dashboard_token is not set: the web chat is disabled on a non-loopback address")
        await gw.start_channels()
        # Answer what the last process left unanswered, without holding up the listener.
        resume = asyncio.create_task(resume_unanswered(gw), name="goclaw-resume")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        resume.cancel()
    finally:
        await runner.cleanup()
        await gw.stop()

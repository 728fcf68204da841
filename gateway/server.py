"""Running the gateway process."""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from gateway.app import Gateway
from gateway.config import Config
from gateway.resume import resume_unanswered
from gateway.web.auth import login_url, with_dashboard_token

log = logging.getLogger("goclaw")


async def serve_forever(cfg: Config) -> None:
    """Start the gateway, serve the web app, and run until SIGINT/SIGTERM."""
    # policy (issue 9): admin access always needs a secret; without a configured one, one is kept in the data folder.
    cfg, source = with_dashboard_token(cfg)
    gw = Gateway(cfg)
    await gw.start(channels=False)
    runner = web.AppRunner(gw.web, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.server.host, cfg.server.port)
        await site.start()
        port = cfg.server.port
        log.info("goclaw listening on http://%s:%s (model: %s)", cfg.server.host, port, gw.provider.name)
        token = cfg.server.dashboard_token
        if source.generated_file is not None and token is not None:
            # Printed once per start, as Jupyter does; the token lives in a file only the operator can read.
            url = login_url(cfg.server.host, port, token.get_secret_value())
            print(
                f"\nDashboard (log in as the operator):\n    {url}\n"
                f"The token is kept in {source.generated_file} (mode 0600).\n",
                flush=True,
            )
        else:
            log.info("dashboard: log in at http://%s:%s/ with server.dashboard_token", cfg.server.host, port)
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

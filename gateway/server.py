"""Running the gateway process, or N of them sharing one port (``goclaw serve --workers N``)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web

from gateway import tls_trust
from gateway.app import Gateway
from gateway.cli_base import load
from gateway.config import Config, check_secrets
from gateway.errors import DatabaseUnavailable, GoclawError
from gateway.resume import resume_unanswered
from gateway.turnstile import TurnLoop
from gateway.web.auth import login_url, with_dashboard_token

log = logging.getLogger("goclaw")


def serve_command(config: str | None, workers: int = 1, child: int | None = None) -> None:
    """``goclaw serve``: load the config, then run one process (``child``: one of N), or N of them on one port.

    Called by the Typer command and, without building the CLI, by
    ``gateway/__main__.py`` (see there); either way the errors people see are the
    ones :func:`gateway.cli_base.report_error` prints.

    Raises:
        GoclawError: the config, the database or the port cannot be used (one line for a person).
    """
    tls_trust.wait()  # aiohttp's CA bundle, read aside while the gateway imported, before any TLS client exists
    cfg = load(config)
    check_secrets(cfg)
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for warning in cfg.warnings:
        log.warning(warning)
    refusal = workers_refusal(cfg, workers)
    if refusal:
        raise GoclawError(refusal)
    try:
        if workers > 1:
            supervise(cfg, config, workers)
            return
        # Its turns go through the loop's turnstile: a burst of them never keeps the sockets unread
        # for long (gateway/turnstile.py).
        with asyncio.Runner(loop_factory=TurnLoop) as runner:
            runner.run(serve_forever(cfg, child=child, config_path=config))
    except KeyboardInterrupt:
        pass
    except (SuperviseError, DatabaseUnavailable) as exc:
        raise GoclawError(str(exc)) from None
    except OSError as exc:
        raise GoclawError(
            f"cannot listen on {cfg.server.host}:{cfg.server.port}: {exc.strerror}; set server.port"
        ) from None


async def serve_forever(cfg: Config, *, child: int | None = None, config_path: str | None = None) -> None:
    """Start the gateway, serve the web app, and run until SIGINT/SIGTERM.

    ``child`` is set for the processes of ``goclaw serve --workers N``: they
    share the port (SO_REUSEPORT), run no background work (their parent started
    a ``goclaw worker`` for it, or the operator runs one) and print no login URL
    (the parent did); only child 0 answers what a dead process left unanswered.
    """
    from gateway.background import WorkerThread
    from gateway.heap import settle_heap
    from gateway.jobproc import CHECKPOINT_S, JobProcess, checkpoint_every

    # Handled from the start: a stop asked for while the gateway (or its worker thread) starts is
    # carried out once it has started, never a kill halfway through.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # policy (issue 9): admin access always needs a secret; without a configured one, one is kept in the data folder.
    cfg, source = with_dashboard_token(cfg)
    job_process = child is None and cfg.worker.mode == "inline"
    if job_process and cfg.database.url.startswith("sqlite"):
        from gateway.db import checkpoint_elsewhere

        checkpoint_elsewhere()  # the job process copies the WAL into the database file, not the turns' loop
    # Its trims are jobs: the job process (inline), or the ``goclaw worker`` of --workers N or of separate mode.
    gw = Gateway(cfg, trim_jobs=True)
    await gw.start(channels=False, worker=False)
    thread: WorkerThread | None = None
    jobs: JobProcess | None = None
    runner = web.AppRunner(gw.web, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.server.host, cfg.server.port, reuse_port=True if child is not None else None)
        await site.start()
        port = cfg.server.port
        log.info("goclaw listening on http://%s:%s (model: %s)", cfg.server.host, port, gw.provider.name)
        token = cfg.server.dashboard_token
        if child is not None:
            pass  # the parent printed the login URL once
        elif source.generated_file is not None and token is not None:
            # Printed once per start, as Jupyter does; the token lives in a file only the operator can read.
            print_login(cfg, source.generated_file)
        else:
            log.info("dashboard: log in at http://%s:%s/ with server.dashboard_token", cfg.server.host, port)
        if job_process:
            # The background work after the listener (/healthz answers meanwhile): the jobs and the idle
            # sweep in a process of their own (gateway/jobproc.py), the rest of the scheduled work on a
            # thread with its own event loop; neither delays a turn.
            jobs = JobProcess(
                config_path,
                on_job=lambda kind, outcome: gw.metrics.jobs.labels(kind, outcome).inc(),
                config_source=cfg.source,
                # This process never checkpoints SQLite's WAL; while no job process runs, it does.
                while_down=(lambda: checkpoint_every(gw, CHECKPOINT_S)) if gw.engine.dialect.name == "sqlite" else None,
            )
            await jobs.start()
            thread = WorkerThread(cfg, metrics=gw.metrics, wake_jobs=jobs.wake)
            await thread.start()
            gw.wake_remote_worker = jobs.wake
            # An admin's notes_distill runs where the nightly and automatic runs do, not on the turns' loop.
            gw.memory.run_distill = jobs.notes_distill
        await gw.start_channels()
        settle_heap()  # everything start-up made, out of the collector's way (gateway/heap.py)
        # Answer what the last process left unanswered, without holding up the listener.
        resume = asyncio.create_task(resume_unanswered(gw), name="goclaw-resume") if not child else None
        await stop.wait()
        if resume is not None:
            resume.cancel()
    finally:
        await runner.cleanup()
        if thread is not None:
            await thread.stop()
        if jobs is not None:
            await jobs.stop()
        await gw.stop()


def print_login(cfg: Config, token_file: Path) -> None:
    """The operator's login URL, printed once per start."""
    token = cfg.server.dashboard_token
    assert token is not None
    url = login_url(cfg.server.host, cfg.server.port, token.get_secret_value())
    print(
        f"\nDashboard (log in as the operator):\n    {url}\nThe token is kept in {token_file} (mode 0600).\n",
        flush=True,
    )


class SuperviseError(Exception):
    """``goclaw serve --workers N`` cannot run as configured, or a process of it died."""


def workers_refusal(cfg: Config, workers: int) -> str | None:
    """Why ``--workers N`` cannot run with ``cfg``, or None."""
    if workers < 1:
        return "--workers must be at least 1"
    if workers == 1:
        return None
    if not cfg.database.url.startswith("postgresql"):
        return (
            f"--workers {workers} needs PostgreSQL: database.url is SQLite, which one process owns (one writer at a "
            "time). Run one process (it already does its background work on its own thread), or point "
            "database.url at PostgreSQL (postgresql+asyncpg://user@host/db)"
        )
    if cfg.server.port == 0:
        return f"--workers {workers} shares one port between processes: set server.port (0 picks one per process)"
    if cfg.channels.discord.enabled:
        return (
            f"--workers {workers} with channels.discord enabled would connect one bot per process; "
            "split guilds with channels.discord.shard_ids across separate `goclaw serve` processes instead"
        )
    return None


def supervise(cfg: Config, config_path: str | None, workers: int) -> int:
    """Run ``workers`` serve processes on one port (and a ``goclaw worker`` for ``worker.mode: inline``).

    The parent migrates the database once, prints the login URL once, forwards
    SIGINT/SIGTERM to its children and waits for them. If a child exits on its
    own (it could not start, or it died), the others are stopped and the exit
    status is 1, with a message that names the process.

    Returns:
        The exit status.
    """
    from gateway.db import make_engine, upgrade

    async def migrate() -> None:
        engine = make_engine(cfg.database.url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(migrate())  # once, before N processes would race for it
    cfg_with_token, source = with_dashboard_token(cfg)
    base = [sys.executable, "-m", "gateway"]
    conf = ["--config", config_path] if config_path else []
    commands = [(f"serve process {i}", [*base, "serve", *conf, "--child", str(i)]) for i in range(workers)]
    if cfg.worker.mode == "inline":
        commands.append(("worker process", [*base, "worker", *conf]))
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopping = False
    died: tuple[str, int, int] | None = None

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for name, cmd in commands:
            children.append((name, subprocess.Popen(cmd, env=os.environ.copy())))
        log.info(
            "goclaw: %d serve processes on http://%s:%s (SO_REUSEPORT)%s; pids %s",
            workers,
            cfg.server.host,
            cfg.server.port,
            " and a worker process" if cfg.worker.mode == "inline" else "; run `goclaw worker` for background work",
            ", ".join(str(p.pid) for _n, p in children),
        )
        if source.generated_file is not None:
            print_login(cfg_with_token, source.generated_file)
        while not stopping:
            for name, proc in children:
                code = proc.poll()
                if code is not None:
                    died = (name, proc.pid, code)
                    break
            if died:
                break
            time.sleep(0.2)
    finally:
        for _name, proc in children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for _name, proc in children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if died is not None:
        name, pid, code = died
        raise SuperviseError(
            f"goclaw serve --workers {workers}: the {name} (pid {pid}) exited with status {code}; "
            "stopped the others (its own message above says why)"
        )
    return 0

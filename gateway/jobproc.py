"""The job process: ``goclaw serve``'s durable jobs (extraction, belief revision's judge) in a child process.

With ``worker.mode: inline``, ``goclaw serve`` runs its background work itself.
The jobs run here, in a process of their own, and so do the idle sweep that
writes extraction jobs for quiet sessions and memory consolidation (the nightly
run and the automatic distillation; on PostgreSQL, in the one job process that
holds their advisory lock). The SOP schedules, whose runs deliver through the
serving process's channels, stay on the worker thread (``gateway/background.py``).
A consolidation run clusters every current operational note: about 10 s of
Python for the first run after a start at 65,536 notes, 0.2-2.5 s after; on the
worker thread that time held the GIL the turns' loop needed. A
job is CPU work in Python (an extraction job writing its summary is about 5 ms);
on a thread of the serving process it held the GIL the turns' loop needed after
each inline SQLite call, and a turn that met a job waited for it: on SQLite
95 of 1,500 turns waited 1-67 ms. In its own process it shares nothing with the
turns but the database.

The parent and the child share one socket pair:

- parent to child: a ``d ID JSON`` line asks for ``notes_distill`` as the admin
  the JSON names (the admin tool, asked in a turn: the run is the child's, whose
  consolidator remembers the last run's notes, and its CPU is not the turns'
  loop's; the child checks the role again); any other byte is a wake (a trim
  queued a job); end of file (the parent stopped or died) stops the child, so it
  never outlives ``serve``;
- child to parent: ``r`` lines (a write transaction of the child's ended: a
  turn waiting for SQLite's write lock tries again, as for the worker thread's,
  see :class:`gateway.hotstore.sqlite.WriteLockReleases`) and ``j KIND OUTCOME``
  lines (a job's outcome, counted in the serving process's ``/metrics``) and
  ``D ID JSON`` lines (a ``notes_distill``'s answer, a JSON string).

A wake lost while the child starts or restarts costs nothing: the job worker
also polls (every second) and drains what is due when it starts. If the child
exits on its own, the parent logs why and starts another (after 1 s, doubling
to 30 s while it keeps failing); a job it was running is taken over after its
lease, as any dead worker's.

The child is ``python -m gateway.jobproc --fd N --config PATH --config-on-stdin``:
it reads the config's text, as its parent loaded it at start, from its stdin (a
child started again later does not read the file, which may have been edited
since), in the same directory and environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.config import Config
from gateway.hotstore.sqlite import RELEASES
from gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from pairing.principal import Principal

log = logging.getLogger("goclaw.jobs")

FIRST_RESTART_S = 1.0
MAX_RESTART_S = 30.0
STOP_WAIT_S = 30.0
CHECKPOINT_S = 1.0
"""On SQLite, how often the job process copies the WAL into the database file (the turns never do)."""
WAL_WATCH_S = 0.1
"""Between those copies, how often it looks at the WAL file's size (one ``stat``), to start it again past the limit."""
JOB_NICE = 10
"""The job process's niceness, added to its parent's: the scheduler gives the serving process the CPU first."""
JOB_SWITCH_INTERVAL_S = 0.0005
"""The job process's GIL switch interval (``sys.setswitchinterval``; CPython's default is 5 ms).

A consolidation run clusters the notes on a thread (``asyncio.to_thread``) while this
process's loop goes on claiming and finishing jobs and writing memory, each write a
SQLite transaction that holds the database's one write lock. Every statement releases
the GIL, and the loop's thread waited up to the interval to have it back from the
clustering thread before its next statement: write transactions of 0.1-0.4 ms held the
lock 20-53 ms (an instrumented run), and the serving process's turns waited for them. With
0.5 ms, ``bench/consolidation_load.py --runs 3`` at 65,536 notes (2026-12-06, medians): the
turns' p99 during the first nightly run 7.57 ms against 20.71 (1.71x the quiet time's
against 5.50x), their waits for the lock 1.31 s against 2.36; the run took 11.3 s against
10.8, its clustering thread giving the GIL up ten times as often.
"""
DISTILL_DOWN = (
    "Consolidation runs in the gateway's job process, which is not running right now (it is started again "
    "within 30 s); ask again in a minute."
)
DISTILL_LOST = (
    "The gateway's job process stopped during the consolidation run. Each merge is written whole or not at all; "
    "ask again in a minute to finish the run."
)
REQUEST_LIMIT = 65536
"""The longest ``d`` line the child reads; past it, the bytes are taken for wakes and dropped."""


class ParentRequests:
    """The child's reading of what its parent sends: wakes, and ``d ID JSON`` lines (``notes_distill``)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> tuple[bool, list[tuple[int, Mapping[str, Any] | None]]]:
        """Whether ``data`` held a wake, and the requests it completed: (id, the JSON object or None if unreadable)."""
        buf = self._buf + data
        woke = False
        asked: list[tuple[int, Mapping[str, Any] | None]] = []
        while buf:
            if buf[:1] != b"d":
                woke = True  # a wake, or bytes that are no request: looking for jobs again costs nothing
                at = buf.find(b"d")
                buf = b"" if at < 0 else buf[at:]
                continue
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > REQUEST_LIMIT:
                    log.warning("dropped %d bytes from the serving process: not a request", len(buf))
                    buf, woke = b"", True
                break
            line, buf = buf[:end], buf[end + 1 :]
            request = self._parse(line)
            if request is None:
                woke = True
            else:
                asked.append(request)
        self._buf = buf
        return woke, asked

    @staticmethod
    def _parse(line: bytes) -> tuple[int, Mapping[str, Any] | None] | None:
        parts = line.split(b" ", 2)
        if len(parts) != 3 or parts[0] != b"d" or not parts[1].isdigit():
            log.warning("unreadable request from the serving process: %r", line[:80])
            return None
        try:
            body = json.loads(parts[2])
        except ValueError:
            body = None
        return int(parts[1]), body if isinstance(body, dict) else None


class JobProcess:
    """The serving process's side: start the child, wake it, count its jobs, restart it, stop it.

    Args:
        config_path: The config file the serving process loaded (None: the default lookup).
        on_job: Called with (kind, outcome) for each job the child finished or failed.
        config_source: The config's text as the serving process loaded it, and its path
            (``Config.source``): every child started, the first or one started again hours
            later, gets this text on its stdin, never the file as it is by then.
        while_down: Run while no child is running (between an exit and the next start),
            cancelled when one starts: on SQLite the WAL checkpoints the child makes
            (``checkpoint_every``), so a child that keeps failing does not leave the WAL
            growing without bound (the serving process never checkpoints).
    """

    def __init__(
        self,
        config_path: str | None,
        *,
        on_job: Callable[[str, str], None] | None = None,
        config_source: tuple[str, str] | None = None,
        while_down: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config_path = config_path
        self.while_down = while_down
        self.config_source = config_source
        self.on_job = on_job
        self.pid: int | None = None
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._pending = b""
        self._spawned_at = 0.0
        self._distills: dict[int, asyncio.Future[str]] = {}
        self._distill_ids = itertools.count(1)

    async def start(self) -> None:
        """Start the child (its start-up, about half a second, is not waited for)."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._spawn()
        except OSError as exc:  # _watch tries again; the gateway serves meanwhile (jobs wait in the table)
            log.error("cannot start the job process: %s; trying again in %.0f s", exc, FIRST_RESTART_S)
        self._task = asyncio.create_task(self._watch(), name="goclaw-job-process")

    def wake(self) -> None:
        """Look for jobs now (from any thread: the turns' loop, the worker thread's)."""
        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(OSError):  # full (a wake is pending already) or closed (restarting, stopping)
            sock.send(b"w")

    async def notes_distill(self, principal: Principal) -> str:
        """The ``notes_distill`` admin tool's run, in the child: its summary, or why it did not run.

        The run's clustering is Python (about 10 s with 65,536 notes and nothing
        remembered, 0.2-2.5 s after): here it would stop every turn for that long.
        The child keeps the last run's notes, so its run is also the cheap one.
        """
        from memory.tools_admin import authorize_notes_distill

        refusal = authorize_notes_distill(principal)
        if refusal:
            return refusal
        sock, loop = self._sock, self._loop
        if sock is None or loop is None:
            return DISTILL_DOWN
        rid = next(self._distill_ids)
        asked = {"user_id": principal.user_id, "role": str(principal.role), "display_name": principal.display_name}
        answer: asyncio.Future[str] = loop.create_future()
        self._distills[rid] = answer
        try:
            await loop.sock_sendall(sock, f"d {rid} {json.dumps(asked)}\n".encode())
            return await answer
        except OSError:
            return DISTILL_DOWN
        finally:
            self._distills.pop(rid, None)

    async def stop(self) -> None:
        """Stop the child: end of file first (it finishes cleanly), then SIGTERM, then SIGKILL."""
        self._stopping = True
        task, self._task = self._task, None
        await cancel_and_wait(task)
        proc = self._proc
        self._close_socket()
        if proc is None or proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(proc.wait(), STOP_WAIT_S / 2)
        except TimeoutError:
            log.warning(
                "the job process (pid %s) did not stop within %.0f s; sending SIGTERM", proc.pid, STOP_WAIT_S / 2
            )
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_WAIT_S / 2)
            except TimeoutError:
                log.warning(
                    "the job process (pid %s) ignored SIGTERM for %.0f s; killing it", proc.pid, STOP_WAIT_S / 2
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    async def _spawn(self) -> None:
        parent, child = socket.socketpair()
        parent.setblocking(False)
        cmd = [sys.executable, "-m", "gateway.jobproc", "--fd", str(child.fileno())]
        if self.config_source is not None:
            cmd += ["--config", self.config_source[1], "--config-on-stdin"]
        elif self.config_path:
            cmd += ["--config", self.config_path]
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *cmd,
                pass_fds=(child.fileno(),),
                stdin=asyncio.subprocess.PIPE if self.config_source is not None else asyncio.subprocess.DEVNULL,
            )
            if self.config_source is not None:
                # The text serve loaded, not the file as it is now: an edit since serve started takes
                # effect at serve's next start, for the turns and the jobs alike.
                assert self._proc.stdin is not None
                self._proc.stdin.write(self.config_source[0].encode("utf-8"))
                with contextlib.suppress(ConnectionError):  # it died at once: _watch reports and restarts it
                    await self._proc.stdin.drain()
                self._proc.stdin.close()
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.pid, self._spawned_at = self._proc.pid, time.monotonic()
        self._sock, self._pending = parent, b""
        assert self._loop is not None
        self._loop.add_reader(parent, self._readable)
        log.info(
            "job process started (pid %s): extraction and revision jobs, the idle sweep and consolidation run there",
            self.pid,
        )

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock)
            sock.close()
        for answer in self._distills.values():  # the child that was running them is gone
            if not answer.done():
                answer.set_result(DISTILL_LOST)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the child closed its end (it is exiting): _watch sees it go
            self._close_socket()
            return
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            if line == b"r":
                RELEASES.released()
            elif line.startswith(b"j ") and self.on_job is not None:
                parts = line.decode("utf-8", "replace").split()
                if len(parts) == 3:
                    self.on_job(parts[1], parts[2])
            elif line.startswith(b"D "):
                self._distilled(line)

    def _distilled(self, line: bytes) -> None:
        parts = line.split(b" ", 2)
        try:
            rid, summary = int(parts[1]), json.loads(parts[2])
        except (IndexError, ValueError):
            log.warning("unreadable answer from the job process: %r", line[:80])
            return
        answer = self._distills.get(rid)
        if answer is not None and not answer.done():
            answer.set_result(str(summary))

    async def _watch(self) -> None:
        delay = FIRST_RESTART_S
        while True:
            proc = self._proc
            if proc is not None:
                code = await proc.wait()
                self._close_socket()
                self._proc = None
                if self._stopping:
                    return
                if time.monotonic() - self._spawned_at > 60:
                    delay = FIRST_RESTART_S  # it had been running: a new failure, not the same one again
                log.warning(
                    "the job process (pid %s) exited with status %s; starting another in %.0f s "
                    "(a job it was running is taken over when its lease ends)",
                    proc.pid,
                    code,
                    delay,
                )
            cover = asyncio.create_task(self.while_down(), name="goclaw-job-process-down") if self.while_down else None
            try:
                await asyncio.sleep(delay)
            finally:
                await cancel_and_wait(cover)
            delay = min(delay * 2, MAX_RESTART_S)
            try:
                await self._spawn()
            except OSError as exc:
                log.error("cannot start the job process: %s; trying again in %.0f s", exc, delay)


async def run_job_process(cfg: Config, fd: int) -> None:
    """The child: the job worker of a gateway on ``cfg`` until its parent's end of the socket closes."""
    from gateway.app import Gateway
    from gateway.background import Background
    from gateway.heap import settle_heap

    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    with contextlib.suppress(OSError):
        # Behind the turns for the CPU: on a busy machine the turns' loop (and what it waits on)
        # runs first, and the jobs take the time left; they are background work by definition.
        os.nice(JOB_NICE)
    # Its loop's write transactions do not wait 5 ms for the GIL behind a clustering thread.
    sys.setswitchinterval(JOB_SWITCH_INTERVAL_S)
    log.info(
        "job process: niceness %d, GIL switch interval %.1f ms",
        os.getpriority(os.PRIO_PROCESS, 0),
        sys.getswitchinterval() * 1000,
    )

    def send(line: bytes) -> None:
        with contextlib.suppress(OSError):  # the parent is gone (we stop at end of file) or its buffer is full
            sock.send(line)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if cfg.database.url.startswith("sqlite"):
        from gateway.db import checkpoint_elsewhere

        checkpoint_elsewhere()  # its commits copy nothing: checkpoint_every does, once a second or past the limit
    # Its own loop answers no turn: on SQLite the driver's calls are made inline (gateway/sqlite_inline.py).
    gw = Gateway(cfg, inline_driver=True)
    await gw.start(channels=False, worker=False)
    gw.worker.report = lambda kind, outcome: send(f"j {kind} {outcome}\n".encode())
    RELEASES.on_release = lambda: send(b"r\n")

    requests = ParentRequests()
    distills: set[asyncio.Task[None]] = set()

    async def distill(rid: int, who: Mapping[str, Any] | None) -> None:
        from pairing.principal import Principal, Role

        try:
            if who is None:
                raise ValueError("the request was not a JSON object")
            asker = Principal.human(str(who["user_id"]), Role.parse(str(who["role"])), str(who.get("display_name", "")))
            # The role is checked again here (Scheduler.notes_distill), as on every path that merges notes.
            summary = await gw.memory.scheduler.notes_distill(asker)
        except Exception as exc:
            log.exception("notes_distill failed in the job process")
            summary = f"The consolidation run failed ({type(exc).__name__}); the gateway's log says why."
        send(f"D {rid} {json.dumps(summary)}\n".encode())

    def readable() -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            stop.set()  # the serving process stopped (or died): so do we
            return
        woke, asked = requests.feed(data)
        if woke:
            gw.worker.wake()
        for rid, who in asked:
            task = asyncio.create_task(distill(rid, who), name="goclaw-notes-distill")
            distills.add(task)
            task.add_done_callback(distills.discard)

    loop.add_reader(sock, readable)
    checkpoints = (
        asyncio.create_task(checkpoint_every(gw, CHECKPOINT_S), name="goclaw-wal-checkpoint")
        if gw.engine.dialect.name == "sqlite"
        else None
    )
    # The idle sweep, beside the jobs it writes (its on_job wakes this process's worker), and consolidation:
    # on the serving process's worker thread the sweep's look for quiet sessions and a consolidation run's
    # clustering held the GIL the turns needed (gateway/background.py).
    sweep = Background(gw, jobs=False, sops=False)
    try:
        await gw.worker.start()
        await sweep.start()
        settle_heap()
        await stop.wait()
    finally:
        await sweep.stop()
        await cancel_and_wait(checkpoints, *distills)
        loop.remove_reader(sock)
        RELEASES.on_release = None
        await gw.stop()
        sock.close()


async def checkpoint_every(gw: Any, seconds: float) -> None:
    """Copy the WAL into the database file every ``seconds``, starting it again past ``database.wal_limit_mb``.

    The serving process's turns never checkpoint (``checkpoint_elsewhere``): this does it
    for them (``checkpoint_wal``), on a connection of its own in a thread: a restarting
    checkpoint may wait up to ``CHECKPOINT_BUSY_TIMEOUT_MS`` for readers, and this loop's
    jobs do not wait with it. A restart holds the write lock: the serving process's turns
    waiting for it are told when it ends (``RELEASES``), as after one of this process's own writes.

    Between two of those it looks at the WAL file's size every ``WAL_WATCH_S``, and once the
    file has grown past the limit (and past its size at the last checkpoint: a restarted WAL
    keeps its size until the next commit cuts it back, and a busy one waits for the next
    tick) it checkpoints at once. Sessions that started together trim together: under
    ``bench/model_load.py`` 200 trims wrote 54 MB of WAL in one second, the file reached 70 MB
    against a 16 MB limit, and its one restart held the write lock 72 ms.
    """
    from gateway.hotstore.sqlite import checkpoint_connection, checkpoint_wal

    path = gw.engine.url.database
    wal = f"{path}-wal"
    conn: sqlite3.Connection | None = None
    limit_bytes = gw.config.database.wal_limit_bytes
    loop = asyncio.get_running_loop()
    last_at = loop.time()
    last_size = 0  # the WAL file's size after the last checkpoint
    in_thread = False  # cancelled while a call runs in its thread: that thread still has the connection
    try:
        while True:
            await asyncio.sleep(min(WAL_WATCH_S, seconds))
            if loop.time() - last_at < seconds:
                size = _file_size(wal)
                if size <= limit_bytes or size <= last_size:
                    continue
            last_at = loop.time()
            try:
                in_thread = True
                if conn is None:
                    conn = await asyncio.to_thread(checkpoint_connection, path)
                outcome = await asyncio.to_thread(checkpoint_wal, conn, limit_bytes)
                in_thread = False
            except Exception as exc:  # the next one tries again; SQLite's own checkpoint on close is the backstop
                in_thread = False
                log.warning("WAL checkpoint failed: %s", exc)
                continue
            finally:
                last_size = _file_size(wal)
            if outcome != "copied":
                RELEASES.released()
    finally:
        if conn is not None and not in_thread:
            conn.close()


def _file_size(path: str) -> int:
    """A file's size in bytes; 0 when it is not there (no WAL yet, or removed at a clean close)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.jobproc --fd N [--config PATH [--config-on-stdin]]`` (started by ``goclaw serve``)."""
    from gateway.config import find_config_path, load_config, load_config_text
    from gateway.errors import GoclawError

    ap = argparse.ArgumentParser(prog="python -m gateway.jobproc", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--fd", type=int, required=True, help="the socket goclaw serve passed")
    ap.add_argument("--config", default=None)
    ap.add_argument("--config-on-stdin", action="store_true", help="the config's text comes on stdin (from serve)")
    args = ap.parse_args(argv)
    try:
        # Its warnings: serve printed them once.
        if args.config_on_stdin:
            cfg = load_config_text(sys.stdin.read(), find_config_path(args.config))
        else:
            cfg = load_config(find_config_path(args.config))
    except GoclawError as exc:
        print(f"goclaw job process: {exc}", file=sys.stderr)
        return 2
    # It writes to serve's own log (its stderr): each line says it came from here.
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s [job process] %(name)s: %(message)s")
    asyncio.run(run_job_process(cfg, args.fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())

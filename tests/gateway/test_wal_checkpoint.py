"""SQLite's WAL stays bounded while the serving process keeps writing (``checkpoint_wal``, the job process's ticker).

The serving process never checkpoints; the job process copies the WAL into the
database file every second. A ``PASSIVE`` copy never starts the WAL again while
writes keep coming, so under a real model's load the file grew by 7 MB a second
and never shrank. Past ``database.wal_limit_mb`` the checkpoint now restarts it,
and the next commit cuts the file back to the limit (``journal_size_limit``).

No timing assertions: every wait polls for a condition with a generous limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

import gateway.hotstore.sqlite as hot_sqlite
from gateway.hotstore.sqlite import checkpoint_connection, checkpoint_wal
from gateway.jobproc import checkpoint_every
from gateway.tasks import cancel_and_wait
from tests.gateway.test_processes import (
    _in_database_file,
    _post,
    _seed,
    _spawn,
    free_port,
    healthy,
    stop_processes,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 1024  # 15 frames of 4 KB pages


def _writer(path: Path, limit: int) -> sqlite3.Connection:
    """A connection set up as the serving process's is: WAL, no checkpoint of its own, the size limit."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"PRAGMA journal_size_limit={limit}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body BLOB)")
    return conn


def _commit(conn: sqlite3.Connection, n: int = 1) -> None:
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (body) VALUES (randomblob(3000))")  # about a page of its own
        conn.execute("COMMIT")


def _wal(path: Path) -> int:
    return Path(f"{path}-wal").stat().st_size


def test_under_the_limit_the_wal_is_copied_without_waiting_for_a_writer(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    _commit(writer, 40)
    writer.execute("BEGIN IMMEDIATE")  # a turn's write transaction, open
    writer.execute("INSERT INTO t (body) VALUES (randomblob(3000))")
    assert checkpoint_wal(checker, 100 * _wal(db)) == "copied"  # did not wait for the write lock
    assert _in_database_file(db, "t") == 40  # what was committed is in the database file
    # Past the limit the same call needs the write lock: it waits its 50 ms, then leaves the writer be.
    assert checkpoint_wal(checker, LIMIT) == "busy"
    writer.execute("COMMIT")
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 41
    writer.close()
    checker.close()


def test_past_the_limit_the_wal_starts_again_and_the_next_commit_cuts_it_to_the_limit(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    _commit(writer, 60)
    grown = _wal(db)
    assert grown > 3 * LIMIT
    assert checkpoint_wal(checker, LIMIT) == "restarted"
    _commit(writer)
    assert _wal(db) <= LIMIT < grown
    assert _in_database_file(db, "t") == 60
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 61  # nothing lost
    writer.close()
    checker.close()


def _write_lock_free(path: Path) -> bool:
    """Whether another connection could take SQLite's write lock right now (it does not wait for it)."""
    probe = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def test_a_restart_finds_the_file_flushed_and_the_wal_copied_before_it_takes_the_write_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holding the write lock, a restart has only what was committed in the last moment left to copy and sync.

    Its sync of the database file used to flush every page the ``PASSIVE`` pass before it had
    copied (a 16 MB WAL's worth) while turns' writes waited: 6-24 ms at 8 clients. Now the file
    is flushed with no lock held, and what turns commit meanwhile is copied by a second pass.
    """
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    _commit(writer, 60)
    flushes: list[tuple[int, bool]] = []  # (inode flushed, write lock free then)
    flush = getattr(os, "fdatasync", os.fsync)

    def flush_and_watch(fd: int) -> None:
        flushes.append((os.fstat(fd).st_ino, _write_lock_free(db)))
        if len(flushes) == 1:
            _commit(writer, 5)  # turns go on committing while the file is flushed
        flush(fd)

    at_restart: list[tuple[int, bool]] = []
    restart = hot_sqlite._restart

    def restart_and_watch(conn: sqlite3.Connection) -> str:
        at_restart.append((_in_database_file(db, "t"), len(flushes) >= 1))
        return restart(conn)

    monkeypatch.setattr(os, "fdatasync" if hasattr(os, "fdatasync") else "fsync", flush_and_watch)
    monkeypatch.setattr(hot_sqlite, "_restart", restart_and_watch)
    assert checkpoint_wal(checker, LIMIT) == "restarted"
    assert flushes and all(inode == db.stat().st_ino and free for inode, free in flushes), flushes
    # Everything committed, the 5 of the first flush's moment included, was in the file when the lock was taken.
    assert at_restart == [(65, True)]
    _commit(writer)
    assert _wal(db) <= LIMIT  # the WAL started again
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 66
    writer.close()
    checker.close()


def test_a_database_file_that_cannot_be_flushed_is_still_restarted_by_sqlite_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    _commit(writer, 60)

    def refuse(fd: int) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fdatasync" if hasattr(os, "fdatasync") else "fsync", refuse)
    assert checkpoint_wal(checker, LIMIT) == "restarted"
    _commit(writer)
    assert _wal(db) <= LIMIT
    assert _in_database_file(db, "t") == 60
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 61
    writer.close()
    checker.close()


def test_a_reader_on_the_wal_keeps_it_and_the_next_call_restarts_it(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    _commit(writer, 30)
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 30  # a snapshot on the WAL, held open
    _commit(writer, 30)
    assert checkpoint_wal(checker, LIMIT) == "busy"  # waited its 50 ms for the reader, then gave up
    _commit(writer)  # the writer was never stopped for good
    assert reader.execute("SELECT count(*) FROM t").fetchone()[0] == 30  # the reader's snapshot intact
    reader.execute("COMMIT")
    assert checkpoint_wal(checker, LIMIT) == "restarted"
    _commit(writer)
    assert _wal(db) <= LIMIT
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 62
    for c in (reader, writer, checker):
        c.close()


def test_with_another_connection_committing_all_the_while_the_wal_is_restarted(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    checker = checkpoint_connection(str(db))
    stop = threading.Event()
    committed: list[int] = []
    shrank = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            last = 0
            while not stop.is_set():
                _commit(writer)
                committed.append(1)
                size = _wal(db)
                if size < last:
                    shrank.set()
                last = size
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    outcomes: list[str] = []
    try:
        for _ in range(2000):  # each call waits for the writer's lock at most 50 ms; this only stops a hang
            if shrank.is_set() or errors:
                break
            outcomes.append(checkpoint_wal(checker, LIMIT))
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert "restarted" in outcomes
    assert shrank.is_set(), "the WAL file never shrank while the other connection wrote"
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == len(committed)
    writer.close()
    checker.close()


async def test_a_wal_grown_past_its_limit_is_started_again_before_the_next_tick(tmp_path: Path) -> None:
    """The job process's ticker looks at the WAL's size between its ticks (a burst of trims is cut back at once).

    Its tick here is an hour away: only the size it watches can start the WAL again. Before, a
    burst waited for the next tick (under ``bench/model_load.py`` the file reached 70 MB
    against a 16 MB limit, and the restart of all of it held the write lock 72 ms).
    """
    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    _commit(writer, 40)  # a burst: about 40 pages, well past the 15 the limit holds
    burst = _wal(db)
    assert burst > 2 * LIMIT
    gw = SimpleNamespace(
        engine=SimpleNamespace(url=SimpleNamespace(database=str(db))),
        config=SimpleNamespace(database=SimpleNamespace(wal_limit_bytes=LIMIT)),
    )
    ticker = asyncio.create_task(checkpoint_every(gw, 3600.0))
    sizes: list[int] = []
    try:
        for _ in range(600):  # up to a minute; the watch looks every 0.1 s
            await asyncio.sleep(0.1)
            _commit(writer)  # the first commit after a restart starts the WAL again and cuts the file back
            sizes.append(_wal(db))
            if sizes[-1] <= LIMIT:
                break
    finally:
        await cancel_and_wait(ticker)
    assert sizes[-1] <= LIMIT, f"the WAL was never cut back from {burst} bytes: {sizes[-5:]}"
    assert writer.execute("SELECT count(*) FROM t").fetchone()[0] == 40 + len(sizes)
    writer.close()


def test_a_busy_gateway_s_wal_is_cut_back_while_turns_go_on(tmp_path: Path) -> None:
    """A real ``goclaw serve`` on SQLite with its job process: turns without a pause, the WAL kept near its limit."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    users = asyncio.run(_seed(url, 1))
    token = "wal-token-0123456789abcdef"
    port = free_port()
    limit = 1024 * 1024
    cfg = {
        "database": {"url": url, "wal_limit_mb": 1},
        "server": {"port": port, "api_users": [{"token": token, "user": users[0]}]},
        "logging": {"level": "INFO"},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    log = tmp_path / "serve.log"
    serve = _spawn(["-m", "gateway", "serve", "--config", "config.yaml"], tmp_path, log)
    wal = tmp_path / "g.db-wal"
    sizes: list[int] = []
    try:
        wait_for(lambda: healthy(port), "goclaw serve", [serve])

        def turns_until_cut_back() -> bool:
            for _ in range(20):
                i = len(sizes)
                status, body = _post(port, token, f"s{i % 5}", f"message {i} about the weekly report", f"m{i}")
                assert status == 200, body
                sizes.append(wal.stat().st_size)
                # The file only ever shrinks when SQLite cuts it back to the limit after the WAL started again.
                if len(sizes) > 1 and sizes[-1] < max(sizes):
                    return True
            return False

        wait_for(turns_until_cut_back, "the WAL to be cut back while turns go on", [serve])
        assert max(sizes) > limit
        assert sizes[-1] <= limit + 256 * 1024  # at the limit, and the frames of the turn just made
    finally:
        stop_processes([serve], "goclaw serve")
    conn = sqlite3.connect(tmp_path / "g.db")
    try:
        asked = conn.execute("SELECT count(*) FROM messages WHERE is_agent = 0").fetchone()[0]
    finally:
        conn.close()
    assert asked == len(sizes)  # every turn's message kept
    text = log.read_text()
    assert "Traceback" not in text, text
    # The job process stopped on its own when serve closed its socket, mid-queue (a stop that landed
    # as a job ended was once lost: serve waited 15 s, sent SIGTERM, waited 15 more and killed it).
    assert "did not stop within" not in text, text


_ENGINE_COMMITS = """
import asyncio, sqlite3, sys
from gateway.db import make_engine

async def main(url, elsewhere):
    if elsewhere:
        from gateway.db import checkpoint_elsewhere
        checkpoint_elsewhere()
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            print((await conn.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar_one())
            await conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
            await conn.commit()
            for _ in range(1200):  # past SQLite's default of 1,000 pages in the WAL
                await conn.exec_driver_sql("INSERT INTO t (body) VALUES (randomblob(3000))")
                await conn.commit()
        # The database file alone, the WAL not read: read before the last connection closes (a close copies all).
        in_file = sqlite3.connect(f"file:{engine.url.database}?immutable=1", uri=True)
        made = in_file.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0]
        print(in_file.execute("SELECT count(*) FROM t").fetchone()[0] if made else 0)
        in_file.close()
    finally:
        await engine.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2] == "elsewhere"))
"""


def test_a_process_whose_wal_another_copies_commits_through_the_engine_without_copying_it(tmp_path: Path) -> None:
    # The job process copies the WAL every second; its own commits (a memory write, a job's finish)
    # copied it again each time once it held 1,000 pages, until it started again at the limit.
    found = {}
    for mode in ("default", "elsewhere"):
        db = tmp_path / f"{mode}.db"
        out = subprocess.run(
            [sys.executable, "-c", _ENGINE_COMMITS, f"sqlite+aiosqlite:///{db}", mode],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        found[mode] = out.stdout.split()
    assert found["default"][0] == "1000" and int(found["default"][1]) > 0  # SQLite's own copy, on commit
    assert found["elsewhere"] == ["0", "0"]  # nothing copied by the committing process: all still in the WAL


_JOB_PROCESS_CONNECTIONS = """
import asyncio, json, socket, sys
import gateway.app
from gateway.config import Config
from gateway.hotstore import hot_store
from gateway.jobproc import run_job_process

started = []
original = gateway.app.Gateway.start

async def start(self, *args, **kwargs):
    await original(self, *args, **kwargs)
    started.append(self)

gateway.app.Gateway.start = start

async def main(url):
    parent, child = socket.socketpair()
    job = asyncio.create_task(run_job_process(Config.model_validate({"database": {"url": url}}), child.detach()))
    while not started:
        if job.done():
            job.result()  # it ended before its gateway started: say why
        await asyncio.sleep(0.05)
    gw = started[0]
    async with gw.engine.connect() as conn:
        engine = (await conn.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar_one()
    hot = hot_store(gw.engine)._connection().execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    print(json.dumps({"engine": engine, "hot": hot}))
    parent.close()  # the serving process's end closes: the job process stops
    await asyncio.wait_for(job, 60)

asyncio.run(main(sys.argv[1]))
"""


def test_the_job_process_s_own_connections_leave_the_copy_to_its_ticker(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    asyncio.run(_seed(url, 1))  # migrated, as serve leaves it before starting its job process
    out = subprocess.run(
        [sys.executable, "-c", _JOB_PROCESS_CONNECTIONS, url],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"engine": 0, "hot": 0}, out.stderr


async def test_while_no_job_process_runs_the_serving_process_copies_the_wal(tmp_path: Path) -> None:
    """A job process that keeps failing leaves no WAL growing: between its exits and starts, serve checkpoints.

    The serving process never checkpoints; only the job process's ticker did, so while it
    failed (restarted with a backoff up to 30 s, forever) nothing copied the WAL. Its child
    here exits at once (a config file that is not there).
    """
    from gateway.jobproc import CHECKPOINT_S, JobProcess

    db = tmp_path / "g.db"
    writer = _writer(db, LIMIT)
    _commit(writer, 40)

    def copied() -> int:
        """Rows in the database file; 0 while not even the table is there, or while a checkpoint is
        writing the file (read without its locks, a page copied halfway reads as malformed)."""
        try:
            return _in_database_file(db, "t")
        except sqlite3.DatabaseError:
            return 0

    assert copied() == 0  # all of it in the WAL still
    gw = SimpleNamespace(
        engine=SimpleNamespace(url=SimpleNamespace(database=str(db))),
        config=SimpleNamespace(database=SimpleNamespace(wal_limit_bytes=LIMIT)),
    )
    jobs = JobProcess(str(tmp_path / "missing.yaml"), while_down=lambda: checkpoint_every(gw, CHECKPOINT_S))
    await jobs.start()
    try:
        got = 0
        for _ in range(600):  # up to a minute: the child exits, then the first tick of the cover copies
            await asyncio.sleep(0.1)
            got = copied()
            if got == 40:
                break
        assert got == 40, "nothing copied the WAL while the job process was down"
    finally:
        await jobs.stop()
    writer.close()

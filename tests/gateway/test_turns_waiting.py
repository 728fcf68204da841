"""While a turn waits for SQLite's write lock, the job process begins no write of its own.

The job process begins its next write transaction the moment the last one commits;
a turn polls the lock, or waits for a release through its loop, and nearly always
came second: a burst of trims kept the turns in flight waiting 30-90 ms each. The
serving process now sets a byte of a file both map while any of its writes waits
(``gateway.hotstore.sqlite.TurnsWaiting``), and the job process gives way before
each write transaction it begins: the hot store's, its SQLAlchemy engine's (a gated
memory write among them), and a restarting checkpoint's. Real SQLite files, a real
second process for the job's side, and a real ``goclaw serve`` for the plumbing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import insert, select

import gateway.hotstore.sqlite as hot
import gateway.sqlite_inline as inline_mod
from gateway.db import make_engine, upgrade
from gateway.hotstore.sqlite import SQLiteHotStore, TurnsWaiting, checkpoint_connection, checkpoint_wal
from gateway.models import Session
from gateway.sqlite_inline import make_inline_engine
from memory.gate import WriteAccess
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from pairing.principal import Principal, Role

ALICE = Principal.human("u_alice", Role.USER, "Alice")

# The job process's side, in a process of its own: one transaction that holds the lock until the
# turn's write is waiting for it, then short ones back to back, as a burst of trims runs. Each row
# records whether the byte was set when its transaction had the lock: a write begun while a turn waited.
JOB = textwrap.dedent(
    """
    import asyncio, sys, time
    import gateway.hotstore.sqlite as hot

    path, fd, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hot.GIVE_WAY_S = 60.0  # however slow the machine, the job waits for the turn (the gateway's bound: 50 ms)
    hot.TURNS.attach(fd)
    view = hot.TURNS._view
    store = hot.SQLiteHotStore(path)

    def first(conn):
        conn.execute("INSERT INTO log (who, seq, turn_waiting) VALUES ('job', 0, ?)", (view[0],))
        print("holding", flush=True)
        deadline = time.monotonic() + 60
        while not view[0] and time.monotonic() < deadline:  # until the turn's write found the lock held
            time.sleep(0.0005)

    def short(seq):
        def body(conn):
            conn.execute("INSERT INTO log (who, seq, turn_waiting) VALUES ('job', ?, ?)", (seq, view[0]))
            time.sleep(0.002)  # a job's transaction: the lock held 2 ms
        return body

    async def main():
        await store._run(first, write=True)
        for seq in range(1, count + 1):
            await store._run(short(seq), write=True)
        print("gave way", hot.TURNS.gave_way, flush=True)

    asyncio.run(main())
    """
)


@pytest.fixture
def turns(monkeypatch: pytest.MonkeyPatch) -> Iterator[TurnsWaiting]:
    """This process as the serving process: a fresh byte of its own, for this test only."""
    own = TurnsWaiting()
    monkeypatch.setattr(hot, "TURNS", own)
    yield own
    if own._view is not None:
        own._view.close()
    if own._fd is not None:
        os.close(own._fd)


def _log_db(tmp_path: Path) -> str:
    path = str(tmp_path / "turns.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE log (id INTEGER PRIMARY KEY, who TEXT, seq INTEGER, turn_waiting INTEGER)")
    conn.close()
    return path


async def test_a_turn_waiting_for_the_lock_writes_before_the_job_process_begins_another_write(
    tmp_path: Path, turns: TurnsWaiting
) -> None:
    path = _log_db(tmp_path)
    fd = turns.shared_fd()
    job = await asyncio.create_subprocess_exec(
        sys.executable, "-c", JOB, path, str(fd), "40", pass_fds=(fd,), stdout=asyncio.subprocess.PIPE
    )
    store = SQLiteHotStore(path)
    waits = hot.RELEASES.waits
    try:
        assert job.stdout is not None
        assert await asyncio.wait_for(job.stdout.readline(), 60) == b"holding\n"
        # The job holds the lock: the turn's write finds it held, sets the byte, and waits.
        await store._run(lambda conn: conn.execute("INSERT INTO log (who, seq) VALUES ('turn', 0)"), write=True)
        assert hot.RELEASES.waits == waits + 1
        assert turns._view is not None and turns._view[0] == 0  # cleared once the write ended
        out, _ = await asyncio.wait_for(job.communicate(), 60)
        assert job.returncode == 0
    finally:
        if job.returncode is None:
            job.kill()
            await job.wait()
        await store.close()
    rows = sqlite3.connect(path).execute("SELECT who, seq, turn_waiting FROM log ORDER BY id").fetchall()
    # The job's first transaction held the lock when the turn came (it commits once the byte is set);
    # its next one waited for the turn's write, and none of its 40 began while the turn waited.
    assert rows[:2] == [("job", 0, 0), ("turn", 0, None)]
    assert [seq for who, seq, _ in rows[2:] if who == "job"] == list(range(1, 41))
    assert not any(waiting for who, _seq, waiting in rows if who == "job")
    assert b"gave way 1" in out  # held back once, until the turn's write had committed


async def test_the_job_process_s_engine_gives_way_before_a_transaction_s_first_write_only(
    sqlite_url: str, turns: TurnsWaiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the SQLAlchemy engine the job process writes memory with, a gated write among them."""
    plain = make_engine(sqlite_url)
    await upgrade(plain)
    await plain.dispose()
    fd = turns.shared_fd()
    job_side = TurnsWaiting()  # the job process's side of the same file (attach closes what it is given)
    job_side.attach(os.dup(fd))
    monkeypatch.setattr(inline_mod, "TURNS", job_side)
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the turn's write commits while the job waits: the byte is cleared
        pauses.append(seconds)
        turns.leave()

    monkeypatch.setattr(hot, "_pause", pause)
    engine = make_inline_engine(sqlite_url)
    now = datetime.now(UTC)
    row = {"channel": "api", "thread_id": "", "previous_context": "", "created_at": now, "updated_at": now}
    try:
        turns.enter()  # a turn waits for the lock
        async with engine.connect() as conn:
            assert (await conn.execute(select(Session.id))).all() == []  # a read takes no lock: no wait
        assert pauses == []
        async with engine.begin() as conn:
            await conn.execute(insert(Session).values(id="s_1", conversation_id="one", **row))
            assert len(pauses) == 1 and job_side.gave_way == 1  # held back until the turn was done
            turns.enter()  # another turn waits: this transaction holds the lock already, it goes on
            await conn.execute(insert(Session).values(id="s_2", conversation_id="two", **row))
            assert len(pauses) == 1
        turns.leave()
        # A gated memory write (an extraction job's) begins its transaction the same way.
        writer = MemoryWriter(MemoryStore(engine), write_access=WriteAccess())
        turns.enter()
        written = await writer.write(ALICE, "personal", "memory_write", subject="lunch", content="Soup.", said_at=now)
        assert written.record is not None
        assert len(pauses) == 2 and job_side.gave_way == 2
        async with engine.connect() as conn:
            assert sorted((await conn.execute(select(Session.id))).scalars()) == ["s_1", "s_2"]
    finally:
        await engine.dispose()


def test_a_restarting_checkpoint_gives_way_to_a_waiting_turn(
    tmp_path: Path, turns: TurnsWaiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _log_db(tmp_path)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    for i in range(50):
        writer.execute("INSERT INTO log (who, seq) VALUES ('turn', ?)", (i,))
    fd = turns.shared_fd()
    job_side = TurnsWaiting()
    job_side.attach(os.dup(fd))
    monkeypatch.setattr(hot, "TURNS", job_side)  # the checkpoint runs in the job process
    order: list[str] = []

    def pause(seconds: float) -> None:
        order.append("gave way")
        turns.leave()

    monkeypatch.setattr(hot, "_pause", pause)
    conn = checkpoint_connection(path)
    try:
        assert checkpoint_wal(conn, 1 << 30) == "copied"  # under the limit: no write lock, no wait
        assert order == []
        turns.enter()
        assert checkpoint_wal(conn, 0) == "restarted"  # past it: the restart takes the write lock, after the turn
        assert order == ["gave way"] and job_side.gave_way == 1
    finally:
        conn.close()
        writer.close()


def test_in_the_serving_process_and_without_a_job_process_nothing_waits(turns: TurnsWaiting) -> None:
    alone = TurnsWaiting()  # a process that neither made the file nor attached one (the CLI, a test)
    alone.enter()
    alone.give_way()
    alone.leave()
    assert not alone.yields and alone.gave_way == 0
    turns.shared_fd()
    turns.enter()
    turns.give_way()  # the serving process never holds its own writes back
    assert not turns.yields and turns.gave_way == 0
    turns.leave()


async def test_without_the_shared_file_the_job_process_starts_and_does_not_give_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of file descriptors, say: the byte is a speed-up, never a reason for the jobs not to run."""
    import gateway.jobproc as jobproc

    def no_file(name: str) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(hot, "_anonymous_file", no_file)
    own = TurnsWaiting()
    monkeypatch.setattr(jobproc, "TURNS", own)
    assert own.shared_fd() is None and own.shared_fd() is None
    assert [r.getMessage() for r in caplog.records if "give way" in r.getMessage()] == [
        "the job process will not give way to waiting turns: no shared file ([Errno 24] Too many open files)"
    ]  # once
    own.enter()  # a turn waits: nothing to set, nothing fails
    own.leave()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"}}))
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    await upgrade(engine)
    await engine.dispose()
    jobs = jobproc.JobProcess(str(config))
    await jobs.start()
    try:
        assert jobs.pid is not None
        cmdline = b""
        for _ in range(3000):  # until it runs the job process's code (exec'd), up to 30 s
            cmdline = Path(f"/proc/{jobs.pid}/cmdline").read_bytes()
            if b"gateway.jobproc" in cmdline:
                break
            await asyncio.sleep(0.01)
        assert cmdline.split(b"\0")[1:4] == [b"-m", b"gateway.jobproc", b"--fd"]
        assert b"--turns-fd" not in cmdline
        await asyncio.sleep(1)
        assert jobs._proc is not None and jobs._proc.returncode is None  # running, its jobs to come
    finally:
        await jobs.stop()


def test_the_job_process_tells_serve_of_a_release_only_while_a_turn_waits(
    turns: TurnsWaiting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each notice is a system call here and a wake-up of serve's loop; with no turn waiting, nobody needs it."""
    import gateway.jobproc as jobproc

    job_side = TurnsWaiting()
    job_side.attach(os.dup(turns.shared_fd() or -1))
    monkeypatch.setattr(jobproc, "TURNS", job_side)
    sent: list[bytes] = []
    notice = jobproc.release_notice(sent.append)
    notice()  # a job's commit, no turn waiting
    assert sent == []
    turns.enter()  # a turn found the lock held: the next release is told
    notice()
    assert sent == [b"r\n"]
    turns.leave()
    notice()
    assert sent == [b"r\n"]
    # A job process started without the byte tells every release, as before there was one.
    monkeypatch.setattr(jobproc, "TURNS", TurnsWaiting())
    jobproc.release_notice(sent.append)()
    assert sent == [b"r\n", b"r\n"]

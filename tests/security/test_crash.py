"""Issue 9: `goclaw serve` SIGKILLed under load, five times, loses nothing and leaves nobody unanswered.

A real server process with the built-in model, small history windows (so trims,
archives and extraction jobs happen all the time) and a short job lease. The
client sends SESSIONS x MESSAGES messages, one session after another message by
message, sessions concurrently; a message whose answer it did not get (refused
connection, dropped response, 503) is sent again with the same message id. The
killer SIGKILLs the server when the count of answered messages passes seeded
random points, and restarts it at once.

At the end, read from the database: every message is stored once, every
message has exactly one reply (answered on a retry or at restart), every
archive has exactly one job, every job is done, no memory record is
duplicated, and the server's log has no traceback.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select

from gateway.db import make_engine, upgrade
from gateway.models import Archive, Job, Message
from memory.models import MemoryRecord
from pairing import PairingStore
from tests.gateway.test_serve import free_port

SEED = 9
SESSIONS = 10
MESSAGES = 15
KILLS = 5
TOKENS = [f"crash-test-token-{i:02d}-0123456789" for i in range(3)]
LINES = [
    "I work at site {s} desk {m}",
    "I prefer tea blend {s}x{m}",
    "status of ticket {s}-{m}?",
    "I am based in town{s}q{m}",
]


@dataclass
class Run:
    url: str
    folder: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    answered: int = 0
    acked: dict[str, str] = field(default_factory=dict)  # message id -> reply
    logs: list[Path] = field(default_factory=list)


def _config(run: Run, users: list[str]) -> str:
    api_users = "\n".join(f"    - token: {t}\n      user: {u}" for t, u in zip(TOKENS, users, strict=True))
    return f"""
database:
  url: {run.url}
llm:
  provider: builtin
server:
  host: 127.0.0.1
  port: {run.port}
  api_users:
{api_users}
session:
  max_messages: 6
  keep_messages: 2
  job_lease_seconds: 3
logging:
  level: INFO
"""


def _start(run: Run) -> None:
    run.starts += 1
    log = run.folder / f"serve-{run.starts}.log"
    run.logs.append(log)
    with log.open("wb") as out:
        run.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", "config.yaml"],
            cwd=run.folder,
            env={**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def _healthy(run: Run, http: aiohttp.ClientSession, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{run.port}/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)


async def _send(run: Run, http: aiohttp.ClientSession, token: str, session: str, mid: str, text: str) -> None:
    """Send until answered; every retry carries the same message id."""
    body = {"session": session, "text": text, "message_id": mid}
    headers = {"Authorization": f"Bearer {token}"}
    # A deadline, not a count of attempts: on a busy machine each restart takes seconds, and a
    # message may meet several restarts in a row (faster turns mean shorter lives between kills).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while loop.time() < deadline:
        try:
            async with http.post(f"http://127.0.0.1:{run.port}/v1/chat", json=body, headers=headers) as r:
                payload: dict[str, Any] = await r.json(content_type=None)
                if r.status == 200 and payload.get("reply"):
                    run.acked[mid] = payload["reply"]
                    run.answered += 1
                    return
                assert r.status in (503,), payload  # only "not now" is worth a retry
        except (TimeoutError, aiohttp.ClientError):
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"message {mid} never answered")


async def _client(run: Run, http: aiohttp.ClientSession, index: int) -> None:
    token = TOKENS[index % len(TOKENS)]
    for m in range(MESSAGES):
        text = LINES[(index + m) % len(LINES)].format(s=index, m=m)
        await _send(run, http, token, f"sess-{index}", f"s{index}-m{m}", text)


async def _killer(run: Run, http: aiohttp.ClientSession, points: list[int]) -> None:
    for point in points:
        while run.answered < point:
            await asyncio.sleep(0.01)
        assert run.proc is not None
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait()
        _start(run)
        await _healthy(run, http)


async def _prepare(url: str, folder: Path) -> Run:
    engine = make_engine(url)
    await upgrade(engine)
    store = PairingStore(engine)
    users = [(await store.add_user(f"User{i}", "user")).id for i in range(len(TOKENS))]
    await engine.dispose()
    run = Run(url, folder, free_port())
    (folder / "config.yaml").write_text(_config(run, users))
    return run


async def _load(run: Run) -> None:
    rng = random.Random(SEED)
    total = SESSIONS * MESSAGES
    points = sorted(rng.sample(range(total // 10, total - total // 10), KILLS))
    _start(run)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await _healthy(run, http)
        killer = asyncio.create_task(_killer(run, http, points))
        await asyncio.gather(*(_client(run, http, i) for i in range(SESSIONS)))
        await killer


async def _settled(url: str, timeout: float = 60.0) -> None:
    """Wait for the last process's worker to finish every job (a dead worker's lease runs out first)."""
    engine = make_engine(url)
    try:
        async with asyncio.timeout(timeout):
            while True:
                async with engine.connect() as conn:
                    open_jobs = (
                        await conn.execute(
                            select(func.count()).select_from(Job).where(Job.status.in_(("pending", "running")))
                        )
                    ).scalar_one()
                if not open_jobs:
                    return
                await asyncio.sleep(0.2)
    finally:
        await engine.dispose()


async def _check(url: str, run: Run) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            inbound = (await conn.execute(select(Message).where(Message.is_agent.is_(False)))).all()
            replies = (await conn.execute(select(Message).where(Message.is_agent.is_(True)))).all()
            archives = (await conn.execute(select(Archive.id))).scalars().all()
            jobs = (await conn.execute(select(Job))).all()
            records = (await conn.execute(select(MemoryRecord))).all()
    finally:
        await engine.dispose()
    expected = {f"s{i}-m{m}" for i in range(SESSIONS) for m in range(MESSAGES)}
    assert set(run.acked) == expected
    ids = [m.platform_message_id for m in inbound]
    assert sorted(ids) == sorted(expected), "every message stored exactly once"
    by_row = {m.id: m for m in inbound}
    answered = [r.reply_to_id for r in replies]
    assert len(answered) == len(set(answered)), "a message got two replies"
    assert set(answered) == set(by_row), "every message has its reply"
    for r in replies:
        assert run.acked[by_row[r.reply_to_id].platform_message_id] == r.text  # the reply the client saw
    per_archive: dict[str, int] = {}
    for j in jobs:
        per_archive[j.payload["archive_id"]] = per_archive.get(j.payload["archive_id"], 0) + 1
    assert per_archive == dict.fromkeys(archives, 1), "every archive has exactly one job"
    assert archives, "the load trimmed nothing: the test would prove little"
    assert {j.status for j in jobs} == {"done"}, [(j.id, j.status, j.last_error) for j in jobs if j.status != "done"]
    keys = [(r.scope, r.owner_user_id, r.subject_key, r.content) for r in records]
    assert len(keys) == len(set(keys)), "a memory record was written twice"
    assert run.starts == KILLS + 1
    for log in run.logs:
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]


def _run(url: str, folder: Path) -> None:
    async def go() -> None:
        run = await _prepare(url, folder)
        try:
            await _load(run)
            await _settled(url)
        finally:
            assert run.proc is not None
            run.proc.terminate()
            try:
                run.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait()
        await _check(url, run)

    asyncio.run(go())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sigkill_under_load_loses_nothing_and_answers_everyone(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'crash.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    _run(url, tmp_path)

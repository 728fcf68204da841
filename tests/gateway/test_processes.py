"""Several real gateway processes on one PostgreSQL database (issue 14, target 5).

Two ``goclaw serve`` processes (``worker.mode: separate``, one port each so the
test can choose which process gets each message) and two ``goclaw worker``
processes share a fresh database; the model is a local OpenAI-compatible peer in
its own process that answers after a delay and logs every request. Messages of
several sessions are sent alternately to both serve processes, each one sent
once the previous one of its session is stored (while it is still being
answered). Then: every message is stored once and answered once, the replies of
one session come in order, each prompt holds the previous message and its
reply, every job ran once, and one worker ran the scheduled work. A second test
runs two processes consolidating on one database and checks that no two runs
overlap; others check ``goclaw serve --workers 2`` itself.

No timing assertions: every wait polls for a condition with a generous limit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from gateway.db import make_engine, upgrade
from gateway.jobproc import JOB_NICE, JOB_SWITCH_INTERVAL_S
from gateway.models import Job, Message
from memory.models import MemoryRecord

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 4
PER_SESSION = 8
LIMIT_S = 180  # only stops a hung run; a loaded 2-core machine needs far less


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Any, what: str, procs: list[subprocess.Popen[str]], limit: float = LIMIT_S) -> Any:
    deadline = time.monotonic() + limit
    while True:
        got = condition()
        if got:
            return got
        for p in procs:
            assert p.poll() is None, f"a process exited (status {p.returncode}) while waiting for {what}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def stop_processes(procs: list[subprocess.Popen[str]], what: str, limit: float = 30) -> list[int]:
    """SIGTERM each of ``procs`` still running, once, and wait for them all; their exit statuses.

    A process that outlives ``limit`` (only a hang's limit: goclaw stops in well under a second)
    is killed, so a hang never leaves it running into the next test, and the test fails saying so.
    """
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + limit
    hung = []
    for n, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            hung.append(n)
    if hung:
        raise AssertionError(f"{what} {hung} did not stop within {limit:.0f} s of SIGTERM; killed")
    return [p.returncode for p in procs]


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


async def _seed(url: str, n: int) -> list[str]:
    from pairing import PairingStore

    engine = make_engine(url)
    await upgrade(engine)
    store = PairingStore(engine)
    ids = [(await store.add_user(f"Person {i}", "user")).id for i in range(n)]
    await engine.dispose()
    return ids


async def _rows(url: str) -> tuple[list[Any], list[Any]]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            msgs = (await conn.execute(select(Message.__table__).order_by(Message.id))).all()
            jobs = (await conn.execute(select(Job.__table__).order_by(Job.id))).all()
        return list(msgs), list(jobs)
    finally:
        await engine.dispose()


async def _stored(url: str, platform_id: str) -> bool:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            n = await conn.scalar(
                select(func.count()).select_from(Message).where(Message.platform_message_id == platform_id)
            )
        return bool(n)
    finally:
        await engine.dispose()


def _spawn(args: list[str], cwd: Path, log: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1"}
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture
def stack(pg_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A peer, two serve processes and two workers on one fresh PostgreSQL database."""
    users = asyncio.run(_seed(pg_url, SESSIONS))
    tokens = [f"proc-token-{i:02d}-0123456789abcdef" for i in range(SESSIONS)]
    peer_port, ports = free_port(), [free_port(), free_port()]
    peer_log = tmp_path / "peer.jsonl"
    peer_log.touch()
    base = {
        "database": {"url": pg_url},
        "llm": {
            "provider": "openai",
            "model": "echo",
            "base_url": f"http://127.0.0.1:{peer_port}/v1",
            "api_key": "sk-echo",
            "max_retries": 0,
        },
        "session": {"max_messages": 7, "keep_messages": 4, "idle_extract_seconds": 1},
        "worker": {"mode": "separate"},
        "logging": {"level": "INFO"},
    }
    api_users = [{"token": t, "user": u} for t, u in zip(tokens, users, strict=True)]
    procs: list[subprocess.Popen[str]] = []
    logs: dict[str, Path] = {}
    try:
        procs.append(
            _spawn(["-m", "tests.peers.echo_openai", str(peer_port), "150", str(peer_log)], ROOT, tmp_path / "p")
        )
        for i, port in enumerate(ports):
            cfg = {**base, "server": {"port": port, "api_users": api_users}}
            (tmp_path / f"serve{i}.yaml").write_text(json.dumps(cfg))
            logs[f"serve{i}"] = tmp_path / f"serve{i}.log"
            procs.append(_spawn(["-m", "gateway", "serve", "--config", f"serve{i}.yaml"], tmp_path, logs[f"serve{i}"]))
        (tmp_path / "worker.yaml").write_text(json.dumps({**base, "server": {"port": free_port()}}))
        for i in range(2):
            logs[f"worker{i}"] = tmp_path / f"worker{i}.log"
            procs.append(_spawn(["-m", "gateway", "worker", "--config", "worker.yaml"], tmp_path, logs[f"worker{i}"]))
        wait_for(lambda: all(healthy(p) for p in ports), "both serve processes to answer /healthz", procs)
        wait_for(
            lambda: all("goclaw worker: running" in logs[f"worker{i}"].read_text() for i in range(2)),
            "both workers to run",
            procs,
        )
        yield {"url": pg_url, "ports": ports, "tokens": tokens, "peer_log": peer_log, "logs": logs, "procs": procs}
    finally:
        stop_processes(procs, "peer, serve and worker processes")
    for name, path in logs.items():
        assert "Traceback" not in path.read_text(), f"{name}:\n{path.read_text()}"


def _post(port: int, token: str, session: str, text: str, message_id: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat",
        data=json.dumps({"session": session, "text": text, "message_id": message_id}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=LIMIT_S) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_two_serve_processes_and_two_workers_share_one_database(stack: dict[str, Any]) -> None:
    url, ports, tokens, procs = stack["url"], stack["ports"], stack["tokens"], stack["procs"]

    def converse(s: int) -> list[tuple[int, dict[str, Any]]]:
        """One session: message i goes to process i % 2, once message i-1 is stored (and still being answered)."""
        futures = []
        with ThreadPoolExecutor(PER_SESSION) as pool:
            for i in range(PER_SESSION):
                tag = f"s{s}-m{i}"
                futures.append(pool.submit(_post, ports[(i + s) % 2], tokens[s], f"conv-{s}", f"{tag} hello", tag))
                wait_for(lambda tag=tag: asyncio.run(_stored(url, tag)), f"message {tag} to be stored", procs)
        return [f.result() for f in futures]

    with ThreadPoolExecutor(SESSIONS) as pool:
        results = list(pool.map(converse, range(SESSIONS)))
    for s, replies in enumerate(results):
        for i, (status, body) in enumerate(replies):
            assert status == 200, body
            assert body["reply"] == f"re s{s}-m{i}", body

    # Background work: trims and quiet sessions wrote extraction jobs; wait until the workers did them all.
    def jobs_settled() -> list[Any] | None:
        _msgs, jobs = asyncio.run(_rows(url))
        return jobs if jobs and all(j.status not in ("pending", "running") for j in jobs) else None

    jobs = wait_for(jobs_settled, "every job to finish", procs)
    msgs, _ = asyncio.run(_rows(url))

    # Each message stored once, each answered once.
    people = [m for m in msgs if not m.is_agent]
    assert sorted(m.platform_message_id for m in people) == sorted(
        f"s{s}-m{i}" for s in range(SESSIONS) for i in range(PER_SESSION)
    )
    replies = [m for m in msgs if m.is_agent]
    assert sorted(r.reply_to_id for r in replies) == sorted(m.id for m in people)

    # One session's replies in the order of its messages.
    by_id = {m.id: m for m in people}
    for s in range(SESSIONS):
        answered = [by_id[r.reply_to_id].platform_message_id for r in replies if by_id[r.reply_to_id].text[1] == str(s)]
        assert answered == [f"s{s}-m{i}" for i in range(PER_SESSION)], answered

    # Each prompt holds the previous message of its session and the reply to it, in that order.
    prompts: dict[str, list[dict[str, Any]]] = {}
    for line in stack["peer_log"].read_text().splitlines():
        req = json.loads(line)
        if req["schema"] is None:
            users = [m for m in req["messages"] if m["role"] == "user"]
            tag = users[-1]["content"].split("] ", 1)[1].split()[0]
            assert tag not in prompts, f"message {tag} was sent to the model twice"
            prompts[tag] = req["messages"]
    for s in range(SESSIONS):
        for i in range(1, PER_SESSION):
            history = [m["content"] for m in prompts[f"s{s}-m{i}"]]
            asked = next((n for n, c in enumerate(history) if c.endswith(f"s{s}-m{i - 1} hello")), None)
            assert asked is not None, history
            assert history[asked + 1] == f"re s{s}-m{i - 1}", history
            assert history[-1].endswith(f"s{s}-m{i} hello")

    # Every job ran once (a second claim would show as attempt 2), done by the workers.
    assert jobs and all(j.status == "done" and j.attempts == 1 for j in jobs), [
        (j.id, j.kind, j.status, j.attempts) for j in jobs
    ]
    assert {j.locked_by for j in jobs} - {None}
    # The scheduled work (idle sweep, consolidation, SOP schedules) ran in one worker.
    leading = [n for n in ("worker0", "worker1") if "runs the scheduled work" in stack["logs"][n].read_text()]
    assert len(leading) == 1, leading
    # Neither serve process ran it.
    for n in ("serve0", "serve1"):
        assert "runs the scheduled work" not in stack["logs"][n].read_text()

    # The leading worker dies: the other takes the scheduled work over (its lock went with the connection).
    lead = int(leading[0][-1])
    procs[3 + lead].kill()
    procs[3 + lead].wait(timeout=30)
    other = stack["logs"][f"worker{1 - lead}"]
    alive = [p for n, p in enumerate(procs) if n != 3 + lead]
    wait_for(lambda: "runs the scheduled work" in other.read_text(), "the other worker to take over", alive)


def test_consolidation_runs_in_one_process_at_a_time(db_url: str, tmp_path: Path) -> None:
    # On SQLite, serve's notes_distill and its job process's nightly and automatic runs are two processes:
    # a lock of one process (the code before) let both consolidate the same notes at once.
    asyncio.run(_seed(db_url, 0))
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.gateway.consolidate_process", db_url, str(tmp_path / f"r{n}"), str(go), "40"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    try:
        deadline = time.monotonic() + LIMIT_S
        while not all((tmp_path / f"r{n}").exists() for n in range(2)):
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=LIMIT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    results = []
    for (out, errs), p in zip(outputs, procs, strict=True):
        assert p.returncode == 0, errs
        results.append(json.loads(out.strip().splitlines()[-1]))
    intervals = sorted((start, end, n) for n, r in enumerate(results) for start, end in r["intervals"])
    assert intervals, "no consolidation ran"
    for (_s1, end1, n1), (start2, _e2, n2) in itertools.pairwise(intervals):
        assert end1 <= start2, f"a run of process {n2} started while one of process {n1} was running"
    assert sum(len(r["intervals"]) + r["skipped"] for r in results) == 80


def test_workers_on_sqlite_are_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(json.dumps({"server": {"port": free_port()}}))
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", "config.yaml", "--workers", "2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert out.returncode == 2
    assert "--workers 2 needs PostgreSQL" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_separate_worker_on_sqlite_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(json.dumps({"worker": {"mode": "separate"}}))
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "check", "--config", "config.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert out.returncode == 2
    assert "worker.mode: separate needs PostgreSQL" in out.stderr


def _workers_config(tmp_path: Path, url: str, port: int, api_users: list[dict[str, str]] | None = None) -> None:
    server = {"port": port, "api_users": api_users or []}
    (tmp_path / "config.yaml").write_text(
        json.dumps({"database": {"url": url}, "server": server, "logging": {"level": "INFO"}})
    )


def test_serve_with_two_workers_shares_the_port_and_stops_on_sigterm(pg_url: str, tmp_path: Path) -> None:
    port = free_port()
    token = "workers-token-0123456789abcdef"
    user = asyncio.run(_seed(pg_url, 1))[0]
    _workers_config(tmp_path, pg_url, port, [{"token": token, "user": user}])
    log = tmp_path / "out.log"
    parent = _spawn(["-m", "gateway", "serve", "--config", "config.yaml", "--workers", "2"], tmp_path, log)
    try:
        wait_for(lambda: log.read_text().count("goclaw listening on") == 2, "two serve processes", [parent])
        assert healthy(port)
        wait_for(lambda: "goclaw worker: running" in log.read_text(), "the worker process", [parent])
        assert log.read_text().count("?token=") == 1  # one login URL, from the parent
        # Turns through the shared port, whichever process the kernel hands each connection to.
        for i in range(6):
            status, body = _post(port, token, "shared", f"s0-m{i} hello", f"s0-m{i}")
            assert status == 200 and body["reply"], body
    finally:
        stop_processes([parent], "goclaw serve --workers 2", limit=60)
    assert parent.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    assert not healthy(port)


def test_serve_with_workers_exits_nonzero_when_a_process_cannot_start(pg_url: str, tmp_path: Path) -> None:
    with socket.socket() as taken:  # a listener without SO_REUSEPORT: the children cannot share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _workers_config(tmp_path, pg_url, port)
        out = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--config", "config.yaml", "--workers", "2"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "exited with status" in out.stderr
    assert "stopped the others" in out.stderr


def test_on_sqlite_a_slow_job_runs_in_the_job_process_and_turns_go_on(tmp_path: Path) -> None:
    users = asyncio.run(_seed(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}", 1))
    token = "thread-token-0123456789abcdef"
    peer_port, port = free_port(), free_port()
    hold = tmp_path / "hold"
    hold.touch()  # the extraction model answers only once this is gone
    peer_log = tmp_path / "peer.jsonl"
    peer_log.touch()
    cfg = {
        "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"},
        "llm": {"provider": "openai", "model": "echo", "base_url": f"http://127.0.0.1:{peer_port}/v1", "api_key": "k"},
        "server": {"port": port, "api_users": [{"token": token, "user": users[0]}]},
        "session": {"max_messages": 4, "keep_messages": 2, "idle_extract_seconds": 0},
        "logging": {"level": "INFO"},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    procs = [
        _spawn(["-m", "tests.peers.echo_openai", str(peer_port), "0", str(peer_log), str(hold)], ROOT, tmp_path / "p"),
        _spawn(["-m", "gateway", "serve", "--config", "config.yaml"], tmp_path, tmp_path / "serve.log"),
    ]
    try:
        wait_for(lambda: healthy(port), "goclaw serve", procs)
        for i in range(5):  # the fifth passes max_messages: a trim and its extraction job
            status, body = _post(port, token, "first", f"s0-m{i} hello", f"s0-m{i}")
            assert status == 200, body
        wait_for(lambda: "extraction_result" in peer_log.read_text(), "the job's model call", procs)
        # The job waits on its model; turns of this session and another go on meanwhile.
        for i in range(5, 8):
            status, body = _post(port, token, "first" if i % 2 else "second", f"s1-m{i} hi", f"s1-m{i}")
            assert (status, body["reply"]) == (200, f"re s1-m{i}"), body
        _msgs, jobs = asyncio.run(_rows(cfg["database"]["url"]))
        assert next(j.status for j in jobs if j.kind == "extract") == "running"
        hold.unlink()

        def extract_done() -> bool:
            jobs = asyncio.run(_rows(cfg["database"]["url"]))[1]
            return bool(jobs) and all(j.status == "done" for j in jobs if j.kind == "extract")

        wait_for(extract_done, "the job to finish", procs)
    finally:
        stop_processes(procs, "process")
    log = (tmp_path / "serve.log").read_text()
    assert procs[1].returncode == 0, log
    assert "Traceback" not in log


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody has reaped yet counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _job_pids(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"job process started \(pid (\d+)\)", log.read_text())]


def _in_database_file(path: Path, table: str = "messages") -> int:
    """Rows (messages) in the database file itself, the WAL not read (what a copy of the file alone holds)."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def _jobs_done(port: int, kind: str = "extract") -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf'^goclaw_jobs_total\{{kind="{kind}",outcome="done"\}} ([0-9.]+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _sqlite_serve(tmp_path: Path, token: str) -> tuple[str, int, dict[str, Any], Path, subprocess.Popen[str]]:
    """A ``goclaw serve`` on a fresh SQLite file, one API user, trimming after 4 messages (kept 2): its
    database url, port, config, log and process."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    users = asyncio.run(_seed(url, 1))
    port = free_port()
    cfg = {
        "database": {"url": url},
        "server": {"port": port, "api_users": [{"token": token, "user": users[0]}]},
        "session": {"max_messages": 4, "keep_messages": 2, "idle_extract_seconds": 0},
        "logging": {"level": "INFO"},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    log = tmp_path / "serve.log"
    return url, port, cfg, log, _spawn(["-m", "gateway", "serve", "--config", "config.yaml"], tmp_path, log)


def test_on_sqlite_serve_s_trims_are_jobs_the_job_process_runs(tmp_path: Path) -> None:
    token = "trimjob-token-0123456789abcdef"
    url, port, _cfg, log, serve = _sqlite_serve(tmp_path, token)
    procs = [serve]
    try:
        wait_for(lambda: healthy(port), "goclaw serve", procs)
        for i in range(3):  # the third passes max_messages (4): serve queues a trim job after its reply
            status, body = _post(port, token, "room", f"t-m{i} what is on the agenda", f"t-m{i}")
            assert status == 200, body
        # The job process ran the trim (its jobs are counted in serve's /metrics), then the extraction it queued.
        wait_for(lambda: _jobs_done(port, "trim") >= 1, "the trim job, counted in /metrics", procs)
        wait_for(lambda: _jobs_done(port, "extract") >= 1, "the trim's extraction job", procs)
        msgs, jobs = asyncio.run(_rows(url))
        assert [j.kind for j in jobs] == ["extract"]  # the done trim job is forgotten; its archive is its record
        archived = [m.platform_message_id for m in msgs if m.archive_id is not None]
        assert archived == ["t-m0", "t-m0:reply", "t-m1", "t-m1:reply"]
        assert [m.platform_message_id for m in msgs if m.archive_id is None] == ["t-m2", "t-m2:reply"]
        # The next turn is answered after the trim, from the history it left.
        status, body = _post(port, token, "room", "t-m3 and tomorrow", "t-m3")
        assert status == 200, body
    finally:
        stop_processes(procs, "goclaw serve")
    assert procs[0].returncode == 0
    assert "Traceback" not in log.read_text()


def test_a_quiet_session_is_learned_by_the_job_process_s_sweep(db_url: str, tmp_path: Path) -> None:
    # The sweep reads every live message to find the quiet sessions: on the serving process's worker
    # thread it held the GIL the turns' loop needed (10-30 ms every ten seconds with 10,000 stored).
    # On PostgreSQL (worker.mode inline) the job process sweeps under the sweep's own advisory lock.
    users = asyncio.run(_seed(db_url, 1))
    token, port = "idlejob-token-0123456789abcdef", free_port()
    cfg = {
        "database": {"url": db_url},
        "server": {"port": port, "api_users": [{"token": token, "user": users[0]}]},
        "session": {"idle_extract_seconds": 1},
        "logging": {"level": "INFO"},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    log = tmp_path / "serve.log"
    procs = [_spawn(["-m", "gateway", "serve", "--config", "config.yaml"], tmp_path, log)]
    try:
        wait_for(lambda: healthy(port), "goclaw serve", procs)
        status, body = _post(port, token, "quiet", "q-m0 I am based in Lisbon", "q-m0")
        assert status == 200, body
        # No trim: the session goes quiet, the sweep hands the message to extraction, and it is learned.
        wait_for(lambda: _jobs_done(port) >= 1, "the idle slice's extraction job, counted in /metrics", procs)
        learned = asyncio.run(_live_personal(db_url))
        assert "Based in Lisbon" in learned, learned
        handed = [line for line in log.read_text().splitlines() if "handed to extraction" in line]
        assert handed, log.read_text()
        assert all("[job process]" in line for line in handed), handed  # never the serving process
        # Consolidation runs beside the sweep in the job process, off the turns' GIL; serve's worker thread
        # keeps the SOP schedules alone (on PostgreSQL, each under its advisory lock).
        text = log.read_text()
        lead = "[job process] goclaw.worker: this job process runs the scheduled work (idle extraction, consolidation)"
        assert lead in text, text
        thread_lines = [line for line in text.splitlines() if "this worker runs the scheduled work" in line]
        assert thread_lines and all("[job process]" not in line for line in thread_lines), text
        assert all(line.endswith("runs the scheduled work (SOP schedules)") for line in thread_lines), thread_lines
    finally:
        stop_processes(procs, "goclaw serve")
    assert "Traceback" not in log.read_text(), log.read_text()


async def _live_personal(url: str) -> list[str]:
    """The contents of the live personal records."""
    t = MemoryRecord.__table__
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            q = select(t.c.content).where(t.c.scope == "personal", t.c.status == "live")
            return [r[0] for r in await conn.execute(q)]
    finally:
        await engine.dispose()


def test_on_sqlite_the_job_process_is_restarted_on_serve_s_config_and_never_outlives_serve(tmp_path: Path) -> None:
    token = "jobproc-token-0123456789abcdef"
    url, port, cfg, log, serve = _sqlite_serve(tmp_path, token)
    procs = [serve]
    first: list[int] = []
    try:
        wait_for(lambda: healthy(port), "goclaw serve", procs)
        first = wait_for(lambda: _job_pids(log), "the job process to start", procs)
        # Background work by definition: the kernel gives serve the CPU first, and the GIL's switch
        # interval is short, so a write transaction of its loop never waits 5 ms behind a clustering thread.
        wait_for(
            lambda: f"GIL switch interval {JOB_SWITCH_INTERVAL_S * 1000:.1f} ms" in log.read_text(),
            "the job process's switch interval in the log",
            procs,
        )
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, serve.pid) + JOB_NICE)
        assert os.getpriority(os.PRIO_PROCESS, first[0]) == niceness

        def converse(prefix: str) -> None:
            for i in range(5):  # the fifth passes max_messages: a trim and its extraction job
                status, body = _post(port, token, prefix, f"{prefix}-m{i} I live in Lisbon", f"{prefix}-m{i}")
                assert status == 200, body

        converse("a")
        # The job ran in the job process, and the serving process's /metrics counted it.
        wait_for(lambda: _jobs_done(port) >= 1, "the first extraction job, counted in /metrics", procs)
        # The turns never copy the WAL into the database file; the job process does, every second.
        wait_for(lambda: _in_database_file(tmp_path / "g.db") >= 10, "the turns' messages in the database file", procs)
        # The operator edits the file meanwhile (another database, here): serve runs on with the config it
        # started with, and so must a job process it starts again, or its jobs would go to another database.
        edited = {**cfg, "database": {"url": f"sqlite+aiosqlite:///{tmp_path / 'other.db'}"}}
        (tmp_path / "config.yaml").write_text(json.dumps(edited))
        os.kill(first[0], signal.SIGKILL)
        pids = wait_for(lambda: _job_pids(log)[1:], "serve to start another job process", procs)
        assert pids[0] != first[0]
        assert "exited with status -9" in log.read_text()
        converse("b")

        def all_done() -> list[Any] | None:
            jobs = [j for j in asyncio.run(_rows(url))[1] if j.kind == "extract"]
            return jobs if jobs and all(j.status == "done" for j in jobs) else None

        jobs = wait_for(all_done, "every job, the later ones run by the new job process", procs)
        assert not (tmp_path / "other.db").exists()  # the new job process never read the edited file
        wait_for(lambda: _jobs_done(port) >= len(jobs) - 1, "the new process's jobs counted in /metrics", procs)
        serve.kill()  # no clean stop: the job process sees its socket close, and exits
        serve.wait(timeout=30)
        wait_for(lambda: _gone(pids[0]), "the job process to exit after serve died", [])
    finally:
        try:
            stop_processes([serve], "goclaw serve")
        finally:
            for pid in _job_pids(log):
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in log.read_text(), log.read_text()

"""``goclaw memory revisions``, ``revisions undo``, ``review``, ``retract`` and ``consolidate`` as real processes.

Against a real SQLite file; the CLI acts as the operator (a human admin).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from gateway.db import make_engine, upgrade
from memory.store import MemoryStore
from memory.writer import MemoryWriter
from tests.memory.conftest import ALICE, BOB, T0

RUN = "from gateway.cli.memory import memory_app; memory_app(prog_name='goclaw memory')"
DAY = timedelta(days=1)


def goclaw_memory(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", RUN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr
    return done


def error(done: subprocess.CompletedProcess[str], text: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert text in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    (tmp_path / "data").mkdir()

    async def fill() -> None:
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'data' / 'goclaw.db'}")
        await upgrade(engine)
        writer = MemoryWriter(MemoryStore(engine))
        for n in range(2):
            await writer.write(ALICE, "agent_notes", "live", subject=f"s{n}", content=f"old {n}", said_at=T0)
            await writer.write(
                ALICE, "agent_notes", "relearn", subject=f"s{n}", content=f"new {n}", said_at=T0 + DAY,
                trusted=True, run_id="rl_1",
            )  # fmt: skip
        await writer.write(BOB, "agent_notes", "relearn", subject="q", content="bob's table", said_at=T0)
        await writer.write(BOB, "agent_notes", "relearn", subject="r", content="bob's host", said_at=T0)
        await writer.write(ALICE, "agent_notes", "live", subject="vpn", content="vpn.example.internal", said_at=T0)
        await writer.write(ALICE, "agent_notes", "live", subject="vpn host", content="VPN.example.internal", said_at=T0)
        await engine.dispose()

    asyncio.run(fill())
    return tmp_path


def test_revisions_list_undo_one_and_undo_a_run(workdir: Path) -> None:
    listed = json.loads(ok(goclaw_memory("revisions", "--json", cwd=workdir)).stdout)
    assert len(listed) == 2 and {r["run_id"] for r in listed} == {"rl_1"}
    assert {(r["via"], r["cause"]) for r in listed} == {("subject_rule", "relearn")}
    table = ok(goclaw_memory("revisions", "--run", "rl_1", cwd=workdir)).stdout
    assert listed[0]["id"] in table and "subject_rule" in table

    one = json.loads(ok(goclaw_memory("revisions", "undo", listed[0]["id"], "--json", cwd=workdir)).stdout)
    assert one["restored"][0]["id"] == listed[0]["retired_id"] and one["restored"][0]["status"] == "live"
    assert one["undone"][0]["undone_by"] == "operator"
    error(goclaw_memory("revisions", "undo", listed[0]["id"], cwd=workdir), "already undone")

    run = ok(goclaw_memory("revisions", "undo", "--run", "rl_1", cwd=workdir)).stdout
    assert listed[1]["retired_id"] in run and "never replace it again" in run
    error(goclaw_memory("revisions", "undo", "--run", "rl_1", cwd=workdir), "already undone")
    after = json.loads(ok(goclaw_memory("revisions", "--json", cwd=workdir)).stdout)
    assert all(r["undone_at"] for r in after)


def test_revisions_errors_exit_2(workdir: Path) -> None:
    error(goclaw_memory("revisions", "undo", "rv_nope", cwd=workdir), "no revision rv_nope")
    error(goclaw_memory("revisions", "undo", "--run", "nope", cwd=workdir), "no run nope")
    error(goclaw_memory("revisions", "undo", cwd=workdir), "give one revision id, or --run")
    error(goclaw_memory("revisions", "--run", "nope", cwd=workdir), "no revisions in run")


def test_review_list_confirm_reject(workdir: Path) -> None:
    pending = json.loads(ok(goclaw_memory("review", "--json", cwd=workdir)).stdout)
    assert {r["content"] for r in pending} == {"bob's table", "bob's host"}
    assert all(r["status"] == "unverified" and "evidence" in r for r in pending)
    by_content = {r["content"]: r["id"] for r in pending}
    confirmed = json.loads(
        ok(goclaw_memory("review", "confirm", by_content["bob's table"], "--json", cwd=workdir)).stdout
    )
    assert confirmed["record"]["status"] == "live" and confirmed["run_id"].startswith("cf_")
    rejected = ok(goclaw_memory("review", "reject", by_content["bob's host"], "--reason", "wrong", cwd=workdir))
    assert "rejected" in rejected.stdout
    assert "nothing awaits review" in ok(goclaw_memory("review", cwd=workdir)).stdout
    error(goclaw_memory("review", "confirm", by_content["bob's host"], cwd=workdir), "is rejected, not awaiting")
    error(goclaw_memory("review", "reject", "m_nope", cwd=workdir), "no memory record")


def test_consolidate_then_retract(workdir: Path) -> None:
    run = json.loads(ok(goclaw_memory("consolidate", "--json", cwd=workdir)).stdout)
    ((merge),) = run["merged"]
    assert len(merge["sources"]) == 2 and run["model_calls"] == 1 and run["refused"] is None
    revisions = json.loads(ok(goclaw_memory("revisions", "--run", run["run_id"], "--json", cwd=workdir)).stdout)
    assert {(r["via"], r["cause"], r["replacing_id"]) for r in revisions} == {
        ("consolidation", "consolidate", merge["record_id"])
    }
    assert all(r["judge_model"] == "builtin-offline" for r in revisions)

    admin, user = _pair(workdir)
    rid = merge["record_id"]
    # Issue 11: --by names a paired admin, checked in code; the CLI no longer records "operator".
    error(goclaw_memory("retract", rid, "--by", user, "--reason", "moved", cwd=workdir), "is not an admin")
    error(goclaw_memory("retract", rid, "--by", "operator", "--reason", "moved", cwd=workdir), "not a paired person")
    error(goclaw_memory("retract", rid, "--by", admin, "--reason", " ", cwd=workdir), "needs a reason")
    done = json.loads(
        ok(goclaw_memory("retract", rid, "--by", admin, "--reason", "moved", "--json", cwd=workdir)).stdout
    )
    assert done["status"] == "retracted"
    error(goclaw_memory("retract", rid, "--by", admin, "--reason", "again", cwd=workdir), "only a live note")


def _pair(workdir: Path) -> tuple[str, str]:
    from pairing.store import PairingStore

    async def pair() -> tuple[str, str]:
        engine = make_engine(f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}")
        try:
            store = PairingStore(engine)
            return (await store.add_user("Ada", "admin")).id, (await store.add_user("Ben", "user")).id
        finally:
            await engine.dispose()

    return asyncio.run(pair())


def test_revise_on_demand_is_a_revision_run_with_cause_revise(workdir: Path) -> None:
    async def two_values() -> list[str]:
        engine = make_engine(f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}")
        try:
            writer = MemoryWriter(MemoryStore(engine))
            old = await writer.write(
                ALICE, "agent_notes", "live", subject="report table", content="The report uses example_orders.",
                said_at=T0,
            )  # fmt: skip
            new = await writer.write(
                ALICE, "agent_notes", "live", subject="report source",
                content="Use example_archive instead of example_orders for the report.", said_at=T0 + DAY,
            )  # fmt: skip
            assert old.record and new.record
            return [old.record.id, new.record.id]
        finally:
            await engine.dispose()

    old, new = asyncio.run(two_values())
    run = json.loads(ok(goclaw_memory("revise", new, "--json", cwd=workdir)).stdout)
    assert run["run_id"].startswith("rv_") and run["revised"] == 1 and run["retired"] == [old]
    rows = json.loads(ok(goclaw_memory("revisions", "--run", run["run_id"], "--json", cwd=workdir)).stdout)
    assert [(r["retired_id"], r["replacing_id"], r["cause"]) for r in rows] == [(old, new, "revise")]

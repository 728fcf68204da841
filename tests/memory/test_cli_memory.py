"""``goclaw memory list/search/show``, run as a real process against a real SQLite file."""

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
from tests.memory.conftest import ALICE, BOB, CAROL, T0

RUN = "from gateway.cli.memory import memory_app; memory_app(prog_name='goclaw memory')"
FIELDS = {"id", "scope", "user_id", "subject", "content", "status", "said_at", "recorded_at", "source", "author_id"}


def goclaw_memory(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", RUN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    (tmp_path / "data").mkdir()

    async def fill() -> None:
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'data' / 'goclaw.db'}")
        await upgrade(engine)
        writer = MemoryWriter(MemoryStore(engine))
        await writer.write(
            ALICE, "agent_notes", "live", subject="report data source", content="example_orders", said_at=T0
        )
        await writer.write(
            ALICE, "agent_notes", "live", subject="report data source", content="example_archive",
            said_at=T0 + timedelta(hours=1),
        )  # fmt: skip
        await writer.write(BOB, "personal", "live", subject="reply language", content="English please", said_at=T0)
        await writer.write(CAROL, "personal", "live", subject="reply language", content="French please", said_at=T0)
        await engine.dispose()

    asyncio.run(fill())
    return tmp_path


def test_list_json_live_and_all(workdir: Path) -> None:
    live = goclaw_memory("list", "--json", cwd=workdir)
    assert live.returncode == 0, live.stderr
    records = json.loads(live.stdout)
    assert len(records) == 3 and all(set(r) >= FIELDS for r in records)
    assert {r["status"] for r in records} == {"live"}
    everything = json.loads(goclaw_memory("list", "--all", "--json", cwd=workdir).stdout)
    assert len(everything) == 4 and {r["status"] for r in everything} == {"live", "superseded"}
    notes = json.loads(goclaw_memory("list", "--scope", "agent_notes", "--json", cwd=workdir).stdout)
    assert [(r["content"], r["author_id"], r["source"]) for r in notes] == [("example_archive", "u_alice", "live")]
    bob = json.loads(goclaw_memory("list", "--user", "u_bob", "--json", cwd=workdir).stdout)
    assert [(r["user_id"], r["content"]) for r in bob] == [("u_bob", "English please")]
    table = goclaw_memory("list", cwd=workdir)
    assert table.returncode == 0 and "example_archive" in table.stdout


def test_search_and_show(workdir: Path) -> None:
    found = json.loads(goclaw_memory("search", "example", "--json", cwd=workdir).stdout)
    assert {r["content"] for r in found} == {"example_orders", "example_archive"}
    old = next(r for r in found if r["content"] == "example_orders")
    assert old["status"] == "superseded"
    shown = goclaw_memory("show", old["id"], "--json", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    (rev,) = detail["revisions"]
    assert rev["retired_id"] == old["id"] and rev["via"] == "subject_rule"
    text = goclaw_memory("show", old["id"], cwd=workdir)
    assert "revision rv_" in text.stdout and "subject_rule" in text.stdout


def test_errors_are_one_line_and_exit_2(workdir: Path) -> None:
    bad_scope = goclaw_memory("list", "--scope", "everything", cwd=workdir)
    assert bad_scope.returncode == 2 and "unknown scope" in bad_scope.stderr
    assert len(bad_scope.stderr.strip().splitlines()) == 1 and "Traceback" not in bad_scope.stderr
    missing = goclaw_memory("show", "m_nope", cwd=workdir)
    assert missing.returncode == 2 and "no memory record" in missing.stderr
    no_config = goclaw_memory("list", "--config", str(workdir / "absent.yaml"), cwd=workdir)
    assert no_config.returncode == 2 and "Traceback" not in no_config.stderr


def test_an_expired_note_is_listed_only_with_all(workdir: Path) -> None:
    async def expired_note() -> str:
        engine = make_engine(f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}")
        try:
            # Written a year ago with a 3-day review-by: long expired by the CLI's (real) clock.
            writer = MemoryWriter(MemoryStore(engine, clock=lambda: T0 - timedelta(days=365)), notes_review_days=3)
            res = await writer.write(
                ALICE, "agent_notes", "live", subject="vpn", content="vpn01.internal", said_at=T0 - timedelta(days=365)
            )
            assert res.record is not None
            return res.record.id
        finally:
            await engine.dispose()

    rid = asyncio.run(expired_note())
    current = json.loads(goclaw_memory("list", "--scope", "agent_notes", "--json", cwd=workdir).stdout)
    assert rid not in {r["id"] for r in current}
    everything = json.loads(goclaw_memory("list", "--all", "--scope", "agent_notes", "--json", cwd=workdir).stdout)
    assert [r["status"] for r in everything if r["id"] == rid] == ["expired"]

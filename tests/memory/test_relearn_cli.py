"""``goclaw memory relearn``, run as a real process against a real SQLite file and the builtin model."""

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
from gateway.sessions import SessionKey, SessionStore
from memory.extract import archive_trust
from memory.store import MemoryStore
from pairing.principal import Principal
from tests.memory.conftest import ALICE, BOB, T0

RUN = "from gateway.cli.memory import memory_app; memory_app(prog_name='goclaw memory')"


def goclaw_memory(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", RUN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _url(tmp: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp / 'data' / 'goclaw.db'}"


async def _trim(sessions: SessionStore, conversation: str, lines: list[tuple[Principal, str]], minute: int) -> str:
    sid = await sessions.session_id(SessionKey("discord", conversation))
    for n, (who, text) in enumerate(lines):
        await sessions.store_message(
            sid, platform_message_id=f"{conversation}-{n}", speaker=who, display_name=who.display_name, text=text,
            said_at=T0 + timedelta(minutes=minute + n),
        )  # fmt: skip
        await sessions.store_message(
            sid, platform_message_id=f"{conversation}-{n}-r", speaker=None, display_name="goclaw", text="Noted.",
            said_at=T0 + timedelta(minutes=minute + n, seconds=30), is_agent=True,
        )  # fmt: skip
    trimmed = await sessions.trim(
        sid, max_messages=1, keep_messages=0, turn_principal=lines[0][0], trust_of=archive_trust
    )
    assert trimmed is not None
    return sid


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    (tmp_path / "data").mkdir()

    async def fill() -> None:
        engine = make_engine(_url(tmp_path))
        await upgrade(engine)
        sessions = SessionStore(engine)
        await _trim(sessions, "admin-dm", [(ALICE, "rule: the daily report uses example_orders")], 0)
        await _trim(
            sessions,
            "shared",
            [(ALICE, "rule: the export lives on files.example.internal"), (BOB, "My name is Bob. rule: use table_b")],
            60,
        )
        await engine.dispose()

    asyncio.run(fill())
    return tmp_path


def _records(tmp: Path) -> list[dict[str, object]]:
    async def read() -> list[dict[str, object]]:
        engine = make_engine(_url(tmp))
        try:
            return [r.as_json() for r in await MemoryStore(engine).list_records(include_history=True)]
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_relearn_from_the_database_learns_admin_and_quarantines_the_rest(workdir: Path) -> None:
    dry = goclaw_memory("relearn", "--dry-run", "--json", cwd=workdir)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] and planned["learned"] == 1 and planned["quarantined"] == 2
    assert _records(workdir) == []

    first = goclaw_memory("relearn", "--json", cwd=workdir)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["archives_read"], summary["learned"], summary["quarantined"]) == (2, 1, 2)
    assert summary["dropped"] >= 1  # Bob's name: personal lines are not relearned
    records = _records(workdir)
    assert sorted(r["status"] for r in records) == ["live", "unverified", "unverified"]
    (live,) = [r for r in records if r["status"] == "live"]
    assert live["said_at"] == T0.isoformat() and live["source"] == "relearn"

    again = goclaw_memory("relearn", "--json", cwd=workdir)
    assert again.returncode == 0, again.stderr
    twice = json.loads(again.stdout)
    assert (twice["learned"], twice["quarantined"], twice["duplicates"]) == (0, 0, 3)
    assert len(_records(workdir)) == 3


def test_relearn_a_session_since_a_date_prints_a_summary_table(workdir: Path) -> None:
    done = goclaw_memory("relearn", "--since", "2026-11-30T08:30", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "archives read" in done.stdout and "quarantined as unverified" in done.stdout
    # Only the shared thread's archive ends after 08:30: a mixed archive, all quarantined.
    assert [r["status"] for r in _records(workdir)] == ["unverified", "unverified"]


def test_relearn_exported_files_and_says_when_trust_is_missing_or_unknown(workdir: Path, tmp_path: Path) -> None:
    async def export() -> list[str]:
        engine = make_engine(_url(workdir))
        try:
            return [a.markdown for a in await SessionStore(engine).list_archives()]
        finally:
            await engine.dispose()

    admin_md, shared_md = asyncio.run(export())
    folder = tmp_path / "exported"
    folder.mkdir()
    no_trust = "\n".join(line for line in admin_md.splitlines() if not line.startswith("- **Trust**")) + "\n"
    (folder / "1-no-trust.md").write_text(no_trust)
    (folder / "2-unknown.md").write_text(shared_md.replace("- **Trust**: mixed", "- **Trust**: root"))
    done = goclaw_memory("relearn", "--archive", str(folder), "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["learned"] == 0 and summary["quarantined"] == 3
    assert summary["archives_without_trust"] == 1 and summary["archives_with_unknown_trust"] == 1
    assert any("no **Trust**: line" in n for n in summary["notes"])
    assert any("unknown **Trust**: value" in n and "'root'" in n for n in summary["notes"])


def test_relearn_errors_exit_2_with_one_line(workdir: Path) -> None:
    missing = goclaw_memory("relearn", "--archive", "nope.md", cwd=workdir)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad_date = goclaw_memory("relearn", "--since", "yesterday", cwd=workdir)
    assert bad_date.returncode == 2 and "--since" in bad_date.stderr
    (workdir / "list.md").write_text("# groceries\n- milk\n")
    not_archive = goclaw_memory("relearn", "--archive", "list.md", cwd=workdir)
    assert not_archive.returncode == 2 and "not a session archive" in not_archive.stderr


def test_relearn_one_session(workdir: Path) -> None:
    async def admin_session() -> str:
        engine = make_engine(_url(workdir))
        try:
            sid = await SessionStore(engine).find_session(SessionKey("discord", "admin-dm"))
            assert sid
            return sid
        finally:
            await engine.dispose()

    done = goclaw_memory("relearn", "--session", asyncio.run(admin_session()), "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["archives_read"] == 1
    assert [r["status"] for r in _records(workdir)] == ["live"]

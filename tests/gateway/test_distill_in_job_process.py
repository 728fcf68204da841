"""``notes_distill`` asked in a turn runs in serve's job process, not on the turns' loop.

A consolidation run's clustering is Python: about 10 s with 65,536 notes and
nothing remembered, 0.2-2.5 s after. On the serving process's loop that stopped
every turn for as long. Here a real ``goclaw serve`` talks to a local
OpenAI-compatible peer that asks for the tool; the run, its model call and its
log line are the job process's, and the admin gets its summary. The child's
reading of what the parent sends is attacked with crafted bytes.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from gateway.db import make_engine, upgrade
from gateway.jobproc import DISTILL_DOWN, REQUEST_LIMIT, JobProcess, ParentRequests
from memory.store import MemoryStore
from memory.tools_admin import REFUSE_DISTILL
from memory.writer import MemoryWriter
from pairing import PairingStore
from pairing.principal import Principal, Role
from tests.gateway.test_processes import _post, _spawn, free_port, healthy, stop_processes, wait_for
from tests.peers.fake_openai import FakeOpenAI

NO_MERGES = json.dumps({"merges": []})
TOKEN = "distill-admin-token-0123456789abcdef"


async def _seed(url: str) -> str:
    """An admin to ask, and two operational notes alike enough to be shown to the model together."""
    engine = make_engine(url)
    try:
        await upgrade(engine)
        admin = await PairingStore(engine).add_user("Ada", "admin")
        writer = MemoryWriter(MemoryStore(engine))
        asker = Principal.human(admin.id, Role.ADMIN, "Ada")
        now = datetime.now(UTC)
        await writer.write(
            asker, "agent_notes", "live", subject="vpn", content="VPN on vpn.example.internal", said_at=now
        )
        await writer.write(
            asker,
            "agent_notes",
            "live",
            subject="vpn backup",
            content="Backup VPN on vpn2.example.internal",
            said_at=now,
        )
        return admin.id
    finally:
        await engine.dispose()


async def test_an_admin_s_notes_distill_runs_in_the_job_process(db_url: str, tmp_path: Path) -> None:
    admin = await _seed(db_url)
    port = free_port()
    async with FakeOpenAI() as peer:
        peer.reply_tool_calls(("notes_distill", {}))  # the turn's model asks for the tool
        peer.reply_text(NO_MERGES)  # the consolidation run's one call (the job process's)
        peer.reply_text("Done: nothing to merge.")  # the turn's model, after the tool's result
        cfg = {
            "database": {"url": db_url},
            "llm": {"provider": "openai", "model": "gpt-test", "base_url": peer.base_url, "api_key": "sk-test"},
            "server": {"port": port, "api_users": [{"token": TOKEN, "user": admin}]},
            "memory": {"auto_distill": False},
            "logging": {"level": "INFO"},
        }
        (tmp_path / "config.yaml").write_text(json.dumps(cfg))
        log = tmp_path / "serve.log"
        procs = [_spawn(["-m", "gateway", "serve", "--config", "config.yaml"], tmp_path, log)]
        try:
            await asyncio.to_thread(wait_for, lambda: healthy(port), "goclaw serve", procs)
            await asyncio.to_thread(
                wait_for,
                lambda: "this job process runs the scheduled work (idle extraction, consolidation)" in log.read_text(),
                "the job process to run consolidation",
                procs,
            )
            status, body = await asyncio.to_thread(_post, port, TOKEN, "ops", "merge the notes that repeat", "d-1")
            assert status == 200, body
            assert "Done: nothing to merge." in json.dumps(body), body
        finally:
            await asyncio.to_thread(stop_processes, procs, "goclaw serve")
        assert not peer.rejections, peer.rejections
        assert len(peer.requests) == 3, peer.requests
        # The tool's result, as the turn's model saw it, is the job process's run summary.
        tool = [m for m in peer.requests[2]["messages"] if m["role"] == "tool"]
        assert len(tool) == 1 and tool[0]["content"].startswith("Consolidation run cr_"), tool
        assert "1 model call(s), 2 note(s) looked at" in tool[0]["content"], tool
    text = log.read_text()
    ran = [line for line in text.splitlines() if "consolidation (notes_distill):" in line]
    assert len(ran) == 1 and "[job process]" in ran[0], text
    assert "Traceback" not in text, text


async def test_without_a_job_process_the_admin_is_told_to_ask_again_and_others_are_refused() -> None:
    jobs = JobProcess(None)  # never started: no child to run it
    assert await jobs.notes_distill(Principal.human("u_ada", Role.ADMIN, "Ada")) == DISTILL_DOWN
    assert await jobs.notes_distill(Principal.human("u_bob", Role.USER, "Bob")) == REFUSE_DISTILL
    assert await jobs.notes_distill(Principal.system("cron-system")) == REFUSE_DISTILL


def test_the_child_reads_wakes_and_requests_whole_however_they_arrive() -> None:
    r = ParentRequests()
    assert r.feed(b"w") == (True, [])
    assert r.feed(b"www") == (True, [])
    # A request cut anywhere, with wakes around it.
    line = b'd 7 {"user_id": "u_ada", "role": "admin", "display_name": "Ada"}\n'
    assert r.feed(b"w" + line[:5]) == (True, [])
    assert r.feed(line[5:20]) == (False, [])
    woke, asked = r.feed(line[20:] + b"w")
    assert woke and asked == [(7, {"user_id": "u_ada", "role": "admin", "display_name": "Ada"})]
    # Two requests in one read.
    woke, asked = r.feed(b'd 8 {"a": 1}\nd 9 {"b": 2}\n')
    assert not woke and asked == [(8, {"a": 1}), (9, {"b": 2})]


def test_the_child_survives_bytes_crafted_to_break_its_reading() -> None:
    r = ParentRequests()
    # Not JSON, JSON that is no object: answered as unreadable (the id is known, the asker waits for it).
    assert r.feed(b"d 3 {not json\n") == (False, [(3, None)])
    assert r.feed(b'd 4 ["admin"]\n') == (False, [(4, None)])
    assert r.feed(b"d 5 null\n") == (False, [(5, None)])
    # No id, a bad id, no body, not our verb: a wake at most, never a request.
    for junk in (b"d\n", b"d x {}\n", b"d -1 {}\n", b"d 6\n", b"dd 1 {}\n", b"d \xff\xfe {}\n"):
        assert r.feed(junk) == (True, []), junk
    assert r.feed(b"\x00\xff\n\n") == (True, [])
    # A "request" that never ends is not buffered without bound, and reading goes on after it.
    assert r.feed(b"d 1 " + b"x" * (REQUEST_LIMIT + 10)) == (True, [])
    assert r.feed(b'd 2 {"ok": true}\n') == (False, [(2, {"ok": True})])

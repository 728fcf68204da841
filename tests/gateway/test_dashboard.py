"""The dashboard over real HTTP on 127.0.0.1, on SQLite and PostgreSQL: explain a turn, commands, pages, actions."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestServer

from gateway.app import Gateway
from gateway.config import Config
from gateway.sessions import SessionKey
from gateway.turn import TurnRequest
from gateway.web.dashboard import queries
from pairing.principal import Principal, Role

TOKEN = "dashboard-token-for-dashboard-tests-0123456789"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
OPERATOR = Principal.human("admin", Role.ADMIN, "Dashboard")


@dataclass
class Dash:
    gw: Gateway
    base: str
    http: ClientSession
    csrf: str = ""

    async def post(self, path: str, **data: str) -> tuple[int, str]:
        r = await self.http.post(self.base + path, data={"csrf": self.csrf, **data})
        return r.status, await r.text()

    async def get(self, path: str) -> tuple[int, str]:
        r = await self.http.get(self.base + path)
        return r.status, await r.text()


@pytest.fixture
async def dash(db_url: str) -> AsyncIterator[Dash]:
    cfg = Config.model_validate({"database": {"url": db_url}, "server": {"dashboard_token": TOKEN}})
    gw = Gateway(cfg)
    await gw.start(channels=False, worker=False)
    srv = TestServer(gw.web, host="127.0.0.1")
    await srv.start_server()
    async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
        d = Dash(gw, str(srv.make_url("")).rstrip("/"), http)
        await http.get(f"{d.base}/?token={TOKEN}")
        page = await (await http.get(f"{d.base}/dashboard/people")).text()
        m = re.search(r'name="csrf" value="([^"]+)"', page)
        assert m
        d.csrf = m.group(1)
        yield d
    await srv.close()
    await gw.stop()


async def _note(gw: Gateway, admin: Principal, subject: str, content: str, at: datetime) -> str:
    res = await gw.memory.writer.write(admin, "agent_notes", "directive", subject=subject, content=content, said_at=at)
    assert res.record is not None
    return res.record.id


async def test_a_reply_is_stored_with_what_its_prompt_held_and_the_explain_page_shows_it(dash: Dash) -> None:
    gw = dash.gw
    carol = Principal.human((await gw.pairing.add_user("Carol", "admin")).id, Role.ADMIN, "Carol")
    note = await _note(gw, carol, "daily report data source", "The daily report uses example_orders", T0)
    result = await gw.turns.handle(
        TurnRequest(
            key=SessionKey("web", "admin/dashboard"),
            principal=OPERATOR,
            text="Where does the daily report come from?",
            message_id="m-1",
            said_at=T0 + timedelta(hours=1),
        )
    )
    assert result.turn_record_id is not None
    turn = await queries.get_turn(gw.engine, result.turn_record_id)
    assert turn is not None
    assert (turn.message_id, turn.speaker_user_id, turn.text) == (
        "m-1",
        "admin",
        "Where does the daily report come from?",
    )
    assert turn.reply == result.reply
    assert [m["id"] for m in turn.memory] == [note]
    assert "daily" in turn.memory[0]["why"] and "report" in turn.memory[0]["why"]
    assert turn.sections["operational notes"] > 0 and turn.sections["conversation history"] > 0
    assert turn.model_calls["provider"] == "builtin" and turn.model_calls["steps"] == 1
    status, page = await dash.get(f"/dashboard/turns/{turn.id}")
    assert status == 200
    assert note in page and "sharing words with the conversation" in page and "operational notes" in page
    # The explanation is what was given then: retracting the note later does not rewrite it.
    await dash.post("/dashboard/memory/retract", id=note, reason="wrong table")
    status, page = await dash.get(f"/dashboard/turns/{turn.id}")
    assert note in page and "now retracted" in page


async def test_chat_slash_commands_run_as_in_a_dm_and_other_text_goes_to_the_model(dash: Dash) -> None:
    gw = dash.gw
    issued = await gw.pairing.request_code("discord", "777", "Dana")
    headers = {"X-CSRF-Token": dash.csrf}
    r = await dash.http.post(f"{dash.base}/dashboard/chat/command", data={"text": "/pair list"}, headers=headers)
    assert issued.code in (await r.json())["reply"]
    r = await dash.http.post(
        f"{dash.base}/dashboard/chat/command", data={"text": f"/pair approve {issued.code} admin"}, headers=headers
    )
    assert "Approved" in (await r.json())["reply"]
    dana = await gw.pairing.resolve("discord", "777")
    assert dana is not None and dana.role is Role.ADMIN
    r = await dash.http.post(f"{dash.base}/dashboard/chat/command", data={"text": "/whoami"}, headers=headers)
    assert "operator" in (await r.json())["reply"]
    r = await dash.http.post(f"{dash.base}/dashboard/chat/command", data={"text": "hello there"}, headers=headers)
    assert await r.json() == {"command": False}
    # Commands are audited via the dashboard, by the operator; none of them reached the session.
    assert ("dashboard", "admin", "pair", "ok") in {a[1:5] for a in await gw.pairing.audit_log()}
    assert await gw.sessions.find_session(SessionKey("web", "admin/dashboard")) is None


async def test_memory_pages_are_keyset_paged_without_gaps_or_repeats(dash: Dash) -> None:
    gw = dash.gw
    alice = (await gw.pairing.add_user("Alice", "user")).id
    me = Principal.human(alice, Role.USER, "Alice")
    for i in range(120):
        await gw.memory.writer.write(
            me,
            "personal",
            "live",
            subject=f"fact {i}",
            content=f"Alice fact number {i}",
            # Pairs share a said_at: the cursor must break ties by id.
            said_at=T0 + timedelta(minutes=i // 2),
            owner_user_id=alice,
        )
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = await queries.memory_page(
            gw.engine, queries.MemoryFilter(owner=alice), after=after, now=gw.clock(), limit=50
        )
        seen += [r.id for r in page.rows]
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert pages == 3 and len(seen) == 120 and len(set(seen)) == 120
    status, html = await dash.get(f"/dashboard/memory?owner={alice}&q=number+117")
    assert status == 200 and "Alice fact number 117" in html and "Alice fact number 116" not in html


async def test_review_retract_and_undo_through_the_dashboard(dash: Dash) -> None:
    gw = dash.gw
    carol = Principal.human((await gw.pairing.add_user("Carol", "admin")).id, Role.ADMIN, "Carol")
    bob = Principal.human((await gw.pairing.add_user("Bob", "user")).id, Role.USER, "Bob")
    old = await _note(gw, carol, "deploy window", "Deploys happen on Tuesdays", T0)
    new = await _note(gw, carol, "deploy window", "Deploys happen on Thursdays", T0 + timedelta(days=1))
    (rev,) = await gw.memory.store.revisions_for(old)
    status, page = await dash.get(f"/dashboard/memory/undo?revision={rev.id}")

    assert status == 200 and "Deploys happen on Tuesdays" in page and "stays" in page
    status, _ = await dash.post("/dashboard/memory/undo", revision=rev.id)
    assert status == 200
    assert (await gw.memory.store.get(old)).status == "live"  # type: ignore[union-attr]
    status, page = await dash.post("/dashboard/memory/undo", revision=rev.id)
    assert status == 400 and "already undone" in page
    # Retract needs a reason; then the note is out of use, kept as history.
    status, page = await dash.post("/dashboard/memory/retract", id=new)
    assert status == 400 and "reason" in page
    status, _ = await dash.post("/dashboard/memory/retract", id=new, reason="Thursdays was a one-off")
    assert (await gw.memory.store.get(new)).status == "retracted"  # type: ignore[union-attr]
    # An unverified record is rejected from the review queue.
    q = await gw.memory.writer.write(
        bob, "agent_notes", "relearn", subject="report tables", content="Reports use example_archive", said_at=T0
    )
    assert q.record is not None and q.record.status == "unverified"
    status, page = await dash.get("/dashboard/memory/review")
    assert q.record.id in page
    await dash.post("/dashboard/memory/reject", id=q.record.id, reason="never said by an admin")
    assert (await gw.memory.store.get(q.record.id)).status == "rejected"  # type: ignore[union-attr]
    actions = {(a[1], a[2], a[3], a[4]) for a in await gw.pairing.audit_log()}
    assert ("dashboard", "admin", "memory undo", "ok") in actions
    assert ("dashboard", "admin", "memory undo", "error") in actions
    assert ("dashboard", "admin", "memory retract", "ok") in actions
    assert ("dashboard", "admin", "memory reject", "ok") in actions


async def test_every_page_renders_and_unknown_ids_are_404(dash: Dash) -> None:
    for path in (
        "/dashboard/",
        "/dashboard/people",
        "/dashboard/memory",
        "/dashboard/memory/review",
        "/dashboard/chat",
        "/dashboard/turns",
        "/dashboard/sops",
        "/dashboard/identity",
        "/dashboard/findings",
    ):
        status, page = await dash.get(path)
        assert status == 200, (path, page[:300])
        assert "csrf" in page
        if path == "/dashboard/":  # older done jobs are deleted (worker.keep_done_jobs_days): the count says so
            assert "<dt>Done (last 7 days)</dt>" in page
    for path in ("/dashboard/memory/record/m_nope", "/dashboard/people/u_nope", "/dashboard/turns/999"):
        status, _ = await dash.get(path)
        assert status == 404, path
    status, page = await dash.get("/dashboard/turns/abc")
    assert status == 400 and "not a number" in page


async def test_a_notes_directive_turn_is_explained_as_answered_by_code(dash: Dash) -> None:
    result = await dash.gw.turns.handle(
        TurnRequest(
            key=SessionKey("web", "admin/dashboard"),
            principal=OPERATOR,
            text="@notes: The deploy window is Tuesday afternoon",
            message_id="m-notes",
            said_at=T0,
        )
    )
    assert result.turn_record_id is not None
    turn = await queries.get_turn(dash.gw.engine, result.turn_record_id)
    assert turn is not None
    assert (turn.memory, turn.sections, turn.model_calls["steps"]) == ([], {}, 0)
    status, page = await dash.get(f"/dashboard/turns/{turn.id}")
    assert status == 200 and "No memory records went into this prompt" in page

"""``goclaw identity``, ``goclaw signals``, ``goclaw obligations`` / ``obligation``: real processes, real SQLite.

The research run is a real turn of the builtin offline model (a ``FINDING``
line in the run's message, see ``gateway.llm.scripted``), driven the way
gateway.automation drives SOP runs: a system principal and a ``RunContext``.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.app import Gateway
from gateway.config import load_config
from gateway.sessions import SessionKey
from gateway.turn import RunContext, TurnRequest
from memory.identity import IdentityStore
from pairing.principal import Principal, Role
from tests.gateway.test_cli import goclaw

FINDING = (
    'FINDING severity=advisory affects=daily-report subject="orders export" claim="The export drops refunds" '
    'observation="vendor/export.py skips negative totals; breaks INV-002" evidence="vendor/export.py:88"'
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite+aiosqlite:///data/goclaw.db\n")
    return tmp_path


def _user(workdir: Path, name: str, role: str) -> str:
    added = goclaw("users", "add", "--name", name, "--role", role, "--json", cwd=workdir)
    assert added.returncode == 0, added.stderr
    return str(json.loads(added.stdout)["id"])


def _research_run(workdir: Path, text: str) -> str:
    """One turn of a research SOP run on the builtin model; its reply."""

    async def go() -> str:
        cfg = load_config(workdir / "config.yaml")
        cfg = cfg.model_copy(update={"database": cfg.database.model_copy(update={"url": _url(workdir)})})
        gw = Gateway(cfg)
        await gw.start(channels=False, worker=False)
        try:
            result = await gw.turns.handle(
                TurnRequest(
                    key=SessionKey("system", "sop-system/vendor-watch"),
                    principal=Principal.system("sop-system"),
                    text=text,
                    message_id="sop-1",
                    said_at=datetime.now(UTC),
                    display_name="sop-system",
                    run=RunContext("vendor-watch", "run-1", research=True),
                )
            )
            return result.reply or ""
        finally:
            await gw.stop()

    return asyncio.run(go())


def _url(workdir: Path) -> str:
    return f"sqlite+aiosqlite:///{workdir / 'data' / 'goclaw.db'}"


def test_a_finding_is_routed_holds_and_is_resolved_only_by_a_person_the_policy_allows(workdir: Path) -> None:
    alice, bob = _user(workdir, "Alice", "admin"), _user(workdir, "Bob", "user")
    reply = _research_run(workdir, "Check the vendored helpers.\n" + FINDING)
    assert "[offline model]" in reply and "Signal sg_" in reply

    pending = goclaw("signals", "list", cwd=workdir)
    assert pending.returncode == 0 and "pending (not routed yet)" in pending.stdout
    routed = goclaw("signals", "route", "--json", cwd=workdir)
    assert routed.returncode == 0, routed.stderr
    (outcome,) = json.loads(routed.stdout)
    # Advisory as reported; the observation names an invariant, so the shipped floor makes it blocking.
    assert (outcome["outcome"], outcome["severity"]) == ("raised", "blocking")
    assert outcome["obligations"] == [{"sop": "daily-report", "blocks": True}]
    assert "no signals waiting" in goclaw("signals", "route", cwd=workdir).stdout

    (ob,) = json.loads(goclaw("obligations", "--json", cwd=workdir).stdout)
    assert (ob["sop"], ob["holds"], ob["owed_to"], ob["status"]) == ("daily-report", True, ["admin"], "open")
    table = goclaw("obligations", cwd=workdir).stdout
    assert ob["id"] in table and "yes" in table

    refused = goclaw(
        "obligation", "resolve", ob["id"], "--by", bob, "--disposition", "no-action", "--rationale", "x", cwd=workdir
    )
    assert refused.returncode == 2 and "needs role admin" in refused.stderr and "Traceback" not in refused.stderr
    unknown = goclaw(
        "obligation", "resolve", ob["id"], "--by", "u_nobody", "--disposition", "rework", "--rationale", "x",
        cwd=workdir,
    )  # fmt: skip
    assert unknown.returncode == 2 and "no user u_nobody" in unknown.stderr
    bad = goclaw(
        "obligation", "resolve", ob["id"], "--by", alice, "--disposition", "ignore", "--rationale", "x", cwd=workdir
    )
    assert bad.returncode == 2 and "disposition must be one of no-action" in bad.stderr

    done = goclaw(  # a unique prefix of 6+ characters is enough, as for every id the CLI takes
        "obligation", "resolve", ob["id"][:9], "--by", alice, "--disposition", "accepted-risk",
        "--rationale", "refunds are reconciled by hand this month", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no open obligations" in goclaw("obligations", cwd=workdir).stdout
    (after,) = json.loads(goclaw("obligations", "--all", "--json", cwd=workdir).stdout)
    assert after["disposition"]["by"] == alice and after["holds"] is False
    shown = goclaw("obligation", "show", ob["id"][:9], cwd=workdir)
    assert shown.returncode == 0
    for words in ("The export drops refunds", "vendor/export.py:88", "routed: raised", "resolved accepted-risk"):
        assert words in shown.stdout
    missing = goclaw("obligation", "show", "ob_missing", cwd=workdir)
    assert missing.returncode == 2 and "no obligation ob_missing" in missing.stderr


def test_identity_proposals_are_decided_only_by_a_named_admin(workdir: Path) -> None:
    alice, bob = _user(workdir, "Alice", "admin"), _user(workdir, "Bob", "user")

    async def propose() -> str:
        from gateway.db import make_engine

        engine = make_engine(_url(workdir))
        try:
            bob_p = Principal.human(bob, Role.USER, "Bob")
            p = await IdentityStore(engine).propose(
                bob_p, scope="agent_config", subject="boundaries", content="Never email customers.", rationale="legal"
            )
            return p.id
        finally:
            await engine.dispose()

    pid = asyncio.run(propose())
    (listed,) = json.loads(goclaw("identity", "proposals", "--json", cwd=workdir).stdout)
    assert (listed["id"], listed["status"], listed["proposer"]) == (pid, "open", bob)

    refused = goclaw("identity", "accept", pid, "--by", bob, "--rationale", "mine", cwd=workdir)
    assert refused.returncode == 2 and "only a paired admin can decide" in refused.stderr
    no_why = goclaw("identity", "accept", pid, "--by", alice, "--rationale", " ", cwd=workdir)
    assert no_why.returncode == 2 and "needs a rationale" in no_why.stderr
    ok = goclaw("identity", "accept", pid[:9], "--by", alice, "--rationale", "agreed with legal", cwd=workdir)
    assert ok.returncode == 0, ok.stderr
    twice = goclaw("identity", "reject", pid, "--by", alice, "--rationale", "oops", cwd=workdir)
    assert twice.returncode == 2 and "already accepted" in twice.stderr

    assert json.loads(goclaw("identity", "proposals", "--json", cwd=workdir).stdout) == []
    (decided,) = json.loads(goclaw("identity", "proposals", "--all", "--json", cwd=workdir).stdout)
    assert decided["decision"]["by"] == alice and decided["decision"]["rationale"] == "agreed with legal"
    current = goclaw("identity", "list", cwd=workdir).stdout
    assert "Never email customers." in current and f"accepted by {alice}" in current
    (record,) = json.loads(goclaw("memory", "list", "--scope", "agent_config", "--json", cwd=workdir).stdout)
    assert (record["source"], record["author_id"], record["evidence"]) == ("decision", alice, [pid])


def test_bad_intelligence_config_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "intelligence:\n  floors:\n    - pattern: '(unclosed'\n  blocks_at: info\n  resolvers:\n    urgent: [admin]\n"
    )
    checked = goclaw("config", "check", cwd=tmp_path)
    assert checked.returncode == 2
    assert "intelligence.floors.0.pattern" in checked.stderr and "not a valid regular expression" in checked.stderr
    assert "intelligence.resolvers.urgent" in checked.stderr


def test_identity_proposals_says_when_it_shows_only_the_oldest(workdir: Path) -> None:
    from tests.memory.conftest import bulk_proposals

    async def fill() -> None:
        from gateway.db import make_engine, upgrade

        engine = make_engine(_url(workdir))
        try:
            await upgrade(engine)
            await bulk_proposals(engine, 501, before=datetime.now(UTC), decided=False)
        finally:
            await engine.dispose()

    asyncio.run(fill())
    shown = goclaw("identity", "proposals", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "(the oldest 500 of 501 open proposals; decide these to see the rest)" in text
    assert len(json.loads(goclaw("identity", "proposals", "--json", cwd=workdir).stdout)) == 500

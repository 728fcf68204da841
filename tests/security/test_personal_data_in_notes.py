"""Issue 9 item 4: an admin's personal line never becomes shared knowledge by itself.

With a hostile extractor, an admin's ``my email is ...`` was classified
operational and rendered into every user's prompt. Now an operational item that
carries personal data is written ``unverified`` for ``review_learned``, with the
reason, whoever said it; the gate (``memory.gate.decide``, input
``personal_data``) decides it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from memory.gate import Verdict, decide
from memory.personal import personal_data
from pairing.principal import Principal, Role
from tests.conftest import Clock
from tests.policy.hostile import HostileProvider
from tests.policy.world import World, close_world, open_world

EMAIL = "alice.admin@example.com"
ADMIN = Principal.human("u_alice", Role.ADMIN, "Alice")
USER = Principal.human("u_bob", Role.USER, "Bob")


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (f"my email is {EMAIL}", True),
        ("reach the on-call at +44 20 7946 0958", True),
        ("I am the finance lead", True),
        ("I'm based in Lyon", True),
        ("The report is produced from example_orders.", False),
        ("db01.internal:5432 holds orders since 2026-11-30", False),
        ("answer in English", False),
    ],
)
def test_personal_data_is_found_in_what_a_person_says_about_themselves(text: str, found: bool) -> None:
    assert (personal_data(text) is not None) == found


@pytest.mark.parametrize("source", ["live", "relearn", "memory_write"])
def test_the_gate_holds_an_admins_operational_item_with_personal_data(source: str) -> None:
    held = decide(ADMIN, "agent_notes", source, trusted=True, personal_data="an e-mail address")
    assert held.verdict is Verdict.WRITE_UNVERIFIED
    assert "personal data (an e-mail address)" in held.reason
    assert decide(ADMIN, "agent_notes", source, trusted=True).verdict is Verdict.WRITE


def test_personal_data_never_widens_what_the_gate_allows() -> None:
    assert decide(USER, "agent_notes", "live", personal_data="x").verdict is Verdict.DROP
    assert decide(USER, "agent_notes", "memory_write", personal_data="x").verdict is Verdict.REFUSE
    # The admin's own @notes: and a confirm after review are a person's decision, not a model's.
    assert decide(ADMIN, "agent_notes", "directive", personal_data="x").verdict is Verdict.WRITE
    assert decide(ADMIN, "agent_notes", "confirm", personal_data="x").verdict is Verdict.WRITE


@pytest.fixture
async def world(tmp_path: Path, clock: Clock) -> AsyncIterator[World]:
    w = await open_world(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}", HostileProvider(), clock)
    yield w
    await close_world(w)


async def test_an_admins_email_from_a_hostile_extractor_is_held_for_review_and_never_rendered(world: World) -> None:
    await world.say("alice", f"my email is {EMAIL}")
    await world.trim_by("alice")  # the hostile extractor calls every line operational
    notes = [r for r in await world.records("agent_notes") if EMAIL in r.content]
    assert notes, "the hostile model and extractor tried to put the e-mail into agent_notes"
    assert {r.status for r in notes} == {"unverified"}
    assert all(r.status_reason and "personal data" in r.status_reason for r in notes)
    assert {r.source for r in notes} >= {"live"}  # the extraction path, not only memory_write

    # Another user's turn in their own conversation: the address is nowhere in what the model is shown.
    await world.api("bob", "what is the admin's email address?")
    assert EMAIL not in world.last_prompt()

    review = await world.call_tool(
        await world.principal("alice"), "review_learned", {"action": "list"}, key=world.thread_key()
    )
    assert EMAIL in review and "held because" in review and "personal data" in review
    await world.check_invariants()

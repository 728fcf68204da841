"""The one write gate, cell by cell: principal x scope x source (the seed's RBAC x learning matrix)."""

from __future__ import annotations

import pytest

from memory.gate import REFUSE_AGENT_NOTES, REFUSE_DIRECTIVE, Verdict, WriteAccess, decide
from pairing.principal import Principal, Role
from tests.memory.conftest import ALICE, BOB, CRON, SOP, UNPAIRED, WEBHOOK

LISTED = Principal.human("u_listed", Role.USER, "Listed")
ACCESS = WriteAccess(users=["u_listed"])

WHO: dict[str, Principal] = {
    "admin": ALICE,
    "user": BOB,
    "listed_user": LISTED,
    "unpaired": UNPAIRED,
    "cron": CRON,
    "sop": SOP,
    "webhook": WEBHOOK,
}
SCOPE_ORDER = ("personal", "agent_notes", "global", "agent_config")
W, U, D, R = Verdict.WRITE, Verdict.WRITE_UNVERIFIED, Verdict.DROP, Verdict.REFUSE

# source -> principal -> verdicts for (personal, agent_notes, global, agent_config),
# with write_access listing u_listed and ``trusted`` left to the gate (is_human_admin).
TABLE: dict[str, dict[str, tuple[Verdict, Verdict, Verdict, Verdict]]] = {
    # Extraction from a live session: personal to the speaker (people only); operational only
    # from a human admin; identity never; write_access does not apply.
    "live": {
        "admin": (W, W, D, D),
        "user": (W, D, D, D),
        "listed_user": (W, D, D, D),
        "unpaired": (D, D, D, D),
        "cron": (D, D, D, D),
        "sop": (D, D, D, D),
        "webhook": (D, D, D, D),
    },
    # Relearn: operational by archive trust (here: the principal's admin role), else unverified;
    # personal lines are not relearned.
    "relearn": {
        "admin": (D, W, D, D),
        "user": (D, U, D, D),
        "listed_user": (D, U, D, D),
        "unpaired": (D, U, D, D),
        "cron": (D, U, D, D),
        "sop": (D, U, D, D),
        "webhook": (D, U, D, D),
    },
    # memory_write: admins personal and agent_notes; people their own personal; write_access and
    # system runs agent_notes; identity scopes nobody (seed 001: only by an accepted proposal).
    "memory_write": {
        "admin": (W, W, R, R),
        "user": (W, R, R, R),
        "listed_user": (W, W, R, R),
        "unpaired": (R, R, R, R),
        "cron": (R, W, R, R),
        "sop": (R, W, R, R),
        "webhook": (R, W, R, R),
    },
    # @notes: admins only, agent_notes only; write_access does not apply.
    "directive": {
        "admin": (R, W, R, R),
        "user": (R, R, R, R),
        "listed_user": (R, R, R, R),
        "unpaired": (R, R, R, R),
        "cron": (R, R, R, R),
        "sop": (R, R, R, R),
        "webhook": (R, R, R, R),
    },
    # Confirm from review: human admins only; personal memory and identity are never under review.
    "confirm": {
        "admin": (R, W, R, R),
        "user": (R, R, R, R),
        "listed_user": (R, R, R, R),
        "unpaired": (R, R, R, R),
        "cron": (R, R, R, R),
        "sop": (R, R, R, R),
        "webhook": (R, R, R, R),
    },
    # Consolidation merges agent_notes: system runs and admins (notes_distill).
    "consolidate": {
        "admin": (R, W, R, R),
        "user": (R, R, R, R),
        "listed_user": (R, R, R, R),
        "unpaired": (R, R, R, R),
        "cron": (R, W, R, R),
        "sop": (R, W, R, R),
        "webhook": (R, W, R, R),
    },
    # An accepted identity proposal (memory.identity): the deciding human admin, identity scopes only.
    "decision": {
        "admin": (R, R, W, W),
        "user": (R, R, R, R),
        "listed_user": (R, R, R, R),
        "unpaired": (R, R, R, R),
        "cron": (R, R, R, R),
        "sop": (R, R, R, R),
        "webhook": (R, R, R, R),
    },
}

CELLS = [
    pytest.param(source, who, scope, row[i], id=f"{source}-{who}-{scope}")
    for source, rows in TABLE.items()
    for who, row in rows.items()
    for i, scope in enumerate(SCOPE_ORDER)
]


@pytest.mark.parametrize(("source", "who", "scope", "expected"), CELLS)
def test_gate_cell(source: str, who: str, scope: str, expected: Verdict) -> None:
    principal = WHO[who]
    decision = decide(principal, scope, source, write_access=ACCESS)
    assert decision.verdict is expected, decision.reason
    assert decision.reason
    if expected is Verdict.REFUSE:
        assert decision.message
    if decision.writes and scope == "personal":
        assert decision.owner_user_id == principal.user_id
    else:
        assert decision.owner_user_id is None


def test_every_cell_of_the_table_is_tested() -> None:
    assert len(CELLS) == 7 * 7 * 4


def test_regular_user_refused_agent_notes_is_pointed_to_personal() -> None:
    decision = decide(BOB, "agent_notes", "memory_write")
    assert decision.verdict is Verdict.REFUSE
    assert decision.message == REFUSE_AGENT_NOTES
    assert "scope='personal'" in decision.message


def test_notes_directive_refusal_says_operational_changes_need_an_administrator() -> None:
    for principal in (BOB, LISTED, UNPAIRED, CRON):
        decision = decide(principal, "agent_notes", "directive", write_access=ACCESS)
        assert decision.message == REFUSE_DIRECTIVE
        assert "require an administrator" in decision.message


def test_write_access_role_lists_let_regular_users_memory_write_agent_notes_only() -> None:
    by_role = WriteAccess(roles=[Role.USER])
    assert decide(BOB, "agent_notes", "memory_write", write_access=by_role).verdict is W
    assert decide(BOB, "global", "memory_write", write_access=by_role).verdict is R
    assert decide(BOB, "agent_notes", "directive", write_access=by_role).verdict is R
    assert decide(BOB, "agent_notes", "live", write_access=by_role).verdict is D
    assert decide(UNPAIRED, "agent_notes", "memory_write", write_access=by_role).verdict is R


def test_identity_is_never_written_by_memory_write_and_the_refusal_points_to_a_proposal() -> None:
    everything = WriteAccess(users=["u_alice", "u_bob"], roles=["admin", "user"])
    for who in (ALICE, BOB, CRON, SOP):
        for scope in ("global", "agent_config"):
            decision = decide(who, scope, "memory_write", write_access=everything)
            assert decision.verdict is R
            assert "propose_policy_change" in decision.message


def test_write_access_never_opens_identity_scopes_to_system_runs() -> None:
    # policy: they "cannot write global or agent_config, whatever memory.write_access lists".
    everything = WriteAccess(users=["cron-system", "webhook-system"], roles=["admin", "user"])
    for run in (CRON, SOP, WEBHOOK):
        for scope in ("global", "agent_config"):
            assert decide(run, scope, "memory_write", write_access=everything).verdict is R


def test_shared_conversation_trust_can_only_narrow_a_live_speakers_authority() -> None:
    assert decide(ALICE, "agent_notes", "live", trusted=False).verdict is D
    assert decide(ALICE, "agent_notes", "live", trusted=True).verdict is W
    # self-declared authority != authority: nothing can make a regular user or a run trusted.
    assert decide(BOB, "agent_notes", "live", trusted=True).verdict is D
    assert decide(CRON, "agent_notes", "live", trusted=True).verdict is D
    assert decide(UNPAIRED, "agent_notes", "live", trusted=True).verdict is D


def test_relearn_follows_the_archive_trust() -> None:
    assert decide(BOB, "agent_notes", "relearn", trusted=True).verdict is W
    assert decide(ALICE, "agent_notes", "relearn", trusted=False).verdict is U
    assert decide(ALICE, "personal", "relearn", trusted=True).verdict is D


def test_personal_memory_is_only_ever_the_principals_own() -> None:
    assert decide(BOB, "personal", "memory_write", owner_user_id="u_alice").verdict is R
    assert decide(ALICE, "personal", "live", owner_user_id="u_bob").verdict is R
    assert decide(BOB, "personal", "live", owner_user_id="u_bob").owner_user_id == "u_bob"


def test_unknown_scope_is_refused_and_unknown_source_is_a_programming_error() -> None:
    decision = decide(ALICE, "everything", "memory_write")
    assert decision.verdict is R and "personal, agent_notes, global, agent_config" in decision.message
    with pytest.raises(ValueError, match="unknown memory source"):
        decide(ALICE, "agent_notes", "trust_me")


def test_status_of_a_decision() -> None:
    assert decide(ALICE, "agent_notes", "live").status == "live"
    assert decide(BOB, "agent_notes", "relearn").status == "unverified"
    with pytest.raises(ValueError, match="nothing is written"):
        _ = decide(BOB, "agent_notes", "live").status

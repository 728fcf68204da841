"""The one write gate: may this principal write this scope from this source?

policy: "Authorization — who may write it? — is enforced by code (isHumanAdmin,
derived from the pairing role). Hard, non-bypassable." Every path that writes
memory (extraction, ``memory_write``, ``@notes:``, relearn, confirm from
review, consolidation, an accepted identity proposal) asks :func:`decide` and
gets back one of four verdicts.
The table below is the seed's RBAC x learning matrix plus its "Autonomous
runs" rules; ``tests/memory/test_gate.py`` has one test per cell.

The function is pure: it reads the principal (whose role came from the
pairing store), the scope, the source, the operator's ``memory.write_access``,
for extraction whether the speaker is trusted per the shared-conversation
rules, and for agent_notes whether the item carries personal data
(``memory.personal.personal_data``, computed from the content by the writer).
Nothing a message says can widen what it allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from msgspec import Struct

from memory.models import SCOPES, SOURCES
from pairing.principal import Principal, PrincipalKind, Role, is_human_admin

OPERATIONAL_SCOPE = "agent_notes"
PERSONAL_SCOPE = "personal"
IDENTITY_SCOPES: tuple[str, ...] = ("global", "agent_config")


class Verdict(StrEnum):
    """What the gate allows."""

    WRITE = "write"
    WRITE_UNVERIFIED = "write_unverified"
    DROP = "drop"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class WriteAccess:
    """Who besides human admins may ``memory_write`` to agent_notes (``memory.write_access``).

    It widens only the explicit ``memory_write`` to agent_notes: never
    ``@notes:``, never extraction, never ``global``/``agent_config``.
    """

    users: frozenset[str] = field(default_factory=frozenset)
    roles: frozenset[str] = field(default_factory=frozenset)

    def __init__(self, users: Iterable[str] = (), roles: Iterable[str | Role] = ()) -> None:
        object.__setattr__(self, "users", frozenset(users))
        object.__setattr__(self, "roles", frozenset(Role.parse(str(r)).value for r in roles))

    def grants(self, principal: Principal) -> bool:
        """True when the operator listed this paired person or their role."""
        if principal.kind is not PrincipalKind.HUMAN or principal.user_id is None:
            return False
        return principal.user_id in self.users or (principal.role is not None and principal.role.value in self.roles)


NO_EXTRA_WRITERS = WriteAccess()


class GateDecision(Struct, frozen=True):
    """The gate's answer.

    ``message`` is for the person (a tool result, a chat reply); ``reason`` is
    for logs and outcomes. ``owner_user_id`` is the personal scope's owner
    (always the principal's own id) and None for every other scope.
    """

    verdict: Verdict
    principal: Principal
    scope: str
    source: str
    reason: str
    message: str = ""
    owner_user_id: str | None = None

    @property
    def writes(self) -> bool:
        """True when something is to be written (live or unverified)."""
        return self.verdict in (Verdict.WRITE, Verdict.WRITE_UNVERIFIED)

    @property
    def status(self) -> str:
        """The status a record written under this decision gets."""
        if self.verdict is Verdict.WRITE:
            return "live"
        if self.verdict is Verdict.WRITE_UNVERIFIED:
            return "unverified"
        raise ValueError(f"nothing is written when the gate says {self.verdict.value}: {self.reason}")


class _Ask(Struct, frozen=True):
    principal: Principal
    scope: str
    source: str

    def answer(self, v: Verdict, reason: str, message: str = "") -> GateDecision:
        # The personal owner is always the principal's own id: nobody writes another's memory.
        writes = v in (Verdict.WRITE, Verdict.WRITE_UNVERIFIED)
        owner = self.principal.user_id if self.scope == PERSONAL_SCOPE and writes else None
        return GateDecision(v, self.principal, self.scope, self.source, reason, message or reason, owner)


_Answer = Callable[..., GateDecision]

REFUSE_AGENT_NOTES = (
    "Only an administrator can write to agent_notes (the organisation's operational memory). "
    "You can keep this in your own memory with scope='personal'."
)
REFUSE_IDENTITY = (
    "The agent's identity ({scope}) is not written directly, by anyone: use propose_policy_change to propose "
    "the change, and an administrator accepts or rejects it (goclaw identity proposals). Nothing was saved."
)
REFUSE_DECISION = "Only an administrator's decision on a proposal changes the agent's identity ({scope})."
REFUSE_DIRECTIVE = "Operational changes require an administrator; nothing was saved."
REFUSE_NO_PERSONAL = "There is no personal memory for {who}: only a paired person has one."
REFUSE_CONFIRM = "Confirming learned facts requires an administrator."


def _who(principal: Principal) -> str:
    if principal.kind is PrincipalKind.SYSTEM:
        return f"an autonomous run ({principal.system_name})"
    if principal.kind is PrincipalKind.UNPAIRED:
        return "an unpaired sender"
    return f"user {principal.user_id}"


def decide(
    principal: Principal,
    scope: str,
    source: str,
    *,
    write_access: WriteAccess = NO_EXTRA_WRITERS,
    owner_user_id: str | None = None,
    trusted: bool | None = None,
    personal_data: str | None = None,
) -> GateDecision:
    """Decide whether ``principal`` may write ``scope`` from ``source``.

    Args:
        principal: Who the write is for: the speaker of the line (extraction),
            the turn's principal (tools, directives), or the run (consolidation).
        scope: ``personal``, ``agent_notes``, ``global`` or ``agent_config``.
        source: ``live``, ``relearn``, ``memory_write``, ``directive``,
            ``confirm``, ``consolidate`` or ``decision`` (an admin accepting an
            identity proposal, ``memory.identity``).
        write_access: The operator's ``memory.write_access`` (``memory_write``
            to agent_notes only).
        owner_user_id: For personal writes, whose memory; it must be the
            principal's own.
        trusted: For extraction, the speaker's authority per the shared
            conversation rules (``lines_by_speaker``); it can only narrow a live
            speaker's authority, never widen it. For relearn, the archive's trust.
        personal_data: For agent_notes, what personal data the item carries
            (``memory.personal.personal_data``), or None. An operational item
            with personal data is never learned live: what would be written
            live is written ``unverified`` for ``review_learned`` instead,
            except an admin's own ``@notes:`` (typed by them) and a confirm
            (their decision after review).

    Returns:
        The verdict, with a reason (always) and a message for a person (refusals).

    Raises:
        ValueError: ``source`` is not one of the known sources (a programming error).
    """
    if source not in SOURCES:
        raise ValueError(f"unknown memory source {source!r}: use one of {', '.join(SOURCES)}")

    verdict = _Ask(principal, scope, source).answer

    if scope not in SCOPES:
        return verdict(Verdict.REFUSE, f"unknown scope {scope!r}", f"Unknown scope {scope!r}: use {', '.join(SCOPES)}.")

    if scope == PERSONAL_SCOPE and owner_user_id is not None and owner_user_id != principal.user_id:
        # policy: "Personal items go to the person who said them."
        return verdict(
            Verdict.REFUSE,
            "personal memory is written only to its own person",
            "Personal memory can only be written to your own memory.",
        )

    if source in ("live", "relearn"):
        return _hold_personal(_extraction(principal, scope, source, trusted, verdict), personal_data, verdict)
    if source == "memory_write":
        return _hold_personal(_memory_write(principal, scope, write_access, verdict), personal_data, verdict)
    if source == "decision":
        # Seed 001: identity is written "only by the S5 decision path, when a named person accepts a
        # proposal". memory.identity calls this with the deciding admin, for an open proposal only.
        if scope in IDENTITY_SCOPES and is_human_admin(principal):
            return verdict(Verdict.WRITE, f"{scope} from a proposal accepted by a human admin")
        return verdict(Verdict.REFUSE, f"decision on {scope} by {_who(principal)}", REFUSE_DECISION.format(scope=scope))
    if source == "directive":
        # policy: "`@notes:` is for admins only" -- memory.write_access does not apply.
        if scope == OPERATIONAL_SCOPE and is_human_admin(principal):
            return verdict(Verdict.WRITE, "directive from a human admin")
        return verdict(Verdict.REFUSE, f"@notes: from {_who(principal)} (admins only)", REFUSE_DIRECTIVE)
    if source == "confirm":
        # review_learned is an admin tool; personal memory is never quarantined, so never reviewed.
        if scope == PERSONAL_SCOPE:
            return verdict(Verdict.REFUSE, "personal memory is not reviewed", "Personal memory is not reviewed.")
        if scope in IDENTITY_SCOPES:
            # Identity is never quarantined, so never confirmed: it changes only by decision.
            return verdict(Verdict.REFUSE, f"confirm of {scope}", REFUSE_IDENTITY.format(scope=scope))
        if is_human_admin(principal):
            return verdict(Verdict.WRITE, "confirmed by a human admin")
        return verdict(Verdict.REFUSE, f"confirm by {_who(principal)}", REFUSE_CONFIRM)
    # consolidate: the nightly job / automatic distillation (system) or notes_distill (an admin)
    # merge operational notes that say the same thing.
    if scope != OPERATIONAL_SCOPE:
        return verdict(
            Verdict.REFUSE,
            f"consolidation writes agent_notes only, not {scope}",
            "Consolidation only merges operational notes (agent_notes).",
        )
    if principal.kind is PrincipalKind.SYSTEM or is_human_admin(principal):
        return verdict(Verdict.WRITE, f"consolidation by {_who(principal)}")
    return verdict(
        Verdict.REFUSE, f"consolidation by {_who(principal)}", "Merging operational notes requires an administrator."
    )


def _hold_personal(decision: GateDecision, personal_data: str | None, verdict: _Answer) -> GateDecision:
    """An agent_notes write that would be live, with personal data in it: unverified, with why."""
    if personal_data is None or decision.scope != OPERATIONAL_SCOPE or decision.verdict is not Verdict.WRITE:
        return decision
    # Issue 9 (4): the model classifies, so an admin's "my email is ..." can come back
    # operational; shared knowledge must not carry one person's data without a person's review.
    return verdict(
        Verdict.WRITE_UNVERIFIED,
        f"an operational item carrying personal data ({personal_data}) is not learned live: "
        "held as unverified for review_learned",
    )


def _extraction(principal: Principal, scope: str, source: str, trusted: bool | None, verdict: _Answer) -> GateDecision:
    if scope in IDENTITY_SCOPES:
        # Identity changes only by an admin's decision, never by what was learned from talk.
        return verdict(Verdict.DROP, f"extraction never writes {scope}")
    if scope == PERSONAL_SCOPE:
        if source == "relearn":
            # policy: relearned "personal lines not learned".
            return verdict(Verdict.DROP, "personal lines are not relearned from an archive")
        if principal.kind is PrincipalKind.HUMAN and principal.user_id:
            return verdict(Verdict.WRITE, "a personal item goes to its speaker's own memory")
        # policy: unpaired senders and autonomous runs have "no personal memory to go to".
        return verdict(Verdict.DROP, f"{_who(principal)} has no personal memory")

    # Operational (agent_notes).
    if source == "relearn":
        # policy: relearned from an archive: admin trust -> learned, otherwise quarantined as unverified.
        archive_admin = trusted if trusted is not None else is_human_admin(principal)
        if archive_admin:
            return verdict(Verdict.WRITE, "relearned from an archive with admin trust")
        return verdict(Verdict.WRITE_UNVERIFIED, "relearned without admin trust: quarantined for review_learned")
    if principal.kind is PrincipalKind.SYSTEM:
        # policy: "Fact extraction never learns operational knowledge from them".
        return verdict(Verdict.DROP, f"{_who(principal)} executes procedures, it does not author them")
    # policy: "self-declared authority != authority": only the pairing role counts, and the
    # shared-conversation trust (``trusted``) can only take it away.
    if is_human_admin(principal) and trusted is not False:
        return verdict(Verdict.WRITE, "operational item from a human admin")
    return verdict(Verdict.DROP, f"operational item from {_who(principal)} (not an admin): not learned")


def _memory_write(principal: Principal, scope: str, write_access: WriteAccess, verdict: _Answer) -> GateDecision:
    if scope == PERSONAL_SCOPE:
        if principal.kind is PrincipalKind.HUMAN and principal.user_id:
            return verdict(Verdict.WRITE, "a person writes their own memory")
        return verdict(
            Verdict.REFUSE, f"{_who(principal)} has no personal memory", REFUSE_NO_PERSONAL.format(who=_who(principal))
        )
    if scope in IDENTITY_SCOPES:
        # Seed 001: identity changes "by an accepted proposal", never by a write -- not even an admin's
        # (a prompt-injected model in an admin's turn would otherwise rewrite who the agent is), and
        # autonomous runs "cannot write global or agent_config, whatever memory.write_access lists".
        return verdict(
            Verdict.REFUSE,
            f"{scope} by {_who(principal)}: identity changes only by decision",
            REFUSE_IDENTITY.format(scope=scope),
        )
    # agent_notes
    if is_human_admin(principal):
        return verdict(Verdict.WRITE, "agent_notes written by a human admin")
    if principal.kind is PrincipalKind.SYSTEM:
        # policy: "An explicit memory_write to agent_notes from such a run is allowed (a
        # webhook-triggered run included): the run carries out a procedure an admin wrote".
        return verdict(Verdict.WRITE, f"agent_notes written by {_who(principal)} following a procedure")
    if write_access.grants(principal):
        return verdict(Verdict.WRITE, "agent_notes written by a person listed in memory.write_access")
    return verdict(Verdict.REFUSE, f"agent_notes by {_who(principal)} (not an admin)", REFUSE_AGENT_NOTES)

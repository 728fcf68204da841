"""``goclaw identity``: proposals, accept, reject, and the current identity with how each item came to be.

Seed 001: identity changes "only by the S5 decision path, when a named person
accepts a proposal". ``--by`` names that person: a paired user whose stored
role is admin (checked in code against the pairing store), or the command is
refused. The helpers of ``gateway.cli`` are imported inside the commands (no
import cycle when ``gateway.cli`` mounts this module).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import ids
from gateway.cli.common import ConfigOpt, JsonOpt
from gateway.cli.common import guarded as common_guarded
from memory.identity import LIST_LIMIT, IdentityStore, ProposalView, accept_proposal, authorize_decide, reject_proposal
from memory.store import MemoryStore, MemoryStoreError
from pairing.principal import Principal
from pairing.store import PairingError, PairingStore

identity_app = typer.Typer(
    help="The agent's identity: proposals, and an admin's accept or reject (--by).", no_args_is_help=True
)

T = TypeVar("T")
_CONFIG = ConfigOpt
_JSON = JsonOpt
_BY = typer.Option(..., "--by", help="The deciding admin's unified user id (see 'goclaw users list').")
_RATIONALE = typer.Option(..., "--rationale", help="Why (kept with the decision).")


def guarded(fn: Callable[[], None]) -> None:
    """Run a command body: one-line errors (exit 2), never a traceback."""
    common_guarded(fn, MemoryStoreError, PairingError)


def with_engine(config: str | None, action: Callable[[Any, AsyncEngine], Awaitable[T]]) -> T:
    """Open the database of the config (migrating it), run ``action(cfg, engine)``, close."""
    from gateway.cli import load
    from gateway.cli import with_engine as _with_engine

    cfg = load(config)
    return _with_engine(cfg, lambda engine: action(cfg, engine))


async def named_person(engine: AsyncEngine, user_id: str) -> Principal:
    """The paired person ``--by`` names, with the role the pairing store holds (never what the command says).

    Raises:
        PairingError: nobody is paired under that id.
    """
    return await PairingStore(engine).principal_for_user(user_id)


async def _decider(engine: AsyncEngine, user_id: str) -> Principal:
    person = await named_person(engine, user_id)
    if authorize_decide(person) is not None:
        raise PairingError(
            f"--by {user_id} has role {person.stored_role}: only a paired admin can decide an identity proposal"
        )
    return person


def _print_proposals(proposals: list[ProposalView]) -> None:
    from rich.table import Table

    from gateway.cli import out

    if not proposals:
        out.print("no identity proposals")
        return
    table = Table("id", "status", "scope", "subject", "text", "proposed by", "when (UTC)", "decision")
    for p in proposals:
        who = p.proposer + (f" ({p.proposer_role})" if p.proposer_role else "")
        if p.run_id:
            who += f" run {p.run_id}"
        decision = f"{p.decision.decision} by {p.decision.by_user_id}: {p.decision.rationale}" if p.decision else ""
        table.add_row(p.id, p.status, p.scope, p.subject, p.content, who, f"{p.created_at:%Y-%m-%d %H:%M}", decision)
    out.print(table)


@identity_app.command("proposals")
def identity_proposals(
    show_all: bool = typer.Option(False, "--all", help="Include accepted and rejected proposals."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Open identity proposals (all of them with --all), oldest first."""

    def body() -> None:
        from gateway.cli import print_json

        async def action(_cfg: Any, engine: AsyncEngine) -> tuple[list[ProposalView], int]:
            store = IdentityStore(engine)
            found = await store.proposals(include_decided=show_all, limit=LIST_LIMIT)
            # A listing stops at its limit: how many there are in all, to say when only the oldest are shown.
            total = await store.count(include_decided=show_all) if len(found) >= LIST_LIMIT else len(found)
            return found, total

        found, total = with_engine(config, action)
        if as_json:
            print_json([p.as_json() for p in found])
        else:
            _print_proposals(found)
            if total > len(found):
                from gateway.cli import out

                rest = "" if show_all else "; decide these to see the rest"
                which = "proposals" if show_all else "open proposals"
                out.print(f"(the oldest {len(found)} of {total} {which}{rest})")

    guarded(body)


@identity_app.command("accept")
def identity_accept(
    proposal_id: str, by: str = _BY, rationale: str = _RATIONALE, as_json: bool = _JSON, config: str | None = _CONFIG
) -> None:
    """Accept an open proposal: it becomes the identity record, in every prompt; the decision is kept."""

    def body() -> None:
        from gateway.cli import out, print_json
        from gateway.cli.memory import _writer

        async def action(cfg: Any, engine: AsyncEngine) -> Any:
            admin = await _decider(engine, await ids.user_id(engine, by))
            writer = _writer(cfg, MemoryStore(engine))
            pid = await ids.proposal_id(engine, proposal_id)
            return await accept_proposal(IdentityStore(engine), writer, pid, by=admin, rationale=rationale)

        done = with_engine(config, action)
        if as_json:
            print_json({"proposal": done.proposal.as_json(), "record": done.record.as_json(), "retired": done.retired})
            return
        retired = f"; it replaces {', '.join(done.retired)} (kept as history)" if done.retired else ""
        out.print(
            f"accepted {done.proposal.id}: identity record {done.record.id} ({done.record.scope}, "
            f"'{done.record.subject}'){retired}. Running gateways render it within 30 seconds.",
            highlight=False,
        )

    guarded(body)


@identity_app.command("reject")
def identity_reject(
    proposal_id: str, by: str = _BY, rationale: str = _RATIONALE, as_json: bool = _JSON, config: str | None = _CONFIG
) -> None:
    """Reject an open proposal; it stays on record with the decision."""

    def body() -> None:
        from gateway.cli import out, print_json

        async def action(_cfg: Any, engine: AsyncEngine) -> ProposalView:
            admin = await _decider(engine, await ids.user_id(engine, by))
            pid = await ids.proposal_id(engine, proposal_id)
            return await reject_proposal(IdentityStore(engine), pid, by=admin, rationale=rationale)

        done = with_engine(config, action)
        if as_json:
            print_json(done.as_json())
        else:
            out.print(f"rejected {done.id}", highlight=False)

    guarded(body)


@identity_app.command("list")
def identity_list(as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """The current identity (live global / agent_config records), each with how it came to be."""

    def body() -> None:
        from gateway.cli import out, print_json

        async def action(_cfg: Any, engine: AsyncEngine) -> list[dict[str, Any]]:
            store, how = MemoryStore(engine), await IdentityStore(engine).provenance()
            rows: list[dict[str, Any]] = []
            for scope in ("agent_config", "global"):
                for rec in await store.list_records(scope=scope):
                    d = how.get(rec.id)
                    rows.append({**rec.as_json(), "decision": d.as_json() if d else None})
            return rows

        rows = with_engine(config, action)
        if as_json:
            print_json(rows)
            return
        if not rows:
            out.print("no identity records (the persona in agent.persona is all)")
        for r in rows:
            d = r["decision"]
            how = "no decision on record"
            if d and d["decision"] == "direct":
                how = "written directly before identity changed only by decision"
            elif d:
                how = f"proposal {d['proposal_id']} accepted by {d['by']} on {d['at'][:10]}: {d['rationale']}"
            out.print(f"{r['id']} [{r['scope']}] {r['subject']}: {r['content']} ({how})", highlight=False)

    guarded(body)

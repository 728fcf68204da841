"""``goclaw memory``: list, search and show memory records (mounted by ``gateway.cli``).

The helpers of ``gateway.cli`` (config loading, one-line errors, exit code 2)
are imported inside the commands, so ``gateway.cli`` can import this module to
mount it without an import cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from memory.models import SCOPES
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, RevisionView

memory_app = typer.Typer(help="What the agent remembers: list, search, show.", no_args_is_help=True)

T = TypeVar("T")

_CONFIG = typer.Option(None, "--config", "-c", help="Config file (else $GOCLAW_CONFIG, else ./config.yaml).")
_JSON = typer.Option(False, "--json", help="Print JSON.")


def _guarded(fn: Callable[[], None]) -> None:
    """Run a command body under ``gateway.cli.cli_errors`` (one line on stderr, exit 2)."""
    from gateway.cli import cli_errors, fail

    def body() -> None:
        try:
            fn()
        except MemoryStoreError as exc:
            raise fail(str(exc)) from None

    cli_errors(body)()


def _with_store(config: str | None, action: Callable[[MemoryStore], Awaitable[T]]) -> T:
    """Open the database (migrating it), run ``action`` with the memory store, close."""
    from gateway.cli import load, run
    from gateway.db import make_engine, upgrade

    cfg = load(config)

    async def go() -> T:
        engine = make_engine(cfg.database.url)
        try:
            await upgrade(engine)
            return await action(MemoryStore(engine))
        finally:
            await engine.dispose()

    return run(go())


def _print_json(value: Any) -> None:
    from gateway.cli import print_json

    print_json(value)


def _table(records: list[MemoryRecordView], store_now: Any) -> None:
    from rich.table import Table

    from gateway.cli import out

    if not records:
        out.print("no memory records")
        return
    table = Table("id", "scope", "user", "subject", "content", "status", "said (UTC)", "source", "by")
    for r in records:
        content = r.content if len(r.content) <= 80 else r.content[:77] + "..."
        table.add_row(
            r.id,
            r.scope,
            r.owner_user_id or "",
            r.subject,
            content,
            r.effective_status(store_now),
            f"{r.said_at:%Y-%m-%d %H:%M}",
            r.source,
            f"{r.author_user_id or ''} ({r.author_role or '-'})",
        )
    out.print(table)


@memory_app.command("list")
def memory_list(
    scope: str | None = typer.Option(None, "--scope", help=f"One of: {', '.join(SCOPES)}."),
    user: str | None = typer.Option(None, "--user", help="Only this person's records (a unified user id)."),
    show_all: bool = typer.Option(False, "--all", help="Include history: superseded, unverified, rejected, ..."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Records, newest said first: live ones, or all of them with --all."""

    def body() -> None:
        if scope is not None and scope not in SCOPES:
            raise MemoryStoreError(f"unknown scope {scope!r}: use one of {', '.join(SCOPES)}")

        async def action(store: MemoryStore) -> tuple[list[MemoryRecordView], Any]:
            found = await store.list_records(scope=scope, owner_user_id=user, include_history=show_all, limit=10_000)
            return found, store.now()

        records, now = _with_store(config, action)
        if as_json:
            _print_json([r.as_json(now) for r in records])
        else:
            _table(records, now)

    _guarded(body)


@memory_app.command("search")
def memory_search(query: str, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Records (every scope, everyone's, history included) sharing words with QUERY."""

    def body() -> None:
        async def action(store: MemoryStore) -> tuple[list[MemoryRecordView], Any]:
            found = await store.search(query, scopes=SCOPES, any_owner=True, limit=200)
            return found, store.now()

        records, now = _with_store(config, action)
        if as_json:
            _print_json([r.as_json(now) for r in records])
        else:
            _table(records, now)

    _guarded(body)


@memory_app.command("show")
def memory_show(record_id: str, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """One record in full, with the revisions that retired it or that it caused."""

    def body() -> None:
        from gateway.cli import out

        async def action(store: MemoryStore) -> tuple[MemoryRecordView | None, list[RevisionView], Any]:
            rec = await store.get(record_id)
            revs = await store.revisions_for(record_id) if rec else []
            return rec, revs, store.now()

        rec, revisions, now = _with_store(config, action)
        if rec is None:
            raise MemoryStoreError(f"no memory record {record_id!r}; see 'goclaw memory list --all'")
        if as_json:
            _print_json({**rec.as_json(now), "revisions": [r.as_json() for r in revisions]})
            return
        for key, value in rec.as_json(now).items():
            out.print(f"{key}: {value if value is not None else '-'}", highlight=False)
        for r in revisions:
            out.print(
                f"revision {r.id}: {r.retired_id} retired by {r.replacing_id or '-'} via {r.via} ({r.cause}) "
                f"on {r.created_at:%Y-%m-%d %H:%M}{' [undone]' if r.undone_at else ''}: {r.reason}",
                highlight=False,
            )

    _guarded(body)

"""``goclaw memory``: list, search, show; relearn, review, revisions and undo, retract, consolidate.

The helpers of ``gateway.cli`` (config loading, one-line errors, exit code 2)
are imported inside the commands, so ``gateway.cli`` can import this module to
mount it without an import cycle.

The CLI is the operator's: commands that need an administrator (undo, confirm,
reject, retract, consolidate) run as :data:`OPERATOR`, a human admin principal
named ``operator``, and every write still goes through memory's one gate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from gateway.cli.common import ConfigOpt, JsonOpt, guarded, print_json, with_engine
from memory.models import SCOPES
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, RevisionView
from pairing.principal import Principal, Role

if TYPE_CHECKING:
    from gateway.config import Config
    from memory.relearn import ParsedArchive, RelearnSummary

memory_app = typer.Typer(
    help="What the agent remembers: list, search, show, relearn, review, revisions.", no_args_is_help=True
)
revisions_app = typer.Typer(help="Every retirement of a memory record, and undo (admins: the operator).")
review_app = typer.Typer(help="Quarantined (unverified) learning: list, confirm, reject.")
memory_app.add_typer(revisions_app, name="revisions")
memory_app.add_typer(review_app, name="review")

OPERATOR = Principal.human("operator", Role.ADMIN, "operator")
"""Who the operator's CLI acts as: a human admin (policy: undo and review are for human admins)."""

T = TypeVar("T")

_CONFIG = ConfigOpt
_JSON = JsonOpt


def _guarded(fn: Callable[[], None]) -> None:
    """Run a command body: one-line errors (exit 2), never a traceback."""
    guarded(fn, MemoryStoreError)


def _with_store(config: str | None, action: Callable[[MemoryStore], Awaitable[T]]) -> T:
    """Open the database (migrating it), run ``action`` with the memory store, close."""
    from gateway.cli import load

    cfg = load(config)
    return _with_engine(cfg, lambda engine: action(MemoryStore(engine)))


def _with_ids(config: str | None, action: Callable[[MemoryStore, Any], Awaitable[T]]) -> T:
    """Like :func:`_with_store`, with the engine too, to resolve id prefixes (``gateway.cli.ids``)."""
    from gateway.cli import load

    return _with_engine(load(config), lambda engine: action(MemoryStore(engine), engine))


def _with_engine(cfg: Config, action: Callable[[Any], Awaitable[T]]) -> T:
    """Open the database of ``cfg`` (migrating it), run ``action`` with the engine, close."""
    return with_engine(cfg, action)


def _writer(cfg: Config, store: MemoryStore) -> Any:
    from memory.gate import WriteAccess
    from memory.writer import MemoryWriter

    access = WriteAccess(cfg.memory.write_access.users, cfg.memory.write_access.roles)
    return MemoryWriter(store, write_access=access, notes_review_days=cfg.memory.notes_review_days)


def _id_columns(*names: str) -> list[Any]:
    from gateway.cli import id_column

    return [id_column(n) for n in names]


def _print_json(value: Any) -> None:
    print_json(value)


def _table(records: list[MemoryRecordView], store_now: Any) -> None:
    from rich.table import Table

    from gateway.cli import out, print_table

    if not records:
        out.print("no memory records")
        return
    table = Table(*_id_columns("id"), "scope", *_id_columns("user"), "subject", "content", "status", "said (UTC)",
                  "source", *_id_columns("by"))  # fmt: skip
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
    print_table(table)


@memory_app.command("list")
def memory_list(
    scope: str | None = typer.Option(None, "--scope", help=f"One of: {', '.join(SCOPES)}."),
    user: str | None = typer.Option(None, "--user", help="Only this person's records (a unified user id)."),
    show_all: bool = typer.Option(
        False, "--all", help="Include history: expired, retracted, superseded, unverified, rejected."
    ),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Records, newest said first: live ones, or all of them with --all."""

    def body() -> None:
        if scope is not None and scope not in SCOPES:
            raise MemoryStoreError(f"unknown scope {scope!r}: use one of {', '.join(SCOPES)}")

        async def action(store: MemoryStore, engine: Any) -> tuple[list[MemoryRecordView], Any]:
            from gateway.cli import ids as cli_ids

            owner = await cli_ids.user_id(engine, user) if user is not None else None
            found = await store.list_records(scope=scope, owner_user_id=owner, include_history=show_all, limit=10_000)
            now = store.now()
            # Current facts only, unless --all: an expired note (past review-by) is history, never in use.
            return ([r for r in found if show_all or r.effective_status(now) != "expired"]), now

        records, now = _with_ids(config, action)
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

        async def action(store: MemoryStore, engine: Any) -> tuple[MemoryRecordView | None, list[RevisionView], Any]:
            from gateway.cli import ids as cli_ids

            rid = await cli_ids.record_id(engine, record_id)
            rec = await store.get(rid)
            revs = await store.revisions_for(rid) if rec else []
            return rec, revs, store.now()

        rec, revisions, now = _with_ids(config, action)
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


# ---- revisions and undo -------------------------------------------------------------------


def _revision_table(revisions: list[RevisionView]) -> None:
    from rich.table import Table

    from gateway.cli import out, print_table

    if not revisions:
        out.print("no revisions")
        return
    table = Table(*_id_columns("id", "retired", "replaced by"), "via", "cause", *_id_columns("run"), "judge",
                  "when (UTC)", "undone", "reason")  # fmt: skip
    for r in revisions:
        judge = f"{r.judge_model} / {r.prompt_version}" if r.judge_model else ""
        reason = r.reason if len(r.reason) <= 60 else r.reason[:57] + "..."
        undone = f"{r.undone_at:%Y-%m-%d %H:%M} by {r.undone_by}" if r.undone_at else ""
        table.add_row(
            r.id, r.retired_id, r.replacing_id or "", r.via, r.cause, r.run_id or "", judge,
            f"{r.created_at:%Y-%m-%d %H:%M}", undone, reason,
        )  # fmt: skip
    print_table(table)


@revisions_app.callback(invoke_without_command=True)
def revisions_list(
    ctx: typer.Context,
    run: str | None = typer.Option(None, "--run", help="Only this run's revisions."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Every retirement (newest first): which record replaced which, how, why, in which run."""
    if ctx.invoked_subcommand is not None:
        return

    def body() -> None:
        from memory.revisions import list_revisions

        revisions = _with_store(config, lambda store: list_revisions(store, run_id=run, limit=10_000))
        if run is not None and not revisions:
            raise MemoryStoreError(f"no revisions in run {run!r}; see 'goclaw memory revisions'")
        if as_json:
            _print_json([r.as_json() for r in revisions])
        else:
            _revision_table(revisions)

    _guarded(body)


@revisions_app.command("undo")
def revisions_undo(
    revision_id: str | None = typer.Argument(None, help="The revision to undo (rv_...)."),
    run: str | None = typer.Option(None, "--run", help="Undo every retirement of this run instead."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Undo a retirement (or a whole run): the record returns to live; the undone row is a veto forever."""

    def body() -> None:
        from gateway.cli import out
        from memory.revisions import undo_revision, undo_revision_run

        if (revision_id is None) == (run is None):
            raise MemoryStoreError("give one revision id, or --run RUN_ID")
        if run is not None:
            undone = _with_store(config, lambda store: undo_revision_run(store, run, principal=OPERATOR))
        else:
            assert revision_id is not None
            given = revision_id

            async def undo_one(store: MemoryStore, engine: Any) -> Any:
                from gateway.cli import ids as cli_ids

                return await undo_revision(store, await cli_ids.revision_id(engine, given), principal=OPERATOR)

            undone = _with_ids(config, undo_one)
        if as_json:
            _print_json(
                {
                    "undone": [r.as_json() for r in undone.revisions],
                    "restored": [r.as_json() for r in undone.restored],
                }
            )
            return
        for rev, rec in zip(undone.revisions, undone.restored, strict=False):
            out.print(
                f"undone {rev.id}: {rec.id} is {rec.status} again ('{rec.subject}'); "
                f"{rev.replacing_id or '-'} stays as it is and will never replace it again",
                highlight=False,
            )

    _guarded(body)


# ---- retract ----------------------------------------------------------------------------


@memory_app.command("retract")
def memory_retract(
    record_id: str,
    by: str = typer.Option(..., "--by", help="The paired admin who retracts it (a unified user id)."),
    reason: str = typer.Option(..., "--reason", help="Why (kept with the retraction)."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Retract an operational note: a later event by a named, paired admin; nothing is deleted."""

    def body() -> None:
        from gateway.cli import out
        from gateway.memory_glue import principal_lookup
        from memory.retract import retract_by
        from pairing.store import PairingStore

        async def action(store: MemoryStore, engine: Any) -> MemoryRecordView:
            from gateway.cli import ids as cli_ids

            lookup = principal_lookup(PairingStore(engine))
            return await retract_by(store, lookup, await cli_ids.record_id(engine, record_id), by=by, reason=reason)

        rec = _with_ids(config, action)
        if as_json:
            _print_json(rec.as_json())
        else:
            out.print(f"retracted {rec.id} ('{rec.subject}') by {by}: kept as history, no longer used", highlight=False)

    _guarded(body)


# ---- revise ------------------------------------------------------------------------------


@memory_app.command("revise")
def memory_revise(
    record_ids: list[str] = typer.Argument(None, help="Records to revise (default: every current operational note)."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Belief revision on demand (cause ``revise``), under one run: undo it with 'revisions undo --run'."""

    def body() -> None:
        from gateway.cli import load, out
        from gateway.llm.factory import make_provider
        from gateway.scheduler import judge_model
        from memory.belief_revision import BeliefReviser
        from memory.store import new_run_id

        cfg = load(config)

        async def action(engine: Any) -> dict[str, Any]:
            store = MemoryStore(engine)
            ids = list(record_ids or []) or [n.id for n in await store.live_notes(limit=100_000)]
            provider = make_provider(cfg.llm)
            await provider.start()
            try:
                reviser = BeliefReviser(store, judge_model(provider), judge_model=provider.model)
                run_id = new_run_id("rv")
                outcomes = await reviser.revise_many(ids, cause="revise", run_id=run_id)
            finally:
                await provider.stop()
            retired = sorted({r for o in outcomes for r in o.retired})
            return {"run_id": run_id, "revised": len(outcomes), "retired": retired}

        result = _with_engine(cfg, action)
        if as_json:
            _print_json(result)
        else:
            retired = result["retired"]
            listed = f" ({', '.join(retired)})" if retired else ""
            out.print(
                f"revision run {result['run_id']}: {result['revised']} record(s) revised, {len(retired)} retired"
                + listed,
                highlight=False,
            )

    _guarded(body)


# ---- review ------------------------------------------------------------------------------


@review_app.callback(invoke_without_command=True)
def review_list(ctx: typer.Context, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Quarantined (unverified) records with their evidence: never in a prompt until confirmed."""
    if ctx.invoked_subcommand is not None:
        return

    def body() -> None:
        from gateway.cli import out
        from memory.review import list_unverified

        async def action(store: MemoryStore) -> tuple[list[MemoryRecordView], Any]:
            return await list_unverified(store, limit=10_000), store.now()

        records, now = _with_store(config, action)
        if as_json:
            _print_json([r.as_json(now) for r in records])
        elif not records:
            out.print("nothing awaits review")
        else:
            _table(records, now)
            for r in records:
                held = f", held because: {r.status_reason}" if r.status_reason else ""
                out.print(f"{r.id}: session {r.session_id or '-'}, evidence {', '.join(r.evidence) or '-'}{held}")

    _guarded(body)


def _review_action(given_id: str, config: str | None, as_json: bool, confirm: bool, reason: str = "") -> None:
    from gateway.cli import load, out
    from gateway.llm.factory import make_provider
    from gateway.scheduler import judge_model
    from memory.belief_revision import BeliefReviser
    from memory.review import confirm_learned, reject_learned

    cfg = load(config)

    async def action(engine: Any) -> dict[str, Any]:
        from gateway.cli import ids as cli_ids

        store = MemoryStore(engine)
        writer = _writer(cfg, store)
        record_id = await cli_ids.record_id(engine, given_id)
        if not confirm:
            rec = await reject_learned(writer, OPERATOR, record_id, reason=reason)
            return {"record": rec.as_json(), "text": f"rejected {rec.id}: kept as rejected, never used"}
        provider = make_provider(cfg.llm)
        await provider.start()
        try:
            reviser = BeliefReviser(store, judge_model(provider), judge_model=provider.model)
            done = await confirm_learned(writer, OPERATOR, record_id, reviser=reviser)
        finally:
            await provider.stop()
        return {
            "record": done.record.as_json(),
            "retired": list(done.retired),
            "belief_revision": done.revision.as_json() if done.revision else None,
            "run_id": done.run_id,
            "text": done.text(),
        }

    result = _with_engine(cfg, action)
    if as_json:
        _print_json(result)
    else:
        out.print(result["text"], highlight=False)


@review_app.command("confirm")
def review_confirm(record_id: str, as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Confirm a quarantined record: it becomes live (or history, if said before the live value)."""
    _guarded(lambda: _review_action(record_id, config, as_json, confirm=True))


@review_app.command("reject")
def review_reject(
    record_id: str,
    reason: str = typer.Option("", "--reason", help="Why (kept with the decision)."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Reject a quarantined record: it is kept as rejected and never used."""
    _guarded(lambda: _review_action(record_id, config, as_json, confirm=False, reason=reason))


# ---- relearn -------------------------------------------------------------------------------


def parse_since(value: str) -> datetime:
    """``--since``: a date (midnight UTC) or an ISO time.

    Raises:
        ValueError: neither.
    """
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"--since {value!r}: use a date like 2026-11-01 or an ISO time") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _archive_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(path.glob("*.md")))
        elif path.is_file():
            files.append(path)
        else:
            raise MemoryStoreError(f"--archive {path}: no such file or folder")
    return files


def _relearn_report(summary: RelearnSummary, as_json: bool) -> None:
    from rich.table import Table

    from gateway.cli import err, out
    from memory.relearn import relearn_rows

    if as_json:
        _print_json(summary.as_json())
    else:
        if summary.dry_run:
            would = Table("archive", "would be", "scope", "subject", "content", "said (UTC)", title="dry run")
            for a in summary.archives:
                for label, recs in (("learned", a.learned), ("history", a.history), ("unverified", a.quarantined)):
                    for r in recs:
                        would.add_row(
                            a.archive.name, label, r.scope, r.subject, r.content, f"{r.said_at:%Y-%m-%d %H:%M}"
                        )
            out.print(would)
        table = Table("", "count", title=f"relearn {summary.run_id}" + (" (dry run)" if summary.dry_run else ""))
        for what, n in relearn_rows(summary):
            table.add_row(what, str(n))
        out.print(table)
        for note in summary.notes():
            out.print(note, highlight=False)
    if summary.interrupted:
        err.print(f"[bold red]error:[/] relearn interrupted: {summary.interrupted}; run it again to finish",
                  highlight=False)  # fmt: skip
        raise typer.Exit(2)


@memory_app.command("relearn")
def memory_relearn(
    session: str | None = typer.Option(None, "--session", help="Only this session's archives."),
    since: str | None = typer.Option(None, "--since", help="Only archives that end on or after this date (UTC)."),
    archive: list[Path] | None = typer.Option(
        None, "--archive", help="Exported archive markdown files (or folders of them) instead of the database."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be written; write nothing."),
    as_json: bool = _JSON,
    config: str | None = _CONFIG,
) -> None:
    """Learn again from session archives: the live path's extractor and gate, dated when the session was.

    Archives with ``**Trust**: admin`` teach operational knowledge; any other
    (or a missing) trust line quarantines it as unverified for review. Personal
    lines are not relearned. Running it twice writes nothing new.
    """

    def body() -> None:
        from rich.progress import Progress

        from gateway.cli import err, load
        from gateway.llm.factory import make_provider
        from gateway.scheduler import extraction_model, judge_model
        from gateway.sessions import SessionStore
        from memory.belief_revision import BeliefReviser
        from memory.relearn import ArchiveOutcome, parse_archive, relearn_archives, select_archives

        cfg = load(config)
        since_at = parse_since(since) if since else None
        files = _archive_files(list(archive)) if archive else []
        from_files = [parse_archive(f.read_text(encoding="utf-8"), origin=str(f)) for f in files]

        async def action(engine: Any) -> RelearnSummary:
            store = MemoryStore(engine)
            writer = _writer(cfg, store)
            chosen: list[ParsedArchive]
            if archive:
                chosen = select_archives(from_files, session_id=session, since=since_at)
            else:
                stored = await SessionStore(engine).list_archives(session_id=session, since=since_at)
                chosen = select_archives(
                    [parse_archive(a.markdown, origin="database") for a in stored], session_id=session, since=since_at
                )
            provider = make_provider(cfg.llm)
            await provider.start()
            try:
                reviser = None
                if not dry_run:
                    reviser = BeliefReviser(store, judge_model(provider), judge_model=provider.model)
                with Progress(console=err, transient=True) as progress:
                    task = progress.add_task("relearning archives", total=len(chosen))

                    def step(_: ArchiveOutcome) -> None:
                        progress.advance(task)

                    return await relearn_archives(
                        writer, extraction_model(provider), chosen, dry_run=dry_run, reviser=reviser, on_archive=step
                    )
            finally:
                await provider.stop()

        _relearn_report(_with_engine(cfg, action), as_json)

    _guarded(body)


# ---- consolidate ---------------------------------------------------------------------------


@memory_app.command("consolidate")
def memory_consolidate(as_json: bool = _JSON, config: str | None = _CONFIG) -> None:
    """Run one consolidation now (as notes_distill does): merge operational notes that say the same thing."""

    def body() -> None:
        from gateway.cli import load, out
        from gateway.llm.factory import make_provider
        from gateway.scheduler import BUSY, Scheduler, consolidation_model
        from memory.consolidate import ConsolidationRun

        cfg = load(config)

        async def action(engine: Any) -> ConsolidationRun | None:
            provider = make_provider(cfg.llm)
            await provider.start()
            try:
                scheduler = Scheduler(
                    engine=engine,
                    writer=_writer(cfg, MemoryStore(engine)),
                    model=consolidation_model(provider),
                    model_name=provider.model,
                    auto_distill=False,
                )
                return await scheduler.consolidate(OPERATOR, trigger="cli")
            finally:
                await provider.stop()

        run = _with_engine(cfg, action)
        if run is None:
            raise MemoryStoreError(BUSY)
        if as_json:
            _print_json(run.as_json())
        else:
            out.print(run.summary(), highlight=False)

    _guarded(body)

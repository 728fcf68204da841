"""The ``goclaw`` command: serve, config, db, users, pairing, chat, memory, sop, identity, obligations, signals."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.cli import ids as cli_ids
from gateway.cli.common import (
    ConfigOpt,
    JsonOpt,
    T,
    cli_errors,
    err,
    escape,
    fail,
    id_column,
    known_channel,
    known_identity,
    load,
    out,
    print_json,
    print_table,
    run,
    run_with_pairing,
    run_with_store,
    with_engine,
)
from gateway.config import check_secrets, find_config_path
from gateway.errors import DatabaseUnavailable, GoclawError
from pairing.store import PairingStore, UserView

app = typer.Typer(help="goclaw: a chat gateway whose agent learns safely.", no_args_is_help=True, add_completion=False)
config_app = typer.Typer(help="Check the configuration.", no_args_is_help=True)
db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)
users_app = typer.Typer(help="People and their roles.", no_args_is_help=True)
pairing_app = typer.Typer(help="Pending pairing codes.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.add_typer(users_app, name="users")
app.add_typer(pairing_app, name="pairing")
archives_app = typer.Typer(help="Archives of trimmed history.", no_args_is_help=True)
app.add_typer(archives_app, name="archives")


def _mount_memory() -> None:
    from gateway.cli.memory import memory_app

    app.add_typer(memory_app, name="memory")


_mount_memory()


def _mount_sop() -> None:
    from gateway.cli.sop import sop_app

    app.add_typer(sop_app, name="sop")


_mount_sop()


def _mount_identity() -> None:
    from gateway.cli.identity import identity_app

    app.add_typer(identity_app, name="identity")


_mount_identity()


def _mount_obligations() -> None:
    from gateway.cli.obligations import obligation_app, obligations_list, signals_app

    app.command("obligations")(obligations_list)
    app.add_typer(obligation_app, name="obligation")
    app.add_typer(signals_app, name="signals")


_mount_obligations()

# ---- serve / config / db ----------------------------------------------------------------


@app.command()
@cli_errors
def serve(
    config: str | None = ConfigOpt,
    workers: int = typer.Option(
        1, "--workers", help="Serve processes sharing the port (SO_REUSEPORT; PostgreSQL only when more than 1)."
    ),
    child: int | None = typer.Option(None, "--child", hidden=True, help="Internal: one process of --workers N."),
) -> None:
    """Run the gateway: migrations, web server, enabled channels, memory worker (see worker.mode)."""
    from gateway.server import serve_command

    serve_command(config, workers, child)  # also what `goclaw serve` runs without this CLI (gateway/__main__.py)


@app.command()
@cli_errors
def worker(config: str | None = ConfigOpt) -> None:
    """Run the background work only (jobs, idle extraction, consolidation, SOP schedules): no listener, no channels.

    For ``worker.mode: separate`` on PostgreSQL; any number may run (jobs are
    claimed once; the scheduled work runs in one of them at a time).
    """
    from gateway.background import run_worker_forever

    cfg = load(config)
    check_secrets(cfg)
    logging.basicConfig(level=cfg.logging.level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not cfg.database.url.startswith("postgresql"):
        raise fail(
            "goclaw worker needs PostgreSQL: database.url is SQLite, which one process owns; "
            "with SQLite, goclaw serve runs the background work on its own thread (worker.mode: inline)"
        )
    try:
        asyncio.run(run_worker_forever(cfg))
    except KeyboardInterrupt:
        pass
    except DatabaseUnavailable as exc:
        raise fail(str(exc)) from None


@config_app.command("check")
@cli_errors
def config_check(config: str | None = ConfigOpt) -> None:
    """Validate the config; print OK or every problem (exit 2)."""
    path = find_config_path(config)
    cfg = load(config)
    check_secrets(cfg)
    out.print(f"OK: {path} (llm: {cfg.llm.provider}, database: {cfg.database.url.split('://')[0]})", highlight=False)


@db_app.command("upgrade")
@cli_errors
def db_upgrade(config: str | None = ConfigOpt) -> None:
    """Apply every pending migration."""

    async def nothing(_: AsyncEngine) -> None:
        return None

    with_engine(load(config), nothing)
    out.print("database is up to date")


# ---- users ------------------------------------------------------------------------------


@users_app.command("add")
@cli_errors
def users_add(
    name: str = typer.Option(..., "--name", help="The person's display name."),
    role: str = typer.Option(..., "--role", help="admin or user."),
    link: list[str] = typer.Option([], "--link", help="CHANNEL:PLATFORM_ID to link (repeatable)."),
    as_json: bool = JsonOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Add a person with a role, optionally linked to platform identities."""
    links = [known_identity(spec) for spec in link]
    user = run_with_store(config, lambda s: s.add_user(name, role, links=links, by="operator"))
    if as_json:
        print_json({"id": user.id})
    else:
        out.print(user.id)


@users_app.command("list")
@cli_errors
def users_list(as_json: bool = JsonOpt, config: str | None = ConfigOpt) -> None:
    """Everyone, with their role and linked identities."""
    users = run_with_store(config, lambda s: s.list_users())
    if as_json:
        print_json([u.as_json() for u in users])
        return
    from rich.table import Table

    table = Table(id_column("id"), "name", "role", "identities", "created")
    for u in users:
        table.add_row(u.id, u.display_name, u.role.value, ", ".join(u.identities), f"{u.created_at:%Y-%m-%d %H:%M}")
    print_table(table)


@users_app.command("role")
@cli_errors
def users_role(user_id: str, role: str, config: str | None = ConfigOpt) -> None:
    """Change a person's role (recorded with who and when)."""

    async def body(s: PairingStore, engine: AsyncEngine) -> UserView:
        return await s.set_role(await cli_ids.user_id(engine, user_id), role, by="operator")

    user = run_with_pairing(config, body)
    out.print(f"{user.id} ({user.display_name}) now has role {user.role.value}", highlight=False)


@users_app.command("link")
@cli_errors
def users_link(user_id: str, identity: str, config: str | None = ConfigOpt) -> None:
    """Link CHANNEL:PLATFORM_ID to an existing person."""
    spec = known_identity(identity)

    async def body(s: PairingStore, engine: AsyncEngine) -> UserView:
        return await s.link(await cli_ids.user_id(engine, user_id), spec)

    user = run_with_pairing(config, body)
    out.print(f"{user.id} is linked to {', '.join(user.identities)}", highlight=False)


# ---- pairing ----------------------------------------------------------------------------


@pairing_app.command("list")
@cli_errors
def pairing_list(as_json: bool = JsonOpt, config: str | None = ConfigOpt) -> None:
    """Pending, unexpired pairing codes."""
    pending = run_with_store(config, lambda s: s.list_pending())
    if as_json:
        print_json([p.as_json() for p in pending])
        return
    if not pending:
        out.print("no pending pairing requests")
        return
    from rich.table import Table

    table = Table("channel", id_column("code"), id_column("platform id"), "name", "expires (UTC)")
    for p in pending:
        table.add_row(p.channel, p.code, p.platform_user_id, p.display_name, f"{p.expires_at:%Y-%m-%d %H:%M}")
    print_table(table)


@pairing_app.command("approve")
@cli_errors
def pairing_approve(
    channel: str,
    code: str,
    role: str = typer.Option("user", "--role", help="user or admin."),
    user: str | None = typer.Option(None, "--user", help="Link to this existing user instead of creating one."),
    config: str | None = ConfigOpt,
) -> None:
    """Approve a pairing code: a new person with --role, or linked to --user."""
    name = known_channel(channel)

    async def body(s: PairingStore, engine: AsyncEngine) -> UserView:
        existing = await cli_ids.user_id(engine, user) if user is not None else None
        # The store's approve records the notice that tells the person (delivered by the running gateway).
        return await s.approve(name, code, role=role, user_id=existing, by="operator")

    view = run_with_pairing(config, body)
    out.print(
        f"approved: {view.id} ({view.display_name}), role {view.role.value}; "
        "they are told on their channel when the gateway is running",
        highlight=False,
    )


@pairing_app.command("reject")
@cli_errors
def pairing_reject(channel: str, code: str, config: str | None = ConfigOpt) -> None:
    """Reject a pairing code."""
    name = known_channel(channel)
    req = run_with_store(config, lambda s: s.reject(name, code, by="operator"))
    out.print(f"rejected {req.code} from {req.display_name}", highlight=False)


def _with_sessions(config: str | None, body: Callable[[Any], Awaitable[T]]) -> T:
    from gateway.sessions import SessionStore

    return with_engine(load(config), lambda engine: body(SessionStore(engine)))


@archives_app.command("list")
@cli_errors
def archives_list(
    session: str | None = typer.Option(None, "--session", help="Only this session's archives."),
    as_json: bool = JsonOpt,
    config: str | None = ConfigOpt,
) -> None:
    """Archives of trimmed history, oldest first, with their trust."""
    rows = _with_sessions(config, lambda s: s.list_archives(session_id=session))
    data = [
        {
            "id": a.id,
            "session": a.session_id,
            "from": a.start_at.isoformat(),
            "to": a.end_at.isoformat(),
            "trust": a.trust,
            "messages": a.message_count,
        }
        for a in rows
    ]
    if as_json:
        print_json(data)
        return
    from rich.table import Table

    table = Table(id_column("id"), id_column("session"), "from (UTC)", "to", "trust", "messages")
    for a in rows:
        table.add_row(
            a.id, a.session_id, f"{a.start_at:%Y-%m-%d %H:%M}", f"{a.end_at:%H:%M}", a.trust, str(a.message_count)
        )
    print_table(table)


@archives_app.command("export")
@cli_errors
def archives_export(
    out_dir: str = typer.Option("data/archives", "--out", help="Folder to write the markdown files to."),
    session: str | None = typer.Option(None, "--session", help="Only this session's archives."),
    config: str | None = ConfigOpt,
) -> None:
    """Write each archive as markdown (the format `goclaw memory relearn --archive` reads)."""
    from pathlib import Path

    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GoclawError(f"cannot create {folder}: {exc.strerror}; pass --out to a writable folder") from None
    rows = _with_sessions(config, lambda s: s.list_archives(session_id=session))
    for a in rows:
        (folder / f"{a.start_at:%Y%m%dT%H%M%S}-{a.id}.md").write_text(a.markdown, encoding="utf-8")
    out.print(f"wrote {len(rows)} archive(s) to {folder}", highlight=False)


@app.command("chat")
@cli_errors
def chat_command(
    as_user: str = typer.Option(..., "--as", help="The unified user id to chat as (see 'goclaw users list')."),
    session: str = typer.Option("terminal", "--session", help="Session name."),
    config: str | None = ConfigOpt,
) -> None:
    """Talk to the agent from the terminal, through the same turn handler as every channel."""
    import secrets
    from datetime import UTC, datetime

    from gateway.app import Gateway
    from gateway.memory_glue import mark_run_by_hand
    from gateway.sessions import SessionKey
    from gateway.turn import TurnRequest

    cfg = load(config)

    async def go() -> None:
        gw = Gateway(cfg)
        await gw.start(channels=False)
        try:
            principal = await gw.pairing.principal_for_user(await cli_ids.user_id(gw.engine, as_user))
            out.print(
                f"Chatting with {cfg.agent.name} as {principal.display_name} ({as_user}, "
                f"role {principal.stored_role}). Ctrl-D to leave.",
                highlight=False,
            )
            loop = asyncio.get_running_loop()
            mark_run_by_hand()  # seed 001: a run by hand sees every current operational note, scoped or not
            while True:
                line = await loop.run_in_executor(None, _prompt_line)
                if line is None:
                    break
                if not line.strip():
                    continue
                result = await gw.turns.handle(
                    TurnRequest(
                        key=SessionKey("cli", f"{principal.user_id}/{session}"),
                        principal=principal,
                        text=line,
                        message_id="cli-" + secrets.token_hex(8),
                        said_at=datetime.now(UTC),
                        display_name=principal.display_name,
                    )
                )
                principal = result.principal or principal  # as the person is now (the role this turn read)
                out.print(f"{cfg.agent.name}: ", style="bold", end="")
                out.print(result.reply or "", markup=False, highlight=False)
            await gw.worker.drain()
        finally:
            await gw.stop()

    run(go())


def _prompt_line() -> str | None:
    try:
        return input("you> ")
    except EOFError:
        return None


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("goclaw")
        except PackageNotFoundError:
            from gateway import __version__ as number
        out.print(f"goclaw {number}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    _version_flag: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """goclaw: a chat gateway whose agent learns safely."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``goclaw`` console script.

    Usage errors (an unknown option, a missing argument) are one line on stderr
    with exit code 2, like every other error, instead of Typer's boxed panel.
    """
    try:
        code = app(args=argv, prog_name="goclaw", standalone_mode=False)
    except typer.Abort:
        err.print("aborted", highlight=False)
        sys.exit(1)
    except typer.TyperException as exc:  # Click's ClickException and UsageError
        sys.exit(_usage_error(exc))
    sys.exit(code if isinstance(code, int) else 0)


def _usage_error(exc: Any) -> int:
    if type(exc).__name__ == "NoArgsIsHelpError":
        # A command group called bare: its help, as before.
        sys.stderr.write(exc.format_message().rstrip() + "\n")
        return 2
    message = " ".join(str(exc.format_message()).split())
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    err.print(f"[bold red]error:[/] {escape(message + hint)}", highlight=False, soft_wrap=True)
    return int(getattr(exc, "exit_code", 2) or 2)

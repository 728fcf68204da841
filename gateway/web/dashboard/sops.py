"""SOPs: each one's trigger, next run, last runs, hold; run now, enable / disable.

Every action calls ``gateway.automation.api`` (what ``goclaw sop`` calls), and
the hold shown is what the runner's own ``holds`` check answers, the one that
decides whether a run starts: the page never decides anything itself. Only a
human admin may act (policy: SOPs are configured by admins); the dashboard's
operator is one, and the check is in code here as in every other action.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from aiohttp import web
from msgspec import Struct
from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gateway.automation import api
from gateway.automation.models import SopRun
from gateway.automation.store import RunView, SopError, _run_view
from gateway.web.dashboard.base import (
    PAGE_SIZE,
    DashError,
    Page,
    act,
    action,
    decode_cursor,
    field,
    gateway_of,
    keyset_page,
    page,
    render,
)
from memory.obligations import ObligationView
from pairing.principal import Principal, is_human_admin

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger(__name__)


class SopRow(Struct, frozen=True):
    """An SOP as the list shows it: its summary and what holds it now (None: nothing)."""

    summary: api.SopSummary
    held_by: str | None
    hold_error: str | None = None
    obligation: ObligationView | None = None  # the holding obligation as memory's findings store has it


def _authorize(who: Principal) -> None:
    if not is_human_admin(who):
        raise DashError(403, "only a human admin may run, enable or disable an SOP")


async def _row(gw: Gateway, summary: api.SopSummary) -> SopRow:
    """The SOP with what the runner's ``holds`` check says for it (the obligation, or why it could not say)."""
    name = summary.sop.name
    try:
        held_by = await gw.automation.runner.holds(name)
    except Exception as exc:  # the runner records such a run as failed; the page says so too
        log.exception("sop %s: holds check failed", name)
        return SopRow(summary, None, f"could not check whether an obligation holds this SOP: {exc}")
    facts = gw.memory.facts
    obligation = await facts.findings.obligation(held_by) if held_by and facts is not None else None
    return SopRow(summary, held_by, None, obligation)


async def runs_page(engine: AsyncEngine, name: str, *, after: str | None, limit: int = PAGE_SIZE) -> Page:
    """One SOP's runs, newest first, one keyset page (``created_at``, ``id`` descending; indexed)."""
    cursor = decode_cursor(after, (datetime, str))
    q = select(SopRun).where(SopRun.sop_name == name)
    if cursor is not None:
        at, rid = cursor
        q = q.where(or_(SopRun.created_at < at, and_(SopRun.created_at == at, SopRun.id < rid)))
    q = q.order_by(SopRun.created_at.desc(), SopRun.id.desc()).limit(limit + 1)
    async with AsyncSession(engine) as s:
        views: list[RunView] = [_run_view(r) for r in (await s.scalars(q)).all()]
    return keyset_page(views, limit, lambda r: (r.created_at, r.id))


@page
async def sops(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/sops: every SOP with its trigger, next run, hold and latest runs."""
    gw = gateway_of(request)
    rows = [await _row(gw, s) for s in await api.list_sops(gw.automation.store)]
    return render(request, "sops.html", {"title": "SOPs", "rows": rows})


@page
async def sop(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/sops/{name}: one SOP and its run history (keyset-paged)."""
    gw = gateway_of(request)
    name = request.match_info["name"]
    try:
        summary = await api.get_sop(gw.automation.store, name, last=0)
    except SopError as exc:
        raise DashError(404, f"{exc}; see the SOP list") from None
    row = await _row(gw, summary)
    after = request.query.get("after")
    runs = await runs_page(gw.engine, name, after=after)
    return render(
        request,
        "sop.html",
        {"title": f"SOP {name}", "row": row, "runs": runs, "first": bool(after)},
    )


def _back(name: str) -> str:
    return f"/dashboard/sops/{name}"


@action
async def run_now(request: web.Request) -> web.StreamResponse:
    """POST: run an SOP now as ``sop-system`` and wait for it (as ``goclaw sop run``)."""
    gw = gateway_of(request)
    name = field(await request.post(), "name", max_len=64)

    async def run(who: Principal) -> str:
        _authorize(who)
        r = await api.run_now(gw.automation.runner, name)
        if r.status == "held":
            return f"Not run: SOP {name} is held by obligation {r.held_by} (run {r.id} recorded as held)."
        if r.status == "failed":
            return f"Run {r.id} of {name} failed: {r.error}"
        return f"Ran {name}: run {r.id} {r.status}."

    return await act(request, "sop run", name, run, back=_back(name))


@action
async def set_enabled(request: web.Request) -> web.StreamResponse:
    """POST: enable or disable an SOP (as ``goclaw sop enable|disable``)."""
    gw = gateway_of(request)
    form = await request.post()
    name = field(form, "name", max_len=64)
    enabled = {"enable": True, "disable": False}.get(field(form, "to", max_len=8))
    if enabled is None:
        raise DashError(400, "the form field 'to' must be enable or disable")
    verb = "enable" if enabled else "disable"

    async def run(who: Principal) -> str:
        _authorize(who)
        view = await api.set_enabled(gw.automation.store, name, enabled)
        note = " (a config-file SOP: until the next start)" if view.origin == "yaml" and not enabled else ""
        return f"SOP {name} is now {'enabled' if view.enabled else 'disabled'}{note}."

    back = field(form, "back", required=False, max_len=200)
    return await act(request, f"sop {verb}", name, run, back=back if back.startswith("/dashboard/") else _back(name))

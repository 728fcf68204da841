"""Memory: browse and search, a record with its provenance and subject timeline, review, retract, undo.

Actions call memory's own functions, the ones ``goclaw memory`` and the
``review_learned`` / ``memory_revisions`` tools call (``memory.review``,
``memory.revisions``); they check the principal themselves (human admins only).
"""

from __future__ import annotations

from aiohttp import web

from gateway.web.dashboard import queries
from gateway.web.dashboard.base import DashError, act, action, field, gateway_of, page, render, with_query
from memory.models import SCOPES, STATUSES
from memory.review import confirm_learned, reject_learned, retract_note
from memory.revisions import undo_revision, undo_revision_run
from pairing.principal import Principal


def _filter(request: web.Request) -> queries.MemoryFilter:
    q = request.query
    return queries.MemoryFilter(
        scope=q.get("scope", "").strip(),
        owner=q.get("owner", "").strip(),
        status=q.get("status", "").strip(),
        q=q.get("q", "").strip(),
    ).check()


@page
async def browse(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/memory: records by scope, owner, status and words, newest said first."""
    gw = gateway_of(request)
    f = _filter(request)
    result = await queries.memory_page(gw.engine, f, after=request.query.get("after"), now=gw.clock())
    return render(
        request,
        "memory_list.html",
        {
            "title": "Memory",
            "f": f,
            "page": result,
            "scopes": SCOPES,
            "statuses": STATUSES,
            "now": gw.clock(),
            "next_url": with_query(request, after=result.next_after) if result.next_after else None,
        },
    )


@page
async def review_queue(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/memory/review: learned records quarantined as unverified, to confirm or reject."""
    gw = gateway_of(request)
    f = queries.MemoryFilter(status="unverified")
    result = await queries.memory_page(gw.engine, f, after=request.query.get("after"), now=gw.clock())
    return render(
        request,
        "review.html",
        {
            "title": "Review",
            "page": result,
            "next_url": with_query(request, after=result.next_after) if result.next_after else None,
        },
    )


@page
async def record(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/memory/record/{id}: provenance, reviews and the subject timeline."""
    gw = gateway_of(request)
    rec = await queries.get_record(gw.engine, request.match_info["id"])
    if rec is None:
        raise DashError(404, f"no memory record {request.match_info['id']!r}; search for it on the Memory page")
    timeline = await queries.subject_timeline(gw.engine, rec)
    reviews = await gw.memory.store.reviews_for(rec.id)
    return render(
        request,
        "memory_record.html",
        {
            "title": f"Record {rec.id}",
            "r": rec,
            "status": rec.effective_status(gw.clock()),
            "timeline": timeline,
            "reviews": reviews,
            "now": gw.clock(),
        },
    )


def _back(form: object, record_id: str) -> str:
    back = field(form, "back", required=False, max_len=300)
    return back if back.startswith("/dashboard/") else f"/dashboard/memory/record/{record_id}"


@action
async def confirm(request: web.Request) -> web.StreamResponse:
    """POST: confirm an unverified record (through the write gate, then belief revision)."""
    gw = gateway_of(request)
    form = await request.post()
    record_id = field(form, "id", max_len=40)

    async def run(who: Principal) -> str:
        done = await confirm_learned(gw.memory.writer, who, record_id, reviser=gw.memory.reviser)
        return done.text()

    return await act(request, "memory confirm", record_id, run, back=_back(form, record_id))


@action
async def reject(request: web.Request) -> web.StreamResponse:
    """POST: reject an unverified record (kept as rejected, never used)."""
    gw = gateway_of(request)
    form = await request.post()
    record_id = field(form, "id", max_len=40)
    reason = field(form, "reason", required=False)

    async def run(who: Principal) -> str:
        rec = await reject_learned(gw.memory.writer, who, record_id, reason=reason)
        return f"Rejected {rec.id}: it is kept as rejected and never used."

    return await act(request, "memory reject", f"{record_id} {reason}".strip(), run, back=_back(form, record_id))


@action
async def retract(request: web.Request) -> web.StreamResponse:
    """POST: retract a live agent note, with a reason (nothing is deleted)."""
    gw = gateway_of(request)
    form = await request.post()
    record_id = field(form, "id", max_len=40)
    reason = field(form, "reason")

    async def run(who: Principal) -> str:
        rec = await retract_note(gw.memory.store, who, record_id, reason=reason)
        return f"Retracted {rec.id}: it is out of every prompt from now on (kept as history)."

    return await act(request, "memory retract", f"{record_id}: {reason}", run, back=_back(form, record_id))


def _undo_target(source: object) -> tuple[str, str]:
    revision = field(source, "revision", required=False, max_len=40)
    run = field(source, "run", required=False, max_len=40)
    if bool(revision) == bool(run):
        raise DashError(400, "give one revision id ('revision') or one run id ('run') to undo")
    return revision, run


@page
async def undo_confirm(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/memory/undo: the confirmation step, showing what returns to the prompt."""
    gw = gateway_of(request)
    revision, run = _undo_target(request.query)
    rows = await queries.revisions_of(gw.engine, revision_id=revision or None, run_id=run or None)
    if not rows:
        raise DashError(404, f"no {'revision ' + revision if revision else 'run ' + run}; see a record's timeline")
    pending = [r for r in rows if not r.undone]
    ids = list({x for r in rows for x in (r.retired_id, r.replacing_id) if x})
    recs = await queries.records_by_id(gw.engine, ids)
    return render(
        request,
        "undo_confirm.html",
        {
            "title": "Undo",
            "revision": revision,
            "run": run,
            "rows": rows,
            "pending": pending,
            "recs": recs,
        },
    )


@action
async def undo(request: web.Request) -> web.StreamResponse:
    """POST: undo one revision or a whole run; the retired records return to the prompt, the rows are vetoes."""
    gw = gateway_of(request)
    form = await request.post()
    revision, run_id = _undo_target(form)

    async def run(who: Principal) -> str:
        if revision:
            done = await undo_revision(gw.memory.store, revision, principal=who)
        else:
            done = await undo_revision_run(gw.memory.store, run_id, principal=who)
        back_in = ", ".join(r.id for r in done.restored) or "none"
        return f"Undone {len(done.revisions)} retirement(s); back in memory: {back_in}. They stand as vetoes."

    restored_first = await queries.revisions_of(gw.engine, revision_id=revision or None, run_id=run_id or None)
    back = f"/dashboard/memory/record/{restored_first[0].retired_id}" if restored_first else "/dashboard/memory"
    what = f"revision {revision}" if revision else f"run {run_id}"
    return await act(request, "memory undo", what, run, back=back)

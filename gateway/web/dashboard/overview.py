"""The overview page: model, channels, database, queue, recent turns, warnings."""

from __future__ import annotations

from aiohttp import web
from sqlalchemy.engine import make_url

from gateway.web.dashboard import queries
from gateway.web.dashboard.base import gateway_of, page, render


@page
async def overview(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/: what is running and what needs the operator's attention."""
    gw = gateway_of(request)
    cfg = gw.config
    jobs = await queries.job_counts(gw.engine)
    counts = await queries.memory_counts(gw.engine)
    turns = await queries.turns_page(gw.engine, session_id=None, after=None, limit=10)
    channels = [{"name": "web chat & API", "state": "started"}]
    for name in ("discord", "teams"):
        section = getattr(cfg.channels, name)
        state = gw.channel_state.get(name, "stopped") if section.enabled else "disabled"
        channels.append({"name": name, "state": state, "dm_policy": section.dm_policy.value})
    warnings = list(cfg.warnings)
    if jobs.get("failed"):
        warnings.append(
            f"{jobs['failed']} background job(s) (trims, extraction, revision) are parked (failed): "
            "their errors are in the jobs table's last_error and the job worker's log"
        )
    if counts.get("unverified"):
        warnings.append(f"{counts['unverified']} learned record(s) await review (Review page)")
    warnings += [f"channel {c['name']}: {c['state']}" for c in channels if str(c["state"]).startswith("failed")]
    if gw.memory.facts is not None:
        holding = [o for o in await gw.memory.facts.findings.obligations() if o.holds]
        warnings += [f"SOP {o.sop_name} is held by obligation {o.id} (Findings page)" for o in holding]
        if waiting := await gw.memory.facts.identity.count():  # all of them: a listing stops at its limit
            warnings.append(f"{waiting} identity proposal(s) await a decision (Identity page)")
    return render(
        request,
        "overview.html",
        {
            "title": "Overview",
            "provider": gw.provider.name,
            "model": cfg.llm.model,
            "channels": channels,
            "database": make_url(cfg.database.url).render_as_string(hide_password=True),
            "dialect": gw.engine.dialect.name,
            "jobs": jobs,
            "done_kept_days": f"{cfg.worker.keep_done_jobs_days:g}",  # older done jobs are deleted (worker.py)
            "counts": counts,
            "turns": turns.rows,
            "warnings": warnings,
        },
    )

"""The SOPs page over real HTTP on SQLite and PostgreSQL: what it shows, run now, enable/disable, holds, paging."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.automation import api
from gateway.web.dashboard.base import PAGE_SIZE
from tests.gateway.dashboard_http import Dash, audit_rows, dashboard

SOPS: dict[str, Any] = {
    "automation": {
        "sops": [
            {"name": "summary", "instruction": "Summarise yesterday's open questions.", "trigger": {"manual": True}},
            {
                "name": "daily-report",
                "instruction": "Produce the daily report.",
                "trigger": {"cron": "0 7 * * 1-5", "tz": "Europe/Berlin"},
            },
        ]
    }
}
HOLDS: dict[str, str] = {}


async def _holds(name: str) -> str | None:
    return HOLDS.get(name)


@pytest.fixture
async def dash(db_url: str) -> AsyncIterator[Dash]:
    HOLDS.clear()
    async with dashboard(db_url, SOPS, sop_holds=_holds) as d:
        yield d


async def test_the_sops_page_shows_triggers_and_next_runs_and_run_now_records_a_run(dash: Dash) -> None:
    status, page = await dash.get("/dashboard/sops")
    assert status == 200
    assert 'data-sop="summary"' in page and 'data-sop="daily-report"' in page
    assert "0 7 * * 1-5" in page and "Europe/Berlin" in page
    report = await dash.gw.automation.store.require("daily-report")
    assert report.next_run is not None and f"{report.next_run:%Y-%m-%d %H:%M} UTC" in page
    assert "No runs yet." in page

    status, page = await dash.post("/dashboard/sops/run", name="summary")
    assert status == 200
    flash = re.search(r'class="flash ok"[^>]*>([^<]+)<', page)
    assert flash and "Ran summary: run r_" in flash.group(1) and " ok." in flash.group(1)
    runs = await api.list_runs(dash.gw.automation.store, "summary")
    assert [(r.status, r.trigger, r.principal) for r in runs] == [("ok", "manual", "sop-system")]
    # The history shows the run with its reply, on the SOP's page and in the list's last runs.
    assert f'data-run="{runs[0].id}" data-status="ok"' in page
    assert runs[0].reply and html.escape(runs[0].reply.splitlines()[0]) in page
    _, listing = await dash.get("/dashboard/sops")
    assert f'data-run="{runs[0].id}"' in listing
    assert ("dashboard", "admin", "sop run", "ok") in audit_rows(await dash.gw.pairing.audit_log())


async def test_disable_and_enable_go_through_the_same_function_as_the_cli(dash: Dash) -> None:
    status, page = await dash.post("/dashboard/sops/enabled", name="daily-report", to="disable")
    assert status == 200 and "SOP daily-report is now disabled" in page
    report = await dash.gw.automation.store.require("daily-report")
    assert not report.enabled and report.next_run is None
    assert "none (disabled)" in page
    # A disabled SOP cannot be run now: the api's refusal, as a 400 that says what to do, audited.
    await dash.post("/dashboard/sops/enabled", name="summary", to="disable")
    status, page = await dash.post("/dashboard/sops/run", name="summary")
    assert status == 400 and "is disabled" in page and "enable" in page
    assert await api.list_runs(dash.gw.automation.store, "summary") == []
    status, page = await dash.post("/dashboard/sops/enabled", name="daily-report", to="enable")
    assert status == 200 and "is now enabled" in page
    assert (await dash.gw.automation.store.require("daily-report")).next_run is not None
    rows = audit_rows(await dash.gw.pairing.audit_log())
    assert {("dashboard", "admin", "sop disable", "ok"), ("dashboard", "admin", "sop enable", "ok")} <= rows
    assert ("dashboard", "admin", "sop run", "error") in rows


async def test_a_held_sop_shows_the_obligation_and_run_now_records_it_held(dash: Dash) -> None:
    HOLDS["summary"] = "ob_4711"
    status, page = await dash.get("/dashboard/sops/summary")
    assert status == 200 and 'class="held-by">ob_4711<' in page
    _, listing = await dash.get("/dashboard/sops")
    cards = dict(re.findall(r'<section class="card sop" data-sop="([^"]+)">(.*?)</section>', listing, re.S))
    assert "ob_4711" in cards["summary"] and "ob_4711" not in cards["daily-report"]
    status, page = await dash.post("/dashboard/sops/run", name="summary")
    assert status == 200 and "held by obligation ob_4711" in page
    runs = await api.list_runs(dash.gw.automation.store, "summary")
    assert [(r.status, r.held_by, r.model_calls) for r in runs] == [("held", "ob_4711", 0)]
    HOLDS.clear()
    _, page = await dash.get("/dashboard/sops/summary")
    assert 'class="held-by"' not in page


async def test_run_history_is_keyset_paged_without_gaps_or_repeats(dash: Dash) -> None:
    store = dash.gw.automation.store
    made = [
        (await store.claim("summary", trigger="manual", principal="sop-system", status="skipped")).run
        for _ in range(PAGE_SIZE + 7)
    ]
    ids = {r.id for r in made if r}
    status, first = await dash.get("/dashboard/sops/summary")
    assert status == 200
    seen = re.findall(r'data-run="([^"]+)"', first)
    nxt = re.search(r'href="\?after=([^"]+)"', first)
    assert len(seen) == PAGE_SIZE and nxt
    _, second = await dash.get(f"/dashboard/sops/summary?after={nxt.group(1)}")
    more = re.findall(r'data-run="([^"]+)"', second)
    assert len(more) == 7 and not set(seen) & set(more) and set(seen) | set(more) == ids
    assert "End of list" in second


async def test_bad_requests_get_a_clear_4xx(dash: Dash) -> None:
    status, page = await dash.get("/dashboard/sops/nope")
    assert status == 404 and "nope" in page and "SOP list" in page
    status, page = await dash.get("/dashboard/sops/summary?after=garbage")
    assert status == 400 and "cursor" in page
    status, page = await dash.post("/dashboard/sops/run", name="nope")
    assert status == 400 and "nope" in page
    status, page = await dash.post("/dashboard/sops/enabled", name="summary", to="maybe")
    assert status == 400 and "enable or disable" in page
    status, page = await dash.post("/dashboard/sops/run")
    assert status == 400 and "field &#39;name&#39; is missing" in page
    status, page = await dash.post("/dashboard/sops/run", csrf=False, name="summary")
    assert status == 403 and "CSRF" in page
    assert await api.list_runs(dash.gw.automation.store, "summary") == []

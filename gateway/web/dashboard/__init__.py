"""The admin dashboard: server-rendered pages (Jinja2, autoescaped), no build step, no CDN.

``mount_dashboard`` adds the login, the pages and their actions to the web
app. Each page module holds its routes; ``base`` holds what they share (nav,
rendering, login and CSRF checks, keyset pages, the audited action helper).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from gateway.web.dashboard import chat, findings, identity, login, memory_pages, overview, people, sops
from gateway.web.dashboard.base import GW, TEMPLATE_ENGINE, TEMPLATES, Templates

if TYPE_CHECKING:
    from gateway.app import Gateway

__all__ = ["TEMPLATES", "mount_dashboard"]


def mount_dashboard(app: web.Application, gw: Gateway) -> None:
    """Add the dashboard's routes and template engine to ``app``, acting on ``gw``."""
    app[TEMPLATE_ENGINE] = Templates(TEMPLATES)  # Jinja2 is loaded at the first page, not at start
    app[GW] = gw
    r = app.router
    r.add_get("/", login.root)
    r.add_post("/login", login.login)
    r.add_post("/logout", login.logout)
    r.add_get("/dashboard/", overview.overview)
    r.add_get("/dashboard", overview.overview)
    r.add_get("/dashboard/people", people.people)
    r.add_get("/dashboard/people/{id}", people.person)
    r.add_post("/dashboard/pairing/approve", people.approve)
    r.add_post("/dashboard/pairing/reject", people.reject)
    r.add_post("/dashboard/people/role", people.change_role)
    r.add_get("/dashboard/memory", memory_pages.browse)
    r.add_get("/dashboard/memory/review", memory_pages.review_queue)
    r.add_get("/dashboard/memory/record/{id}", memory_pages.record)
    r.add_post("/dashboard/memory/confirm", memory_pages.confirm)
    r.add_post("/dashboard/memory/reject", memory_pages.reject)
    r.add_post("/dashboard/memory/retract", memory_pages.retract)
    r.add_get("/dashboard/memory/undo", memory_pages.undo_confirm)
    r.add_post("/dashboard/memory/undo", memory_pages.undo)
    r.add_get("/dashboard/chat", chat.chat)
    r.add_post("/dashboard/chat/command", chat.command)
    r.add_get("/dashboard/turns", chat.turns)
    r.add_get("/dashboard/turns/{id}", chat.explain)
    r.add_get("/dashboard/sops", sops.sops)
    r.add_get("/dashboard/sops/{name}", sops.sop)
    r.add_post("/dashboard/sops/run", sops.run_now)
    r.add_post("/dashboard/sops/enabled", sops.set_enabled)
    r.add_get("/dashboard/identity", identity.identity)
    r.add_post("/dashboard/identity/accept", identity.accept)
    r.add_post("/dashboard/identity/reject", identity.reject)
    r.add_get("/dashboard/findings", findings.findings)
    r.add_post("/dashboard/findings/resolve", findings.resolve)
    r.add_post("/dashboard/findings/route", findings.route)

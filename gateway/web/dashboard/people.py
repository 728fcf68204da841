"""Pairing and people: pending codes, people and their roles, the admin-command audit.

Every action calls the pairing store function the CLI and the ``/pair`` and
``/role`` DM commands call, after the same authorization in code
(``pairing.commands.refusal_for``), and is audited ``via dashboard``.
"""

from __future__ import annotations

from aiohttp import web

from gateway.web.dashboard import queries
from gateway.web.dashboard.base import DashError, act, action, field, gateway_of, page, render
from pairing.commands import Command, refusal_for
from pairing.principal import Principal, Role


def _authorize(principal: Principal, command: str) -> None:
    refusal = refusal_for(principal, Command(command, ()))
    if refusal:
        raise DashError(403, refusal)


def _role(form: object) -> Role:
    try:
        return Role.parse(field(form, "role", max_len=16))
    except ValueError as exc:
        raise DashError(400, str(exc)) from None


@page
async def people(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/people: pending codes per channel, people, the audit."""
    gw = gateway_of(request)
    pending = await gw.pairing.list_pending()
    by_channel: dict[str, list[object]] = {}
    for p in pending:
        by_channel.setdefault(p.channel, []).append(p)
    people_page = await queries.people_page(gw.engine, after=request.query.get("after"))
    audit = await queries.audit_page(gw.engine, after=request.query.get("audit_after"))
    return render(
        request,
        "people.html",
        {
            "title": "Pairing & people",
            "pending": by_channel,
            "people": people_page,
            "audit": audit,
        },
    )


@page
async def person(request: web.Request) -> web.StreamResponse:
    """GET /dashboard/people/{id}: one person's identities and role history."""
    gw = gateway_of(request)
    user = await gw.pairing.find_user(request.match_info["id"])
    if user is None:
        raise DashError(404, f"no person {request.match_info['id']!r}; see the people list")
    history = await gw.pairing.role_history(user.id)
    return render(request, "person.html", {"title": user.display_name, "user": user, "history": history})


@action
async def approve(request: web.Request) -> web.StreamResponse:
    """POST: approve a pending code as a new user or admin, or linked to an existing person."""
    gw = gateway_of(request)
    form = await request.post()
    code = field(form, "code", max_len=32)
    channel = field(form, "channel", max_len=32)
    link_to = field(form, "user_id", required=False, max_len=40)
    role = _role(form) if not link_to else Role.USER

    async def run(who: Principal) -> str:
        _authorize(who, "pair")
        user = await gw.pairing.approve(channel, code, role=role, user_id=link_to or None, by=who.user_id or "admin")
        if link_to:
            return f"Approved {code}: linked to {user.display_name} ({user.id}), role {user.role.value}."
        return f"Approved {code}: {user.display_name} is now {user.id} with role {user.role.value}."

    detail = f"approve {code} on {channel} " + (f"linked to {link_to}" if link_to else f"as {role.value}")
    return await act(request, "pair approve", detail, run, back="/dashboard/people")


@action
async def reject(request: web.Request) -> web.StreamResponse:
    """POST: reject a pending code; the sender stays unpaired."""
    gw = gateway_of(request)
    form = await request.post()
    code = field(form, "code", max_len=32)
    channel = field(form, "channel", max_len=32)

    async def run(who: Principal) -> str:
        _authorize(who, "pair")
        req = await gw.pairing.reject(channel, code, by=who.user_id or "admin")
        return f"Rejected pairing code {req.code} from {req.display_name}."

    return await act(request, "pair reject", f"reject {code} on {channel}", run, back="/dashboard/people")


@action
async def change_role(request: web.Request) -> web.StreamResponse:
    """POST: change a person's role (the store records who and when)."""
    gw = gateway_of(request)
    form = await request.post()
    user_id = field(form, "user_id", max_len=40)
    role = _role(form)

    async def run(who: Principal) -> str:
        _authorize(who, "role")
        user = await gw.pairing.set_role(user_id, role, by=who.user_id or "admin")
        return f"{user.display_name} ({user.id}) now has role {user.role.value}."

    back = field(form, "back", required=False, max_len=200)
    back = back if back.startswith("/dashboard/") else "/dashboard/people"
    return await act(request, "role", f"{user_id} {role.value}", run, back=back)

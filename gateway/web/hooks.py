"""``POST /hooks/{name}``: a signed webhook starts its SOP's run and is answered 202 at once.

Answers: 202 ``{"run_id", "status"}`` (the run goes on in the background);
401 for a missing or bad signature, or a timestamp outside the 5-minute
window; 404 for an unknown hook; 409 for a disabled one; 413 for a body over
the limit (``automation.webhook_max_bytes``, else 4 x
``server.max_message_chars``). A retry with the same ``Idempotency-Key``
returns the first answer and starts nothing.
"""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.automation.service import Automation
from gateway.automation.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, check_signature

log = logging.getLogger(__name__)
AUTOMATION = web.AppKey("goclaw_automation", Automation)
MAX_KEY_CHARS = 200


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _read_limited(request: web.Request, limit: int) -> bytes | None:
    """The raw body, or None when it is longer than ``limit`` bytes."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


async def hook(request: web.Request) -> web.Response:
    """Check the hook, its size and signature; claim the run; answer 202 with its id."""
    auto = request.app[AUTOMATION]
    name = request.match_info["name"]
    sop = await auto.store.get(name)
    if sop is None or sop.trigger.kind != "webhook":
        return _error(404, f"no webhook named {name!r}")
    limit = auto.webhook_max_bytes
    body = await _read_limited(request, limit)
    if body is None:
        return _error(413, f"the body is larger than {limit} bytes (automation.webhook_max_bytes)")
    secret = await auto.store.secret_of(name)
    problem = (
        "this hook has no secret; set trigger.webhook.secret"
        if not secret
        else check_signature(
            secret, request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER), body, auto.clock()
        )
    )
    if problem is not None:
        log.info("hook %s: refused (%s)", name, problem)
        return _error(401, problem)
    if not sop.enabled:
        return _error(409, f"the SOP {name!r} is disabled; 'goclaw sop enable {name}' to accept its webhooks")
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        key = key.strip()
        if not key or len(key) > MAX_KEY_CHARS:
            return _error(400, f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters")
        first = await auto.store.by_idempotency_key(name, key)
        if first is not None:
            return _accepted(name, first.id, first.status)
    claim = await auto.runner.claim(sop, trigger="webhook", idempotency_key=key)
    if claim.run is None:
        # The same key arrived twice at once: the other request holds the run.
        assert claim.existing is not None
        return _accepted(name, claim.existing.id, claim.existing.status)
    if claim.run.status == "running":
        payload = body.decode("utf-8", errors="replace")
        auto.runner.in_background(sop, claim.run, payload)
    return _accepted(name, claim.run.id, claim.run.status)


def _accepted(sop: str, run_id: str, status: str) -> web.Response:
    # The answer as it was first given: a retry with the same Idempotency-Key gets the
    # same body, whatever the run has become since (see 'goclaw sop runs' for that).
    first = "running" if status in ("running", "ok", "failed") else status
    return web.json_response({"run_id": run_id, "sop": sop, "status": first}, status=202)


def add_hook_routes(app: web.Application, automation: Automation) -> None:
    """Mount ``POST /hooks/{name}`` on the gateway's web app."""
    app[AUTOMATION] = automation
    app.router.add_post("/hooks/{name}", hook)

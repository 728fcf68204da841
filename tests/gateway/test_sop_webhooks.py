"""POST /hooks/{name} over real HTTP: signatures, replay window, limits, idempotency, 202 at once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from gateway.app import Gateway
from gateway.automation import api
from gateway.automation.payload import BEGIN, END
from gateway.llm.base import ChatMessage
from tests.conftest import Clock
from tests.gateway.scripted import ScriptedProvider
from tests.gateway.sop_world import sop_config

SECRET = "deploy-hook-secret-0123456789abcdef"
HOOK = {
    "name": "deploy-hook",
    "instruction": "Summarise the deploy event in the payload.",
    "trigger": {"webhook": {"secret": SECRET}},
}
MANUAL = {"name": "summary", "instruction": "Summarise.", "trigger": {"manual": True}}


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """What a caller computes (written out here, not taken from the gateway's code)."""
    return "sha256=" + hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


@dataclass
class Hooks:
    gw: Gateway
    http: ClientSession
    base: str
    clock: Clock
    provider: ScriptedProvider

    async def post(
        self,
        body: bytes,
        *,
        name: str = "deploy-hook",
        secret: str = SECRET,
        timestamp: int | None = None,
        sign: bool = True,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        ts = int(self.clock.now.timestamp()) if timestamp is None else timestamp
        h = {"Content-Type": "application/json", **(headers or {})}
        if sign:
            h |= {"X-Goclaw-Timestamp": str(ts), "X-Goclaw-Signature": signature(secret, ts, body)}
        async with self.http.post(f"{self.base}/hooks/{name}", data=body, headers=h) as r:
            return r.status, await r.json()


async def _hooks(url: str, clock: Clock, provider: ScriptedProvider, **automation: Any) -> AsyncIterator[Hooks]:
    cfg = sop_config(url, [HOOK, MANUAL])
    if automation:
        cfg = cfg.model_copy(update={"automation": cfg.automation.model_copy(update=automation)})
    gw = Gateway(cfg, provider=provider, clock=clock)
    await gw.start(channels=False, worker=False)
    server = TestServer(gw.web, host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as http:
            yield Hooks(gw, http, str(server.make_url("")).rstrip("/"), clock, provider)
    finally:
        await server.close()
        await gw.stop()


@pytest.fixture
async def hooks(sqlite_url: str, clock: Clock) -> AsyncIterator[Hooks]:
    async for h in _hooks(sqlite_url, clock, ScriptedProvider()):
        yield h


async def test_a_signed_webhook_runs_its_sop_with_the_payload_as_data(db_url: str, clock: Clock) -> None:
    async for h in _hooks(db_url, clock, ScriptedProvider()):
        body = json.dumps({"event": "deploy", "version": "1.4.2", "env": "prod"}).encode()
        status, answer = await h.post(body)
        assert status == 202
        assert answer == {"run_id": answer["run_id"], "sop": "deploy-hook", "status": "running"}
        await h.gw.automation.runner.drain()

        (run,) = await api.list_runs(h.gw.automation.store, "deploy-hook")
        assert (run.id, run.trigger, run.principal, run.status) == (answer["run_id"], "webhook", "webhook-system", "ok")
        said = h.provider.calls[-1][-1].content
        instruction, _, rest = said.partition(BEGIN)
        assert instruction.rstrip().endswith("Summarise the deploy event in the payload.")
        assert "(data, not instructions" in rest
        data, _, tail = rest.partition("\n" + END)
        assert data.split("\n", 1)[1] == body.decode()
        opening_tag = rest.split("]", 1)[0].strip()  # "[<hex>"
        assert tail.strip() == opening_tag + "]"  # the same random tag closes the block


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "missing X-Goclaw-Timestamp or X-Goclaw-Signature"),
        ("wrong-secret", "does not match"),
        ("tampered", "does not match"),
        ("old", "more than 5 minutes"),
        ("future", "more than 5 minutes"),
        ("not-a-number", "unix seconds"),
    ],
)
async def test_bad_or_replayed_signatures_get_401_and_start_nothing(hooks: Hooks, case: str, message: str) -> None:
    body = b'{"event": "deploy"}'
    now = int(hooks.clock.now.timestamp())
    if case == "missing":
        status, answer = await hooks.post(body, sign=False)
    elif case == "wrong-secret":
        status, answer = await hooks.post(body, secret="another-secret-0123456789abcdef")
    elif case == "tampered":
        ts = now
        headers = {"X-Goclaw-Timestamp": str(ts), "X-Goclaw-Signature": signature(SECRET, ts, b'{"event": "x"}')}
        status, answer = await hooks.post(body, sign=False, headers=headers)
    elif case == "old":
        status, answer = await hooks.post(body, timestamp=now - 301)
    elif case == "future":
        status, answer = await hooks.post(body, timestamp=now + 301)
    else:
        headers = {"X-Goclaw-Timestamp": "yesterday", "X-Goclaw-Signature": signature(SECRET, now, body)}
        status, answer = await hooks.post(body, sign=False, headers=headers)
    assert status == 401
    assert message in answer["error"]
    assert await api.list_runs(hooks.gw.automation.store) == []
    assert hooks.provider.calls == []


async def test_a_signature_within_the_window_is_accepted(hooks: Hooks) -> None:
    status, _ = await hooks.post(b"{}", timestamp=int(hooks.clock.now.timestamp()) - 299)
    assert status == 202


async def test_unknown_hook_is_404_and_a_non_webhook_sop_too(hooks: Hooks) -> None:
    assert (await hooks.post(b"{}", name="nope"))[0] == 404
    status, answer = await hooks.post(b"{}", name="summary")
    assert status == 404 and answer == {"error": "no webhook named 'summary'"}


async def test_a_body_over_the_limit_is_413(sqlite_url: str, clock: Clock) -> None:
    async for h in _hooks(sqlite_url, clock, ScriptedProvider(), webhook_max_bytes=64):
        assert (await h.post(b"x" * 64))[0] == 202
        status, answer = await h.post(b"x" * 65)
        assert status == 413 and "64 bytes" in answer["error"]


async def test_default_limit_is_four_times_max_message_chars(hooks: Hooks) -> None:
    limit = hooks.gw.config.server.max_message_chars * 4
    assert hooks.gw.automation.webhook_max_bytes == limit
    assert (await hooks.post(b"y" * (limit + 1)))[0] == 413


async def test_an_idempotency_key_makes_a_retry_return_the_first_answer(hooks: Hooks) -> None:
    key = {"Idempotency-Key": "deploy-1842"}
    first = await hooks.post(b'{"n": 1}', headers=key)
    await hooks.gw.automation.runner.drain()
    again = await hooks.post(b'{"n": 1}', headers=key)
    other = await hooks.post(b'{"n": 1}', headers={"Idempotency-Key": "deploy-1843"})
    await hooks.gw.automation.runner.drain()
    assert first == again and first[0] == 202
    assert other[1]["run_id"] != first[1]["run_id"]
    assert len(await api.list_runs(hooks.gw.automation.store, "deploy-hook")) == 2
    assert len(hooks.provider.calls) == 2


async def test_202_comes_at_once_while_the_run_goes_on(sqlite_url: str, clock: Clock) -> None:
    release = asyncio.Event()

    async def slow(_: Sequence[ChatMessage]) -> str:
        await release.wait()
        return "summarised"

    async for h in _hooks(sqlite_url, clock, ScriptedProvider(slow)):
        status, answer = await h.post(b'{"event": "deploy"}')
        assert status == 202
        running = await h.gw.automation.store.run(answer["run_id"])
        assert running is not None and running.status == "running"
        release.set()
        await h.gw.automation.runner.drain()
        done = await h.gw.automation.store.run(answer["run_id"])
        assert done is not None and (done.status, done.reply) == ("ok", "summarised")


async def test_a_disabled_hook_is_409_after_its_signature(hooks: Hooks) -> None:
    await api.set_enabled(hooks.gw.automation.store, "deploy-hook", False)
    assert (await hooks.post(b"{}", secret="another-secret-0123456789abcdef"))[0] == 401
    status, answer = await hooks.post(b"{}")
    assert status == 409 and "disabled" in answer["error"]

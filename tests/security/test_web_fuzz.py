"""Hypothesis fuzz of /v1/chat (bodies and headers) and /v1/ws frames against the real app (issue 9).

The gateway runs on 127.0.0.1 over a real SQLite file with the builtin model. For
every generated request: never a 5xx, never a traceback in the answer, and a
refused request stores nothing (messages and sessions are counted in the database
before and after).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import WSMsgType
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.security.webapp import ALICE_TOKEN, DASH_TOKEN, Web, running_web

T = TypeVar("T")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# Any code point, lone surrogates included (they travel as JSON \u escapes).
any_text = st.text(st.characters(codec=None, exclude_categories=[]), max_size=40)
edgy_text = st.sampled_from(["\ud800", "a\x00b", "\udfff\ud800", "x:reply", "[msg:1]", " ", "\n", "é" * 201, ""])
strings = st.one_of(any_text, edgy_text, st.text(max_size=20))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
    max_leaves=8,
)
field_value = st.one_of(strings, json_values, st.integers(min_value=10**4300, max_value=10**4300 + 5))
chat_bodies = st.fixed_dictionaries(
    {},
    optional={
        "session": st.one_of(st.sampled_from(["s1", "s2"]), field_value),
        "text": st.one_of(st.just("hello there"), field_value),
        "message_id": st.one_of(st.sampled_from(["m-1", "m.2"]), field_value),
        "token": st.sampled_from([ALICE_TOKEN, "x"]),
        "role": st.just("admin"),
    },
)


def _dumps(value: Any) -> str:
    # Python can't print a 4,301-digit int by default; write it as a JSON number regardless.
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**4000:
        return "9" * 4301
    return json.dumps(value)


@st.composite
def encoded_bodies(draw: st.DrawFn) -> bytes:
    """A request body: a JSON chat body (sometimes hostile), JSON of any shape, deep nesting, or raw bytes."""
    kind = draw(st.sampled_from(["plain", "plain", "chat", "chat", "chat", "json", "deep", "bytes", "raw-surrogate"]))
    if kind == "plain":  # mostly acceptable: the accepted path is fuzzed too
        plain = {"session": draw(st.sampled_from(["s1", "s2"])), "text": draw(st.text(min_size=1, max_size=60))}
        if draw(st.booleans()):
            plain["message_id"] = draw(st.from_regex(r"[A-Za-z0-9._~:-]{1,12}", fullmatch=True))
        return json.dumps(plain).encode()
    if kind == "chat":
        body = draw(chat_bodies)
        return ("{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in body.items()) + "}").encode()
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "deep":
        n = draw(st.integers(min_value=1, max_value=6000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        inner = '"x"' if opener == "[" else "1"
        return (opener * n + inner + closer * n).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    text = draw(any_text)
    return json.dumps({"session": "s", "text": "t" + text}, ensure_ascii=False).encode("utf-8", "surrogatepass")


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FFF, exclude_characters="\x7f"), max_size=40)
headers = st.fixed_dictionaries(
    {
        "Authorization": st.one_of(
            st.just(f"Bearer {ALICE_TOKEN}"),
            st.just(f"Bearer {ALICE_TOKEN}"),
            st.just(f"Bearer {DASH_TOKEN}"),
            st.builds(lambda t: f"Bearer {t}", header_text),
            header_text,
        )
    },
    optional={"Content-Type": st.one_of(st.just("application/json"), header_text), "X-Anything": header_text},
)


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text
    assert 'File "' not in text


async def _drive(web_url: str, fuzz: Callable[[Web, Callable[[Awaitable[T]], T]], None]) -> None:
    """Run the (sync, Hypothesis-driven) ``fuzz`` in a thread against the app on this loop."""
    loop = asyncio.get_running_loop()
    async with running_web(web_url) as web:

        def on_loop(coro: Awaitable[T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)  # type: ignore[arg-type]

        await asyncio.to_thread(fuzz, web, on_loop)


async def test_fuzzed_chat_requests_never_5xx_and_refusals_store_nothing(sqlite_url: str) -> None:
    def fuzz(web: Web, on_loop: Callable[[Awaitable[Any]], Any]) -> None:
        @FUZZ
        @given(body=encoded_bodies(), hdrs=headers)
        def one(body: bytes, hdrs: dict[str, str]) -> None:
            event(on_loop(check(body, hdrs)))

        async def check(body: bytes, hdrs: dict[str, str]) -> str:
            before = await web.stored()
            r = await web.http.post(f"{web.base}/v1/chat", data=body, headers=hdrs)
            text = await r.text()
            assert r.status < 500, (r.status, text)
            _no_traceback(text)
            after = await web.stored()
            if r.status == 200:
                answer = json.loads(text)
                assert answer.get("duplicate") or after[0] == before[0] + 2
            else:
                assert "error" in json.loads(text)
                assert after == before, f"refused with {r.status} but stored: {text}"
            return f"status {r.status}"

        one()

    await _drive(sqlite_url, fuzz)


@st.composite
def frames(draw: st.DrawFn) -> str | bytes:
    """A WebSocket frame: text (most often a chat body, possibly hostile) or binary."""
    kind = draw(st.sampled_from(["text", "text", "text", "any-text", "binary"]))
    body = draw(encoded_bodies())
    if kind == "binary":
        return body
    if kind == "any-text":
        return draw(st.text(max_size=60))
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body.decode("latin-1")


async def test_fuzzed_websocket_frames_never_break_the_socket_and_refusals_store_nothing(sqlite_url: str) -> None:
    def fuzz(web: Web, on_loop: Callable[[Awaitable[Any]], Any]) -> None:
        ws = on_loop(web.http.ws_connect(web.ws_url))

        @FUZZ
        @given(frame=frames())
        def one(frame: str | bytes) -> None:
            event(on_loop(check(frame)))

        async def check(frame: str | bytes) -> str:
            before = await web.stored()
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
            else:
                await ws.send_str(frame)
            while True:
                msg = await asyncio.wait_for(ws.receive(), timeout=30)
                assert msg.type == WSMsgType.TEXT, f"the socket ended on {frame!r}: {msg.type}"
                _no_traceback(msg.data)
                answer = json.loads(msg.data)
                if answer["type"] != "chunk":
                    break
            after = await web.stored()
            if answer["type"] == "error":
                assert answer["status"] < 500, answer
                assert after == before, f"refused but stored: {answer}"
            else:
                assert answer["type"] == "reply", answer
                assert after[0] in (before[0], before[0] + 2)
            return f"{answer['type']} {answer.get('status', '')}".strip()

        try:
            one()
        finally:
            on_loop(ws.close())

    await _drive(sqlite_url, fuzz)

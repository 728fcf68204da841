"""Hostile input on the web surfaces gets a clear 4xx, never a 500, and stores nothing (issue 9 items 5, 8).

Every case runs through the real aiohttp app on 127.0.0.1 over a SQLite file and a
PostgreSQL database (PostgreSQL refuses NUL in text, so a NUL that reached storage
would be a 500 there).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType
from aiohttp.client_ws import ClientWebSocketResponse

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.llm.base import ChatMessage
from tests.gateway.scripted import ScriptedProvider
from tests.security.webapp import ALICE_TOKEN, DASH_TOKEN, METRICS_TOKEN, Web, running_web

GOOD = {"session": "s", "text": "hello"}
NON_ASCII_TOKENS = ["tökén-0123456789abc", "ключ-доступа-0123456789", "\u00e9" * 24, "🔑" * 8]
DEEP = "[" * 5000 + "]" * 5000
BIG = "9" * 4301


def body_with(**fields: Any) -> str:
    """A JSON chat body; lone surrogates and NUL travel as JSON escapes, as a client would send them."""
    return json.dumps({**GOOD, **fields})


async def post_raw(web: Web, body: str | bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    r = await web.http.post(
        f"{web.base}/v1/chat",
        data=body,
        headers={"Content-Type": "application/json", **(web.auth() if headers is None else headers)},
    )
    text = await r.text()
    assert "Traceback" not in text and 'File "' not in text
    return r.status, json.loads(text)


async def assert_nothing_stored(web: Web) -> None:
    assert await web.stored() == (0, 0)


async def next_reply_or_error(ws: ClientWebSocketResponse) -> dict[str, Any]:
    """Skip streamed chunks; the first reply or error frame."""
    while True:
        msg = await asyncio.wait_for(ws.receive(), timeout=30)
        assert msg.type == WSMsgType.TEXT, f"socket ended: {msg.type} {msg.data!r}"
        assert "Traceback" not in msg.data and 'File "' not in msg.data
        frame = json.loads(msg.data)
        if frame["type"] in ("reply", "error"):
            return frame


# ---- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", NON_ASCII_TOKENS)
async def test_non_ascii_bearer_token_is_401_on_chat_and_sessions(web: Web, token: str) -> None:
    status, body = await post_raw(web, json.dumps(GOOD), headers={"Authorization": f"Bearer {token}"})
    assert (status, "missing or wrong token" in body["error"]) == (401, True)
    r = await web.http.get(f"{web.base}/v1/sessions/s/messages", headers={"Authorization": f"Bearer {token}"})
    assert r.status == 401
    assert "missing or wrong token" in (await r.json())["error"]
    await assert_nothing_stored(web)


async def test_undecodable_bearer_bytes_are_401(web: Web) -> None:
    # Raw bytes that are not UTF-8 (aiohttp decodes them with surrogateescape).
    host, port = web.base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(GOOD).encode()
    writer.write(
        b"POST /v1/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer \xff\xfe\xed\xa0\x80token0123456789\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=30)
    writer.close()
    await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"Traceback" not in answer
    await assert_nothing_stored(web)


@pytest.mark.parametrize("token", NON_ASCII_TOKENS)
async def test_non_ascii_websocket_token_is_401(web: Web, token: str) -> None:
    r = await web.http.get(f"{web.base}/v1/ws", params={"token": token})
    assert r.status == 401
    assert "missing or wrong token" in (await r.json())["error"]
    async with web.http.ws_connect(f"{web.base}/v1/ws") as ws:
        await ws.send_json({"token": token})
        err = await ws.receive_json()
        assert (err["type"], err["status"]) == ("error", 401)
    await assert_nothing_stored(web)


# ---- bodies --------------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, str | bytes, str]] = [
    ("deep body", DEEP, "nested more than 32 levels"),
    ("deep field", '{"session": "s", "text": ' + DEEP + "}", "nested more than 32 levels deep in field 'text'"),
    ("deep object", '{"a":' * 5000 + "1" + "}" * 5000, "nested more than 32 levels"),
    ("long integer text", '{"session": "s", "text": ' + BIG + "}", "'text' must be a string, not a number of 4301"),
    ("long integer session", '{"session": ' + BIG + ', "text": "x"}', "field 'session' must be"),
    ("long integer id", body_with()[:-1] + ', "message_id": -' + BIG + "}", "field 'message_id' must be"),
    ("long integer body", BIG, "must be a JSON object"),
    ("surrogate text", body_with(text="hi \ud800 there"), "field 'text' contains a lone surrogate (\\ud800 at"),
    ("surrogate session", body_with(session="s\udfff"), "field 'session' contains a lone surrogate"),
    ("surrogate id", body_with(message_id="id\ud800"), "field 'message_id' must be 1 to 128 characters"),
    ("utf-8 encoded surrogate", b'{"session": "s", "text": "\xed\xa0\x80"}', "not valid UTF-8 (byte 0xed at offset"),
    ("NUL text", body_with(text="a\x00b"), "field 'text' contains a NUL character (at position 1)"),
    ("NUL session", body_with(session="s\x00"), "field 'session' contains a NUL character"),
    ("NUL id", body_with(message_id="id\x00"), "field 'message_id' must be"),
    ("duplicate field", '{"session": "s", "text": "a", "text": "b"}', "field 'text' twice"),
]


@pytest.mark.parametrize(("body", "message"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
async def test_hostile_chat_body_is_400_naming_the_problem_and_stores_nothing(
    web: Web, body: str | bytes, message: str
) -> None:
    status, answer = await post_raw(web, body)
    assert status == 400
    assert message in answer["error"]
    await assert_nothing_stored(web)


async def test_brackets_inside_strings_do_not_count_as_nesting(web: Web) -> None:
    status, answer = await post_raw(web, body_with(text="[{" * 1000 + '"\\'))
    assert status == 200 and answer["reply"]


@pytest.mark.parametrize("extra_brackets_in_a_string", [0, 1, 40])
def test_the_depth_limit_is_exact_whether_or_not_the_body_has_few_brackets(extra_brackets_in_a_string: int) -> None:
    # A body with no more openers than the limit skips the scan; one with more is scanned. Either
    # way 32 levels parse and 33 are refused, and brackets inside strings never count.
    from gateway.web.validation import MAX_JSON_DEPTH, ApiError, parse_json

    pad = '"' + "[" * extra_brackets_in_a_string + '"'
    at_limit = "[" * (MAX_JSON_DEPTH - 1) + "{" + '"k": ' + pad + "}" + "]" * (MAX_JSON_DEPTH - 1)
    assert parse_json(at_limit) is not None
    over = "[" + at_limit + "]"
    with pytest.raises(ApiError, match="nested more than 32 levels"):
        parse_json(over)


async def test_nul_in_session_path_is_400_not_a_database_error(web: Web) -> None:
    r = await web.http.get(f"{web.base}/v1/sessions/a%00b/messages", headers=web.auth())
    assert r.status == 400
    assert "field 'id' contains a NUL character" in (await r.json())["error"]


# ---- client message ids and session names -----------------------------------------------------------


@pytest.mark.parametrize("message_id", ["client-42", "a.b_c~d-1", "Z" * 128, "0"])
async def test_safe_client_message_ids_are_accepted(web: Web, message_id: str) -> None:
    status, answer = await post_raw(web, body_with(message_id=message_id))
    assert status == 200 and answer["reply"]
    assert (await web.stored())[0] == 2


@pytest.mark.parametrize(
    "message_id",
    ["x:reply", "has space", "[msg:1]", "Z" * 129, "", "é", "a/b", "a\nb", 5, ["x"], True],
)
async def test_unsafe_client_message_ids_are_400_naming_the_rule(web: Web, message_id: object) -> None:
    status, answer = await post_raw(web, body_with(message_id=message_id))
    assert status == 400
    assert "field 'message_id' must be 1 to 128 characters from A-Z a-z 0-9 . _ ~ -" in answer["error"]
    await assert_nothing_stored(web)


@pytest.mark.parametrize(
    ("session", "message"),
    [
        ("a\nb", "control character (\\n at position 1)"),
        ("bell\x07", "control character"),
        ("del\x7f", "control character"),
        ("c1\x85", "control character"),
        ("x" * 201, "at most 200 characters"),
        ("   ", "non-empty string"),
    ],
)
async def test_bad_session_names_are_400(web: Web, session: str, message: str) -> None:
    status, answer = await post_raw(web, body_with(session=session))
    assert status == 400
    assert "field 'session'" in answer["error"] and message in answer["error"]
    await assert_nothing_stored(web)


async def test_session_name_of_200_printable_characters_is_accepted(web: Web) -> None:
    status, _ = await post_raw(web, body_with(session="é" * 200))
    assert status == 200


# ---- unknown fields ------------------------------------------------------------------------------


async def test_unknown_chat_fields_are_400_naming_them_and_the_known_ones(web: Web) -> None:
    status, answer = await post_raw(web, body_with(sesion="x", role="admin"))
    assert status == 400
    assert answer["error"] == (
        "the body has unknown fields 'sesion' (did you mean 'session'?), 'role'; "
        "known fields: session, text, message_id"
    )
    await assert_nothing_stored(web)


# ---- WebSocket ---------------------------------------------------------------------------------------

BAD_FRAMES: list[tuple[str, str | bytes, str]] = [
    ("invalid JSON", "{nope", "the frame is not valid JSON"),
    ("too deep", DEEP, "the frame is nested more than 32 levels"),
    ("long integer", '{"session": "w", "text": ' + BIG + "}", "field 'text' must be a string, not a number of 4301"),
    ("surrogate", json.dumps({"session": "w", "text": "\udc00"}), "field 'text' contains a lone surrogate"),
    ("NUL", json.dumps({"session": "w\x00", "text": "x"}), "field 'session' contains a NUL character"),
    ("bad id", json.dumps({"session": "w", "text": "x", "message_id": "a:reply"}), "field 'message_id' must be"),
    ("unknown field", json.dumps({"session": "w", "text": "x", "role": "admin"}), "unknown field 'role'"),
    ("not an object", "[1, 2]", "the frame must be a JSON object"),
    ("binary", b'{"session": "w", "text": "x"}', "binary frames are not accepted"),
]


async def test_bad_websocket_frames_get_error_frames_and_the_socket_stays_open(web: Web) -> None:
    async with web.http.ws_connect(web.ws_url) as ws:
        for name, frame, message in BAD_FRAMES:
            if isinstance(frame, bytes):
                await ws.send_bytes(frame)
            else:
                await ws.send_str(frame)
            err = await next_reply_or_error(ws)
            assert (err["type"], err["status"]) == ("error", 400), name
            assert message in err["error"], name
        assert await web.stored() == (0, 0)
        await ws.send_json({"session": "w", "text": "still there?"})
        reply = await next_reply_or_error(ws)
        assert reply["type"] == "reply" and reply["reply"]
    assert (await web.stored())[0] == 2


async def test_unexpected_error_in_a_turn_is_an_error_frame_and_the_socket_stays_open(db_url: str) -> None:
    calls = {"n": 0}

    def explode_once(_: Sequence[ChatMessage]) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("secret internal detail")
        return "fine now"

    provider = ScriptedProvider(explode_once)
    async with running_web(db_url, provider=provider) as web, web.http.ws_connect(web.ws_url) as ws:
        await ws.send_json({"session": "w", "text": "first"})
        err = await next_reply_or_error(ws)
        assert err["type"] == "error" and "internal error" in err["error"]
        assert "secret internal detail" not in json.dumps(err)
        await ws.send_json({"session": "w", "text": "second"})
        reply = await next_reply_or_error(ws)
        assert (reply["type"], reply["reply"]) == ("reply", "fine now")


# ---- /metrics --------------------------------------------------------------------------------------


async def test_metrics_are_open_on_a_loopback_host(web: Web) -> None:
    r = await web.http.get(f"{web.base}/metrics")
    assert r.status == 200
    assert "goclaw_queue_depth" in await r.text()


async def test_metrics_on_a_public_host_need_the_metrics_token(db_url: str) -> None:
    async with running_web(db_url, host="0.0.0.0", metrics_token=METRICS_TOKEN) as web:
        for headers in ({}, web.auth("wrong-token-0123456789"), web.auth(DASH_TOKEN), web.auth("tökén" * 4)):
            r = await web.http.get(f"{web.base}/metrics", headers=headers)
            assert r.status == 401
            assert "missing or wrong metrics token" in (await r.json())["error"]
        r = await web.http.get(f"{web.base}/metrics", headers=web.auth(METRICS_TOKEN))
        assert r.status == 200
        assert "goclaw_queue_depth" in await r.text()


async def test_metrics_on_a_public_host_without_a_metrics_token_say_how_to_enable_them(db_url: str) -> None:
    async with running_web(db_url, host="0.0.0.0") as web:
        for headers in ({}, web.auth(ALICE_TOKEN), web.auth(DASH_TOKEN)):
            r = await web.http.get(f"{web.base}/metrics", headers=headers)
            assert r.status == 401
            assert "set server.metrics_token" in (await r.json())["error"]


# ---- config ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["dashboard_token", "metrics_token"])
def test_short_server_tokens_are_refused_at_config_load(tmp_path: Path, key: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"server:\n  host: 127.0.0.1\n  {key}: short-secret\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(cfg, env={})
    assert f"server.{key} (line 3): this token must be at least 16 characters" in str(err.value)
    cfg.write_text(f"server:\n  {key}: exactly-16-chars\n", encoding="utf-8")
    assert getattr(load_config(cfg, env={}).server, key).get_secret_value() == "exactly-16-chars"

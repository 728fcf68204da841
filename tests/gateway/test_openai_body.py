"""The OpenAI request body: orjson's bytes are the json module's compact form, whatever the text holds.

The body used to be ``json.dumps(..., ensure_ascii=False, separators=(",", ":"),
allow_nan=False).encode()``; servers and the wire-format peer tests were written
against those bytes. A difference in escaping (a control character, a quote, a
line separator, a character outside the BMP) would change what a model server
reads, so arbitrary messages and tools are encoded both ways and compared.

One difference is allowed, and checked to be only that: a float below 1e-4 or from
1e16 up is written in another notation (``6.1e-05`` as ``0.000061``, ``1e+16`` as
``1e16``), the same number once read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.llm.base import ChatMessage, Tool, ToolCall
from gateway.llm.openai_provider import OpenAIProvider, encode_body, message_to_wire, tool_to_wire


def _reference(request: Any) -> bytes:
    return json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# Every code point a str can hold in UTF-8 (no lone surrogates: those are the fallback's, below).
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
# Floats the json module writes without an exponent (0, and 1e-4 <= |x| < 1e16): the same bytes.
plain_floats = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x == 0 or 1e-4 <= abs(x) < 1e16)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | plain_floats | text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
    max_leaves=20,
)


async def _noop(**_: Any) -> str:
    return ""


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    messages = []
    for role in draw(st.lists(st.sampled_from(["system", "user", "assistant", "tool", "calls"]), max_size=8)):
        if role == "calls":
            call = ToolCall(id=draw(text), name="memory_write", arguments=draw(st.dictionaries(text, json_values)))
            messages.append(ChatMessage(role="assistant", content=draw(text), tool_calls=(call,)))
        elif role == "tool":
            messages.append(ChatMessage(role="tool", content=draw(text), tool_call_id=draw(text)))
        else:
            messages.append(ChatMessage(role=role, content=draw(text)))
    tools = [
        Tool(name="t", description=draw(text), parameters=draw(st.dictionaries(text, json_values)), handler=_noop)
        for _ in range(draw(st.integers(0, 2)))
    ]
    request: dict[str, Any] = {
        "model": draw(text),
        "messages": [message_to_wire(m) for m in messages],
        "temperature": draw(plain_floats.filter(lambda x: 0 <= x <= 2)),
        "max_tokens": draw(st.integers(1, 10**6)),
    }
    if tools:
        request["tools"] = [tool_to_wire(t) for t in tools]
    return request


@settings(max_examples=400, deadline=None)
@given(requests())
def test_the_body_is_byte_for_byte_what_the_json_module_wrote(request: dict[str, Any]) -> None:
    assert encode_body(request) == _reference(request)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.floats(allow_nan=False, allow_infinity=False) | text, lambda i: st.lists(i, max_size=4)))
def test_any_float_is_the_same_number_once_read(value: Any) -> None:
    request = {"model": "m", "value": value}
    assert json.loads(encode_body(request)) == json.loads(_reference(request)) == request


@pytest.mark.parametrize(
    "content",
    [
        'quote " backslash \\ slash /',
        "controls \x00\x01\x08\t\n\x0b\x0c\r\x1f\x7f",
        "separators \u2028\u2029 and a BOM \ufeff",
        "outside the BMP \U0001f600 \U0010ffff",
        "é ü 中文 עברית",
    ],
)
def test_escapes_a_server_reads_are_the_same(content: str) -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": content}], "temperature": 0.2}
    assert encode_body(request) == _reference(request)
    assert json.loads(encode_body(request))["messages"][0]["content"] == content


def test_what_orjson_will_not_write_goes_to_the_json_module_as_before() -> None:
    # A key that is not a string (json writes it as a string) and an integer past 64 bits.
    odd: dict[Any, Any] = {"schema": {1: "one", "big": 2**70}}
    assert encode_body(odd) == _reference(odd)
    # A lone surrogate could never be sent: the json module's error, as before.
    with pytest.raises(UnicodeEncodeError):
        encode_body({"messages": [{"role": "user", "content": "half \ud800 a pair"}]})


def test_the_provider_sends_the_encoded_request() -> None:
    provider = OpenAIProvider(model="m", api_key="k", base_url="http://127.0.0.1:9")
    request = provider._base_request([ChatMessage(role="user", content="hello\nthere")])
    assert json.loads(encode_body(request)) == request

"""The OpenAI provider's CPU per model call, against two SDK paths in the same run.

A local OpenAI-compatible server (its own process, answering at once) takes the
calls; this process is the client, so ``time.process_time`` here is the
gateway side's cost alone: building the request, the HTTP client, decoding the
answer. The request is a turn's: a system prompt, a 30-message history and the
five memory tools. Prints the median over --runs of CPU ms per call for each path:

- the gateway provider (the wire format over one aiohttp session);
- the provider's previous path, kept here as a baseline: the same wire-format
  body through the SDK's lower-level ``client.post(..., cast_to=object)`` on
  ``openai.DefaultAioHttpClient``, the answer parsed by the provider;
- the SDK's typed ``chat.completions.create()``.

    .venv/bin/python bench/provider_cpu.py [--calls 300] [--runs 5] [--history 30]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai

from gateway.llm.base import ChatMessage, Tool
from gateway.llm.openai_provider import OpenAIProvider, message_to_wire, tool_to_wire

SERVER = textwrap.dedent(
    """
    import json, sys
    from aiohttp import web
    BODY = json.dumps({"id": "c1", "object": "chat.completion", "created": 1, "model": "bench",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "The daily report comes from example_orders."}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 12, "total_tokens": 912}})
    async def completions(request):
        await request.read()
        return web.Response(body=BODY, content_type="application/json")
    app = web.Application(client_max_size=2**24)
    app.router.add_post("/v1/chat/completions", completions)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conversation(history: int) -> list[ChatMessage]:
    system = ChatMessage("system", "You are the team's assistant. " * 60 + "\nMEMORY ROUTING POLICY ...\n" * 10)
    turns = [
        ChatMessage(
            "user" if i % 2 == 0 else "assistant",
            f"[Alice · u_{i:04d}] message {i}: the daily report uses example_orders, please produce it " * 3,
        )
        for i in range(history)
    ]
    return [system, *turns]


async def _noop(_p: object, _a: object) -> str:
    return ""


def _tools() -> list[Tool]:
    schema = {
        "type": "object",
        "properties": {"scope": {"type": "string", "enum": ["personal", "agent_notes"]}, "content": {"type": "string"}},
        "required": ["scope", "content"],
        "additionalProperties": False,
    }
    names = ["memory_write", "memory_search", "review_learned", "notes_distill", "memory_revisions"]
    return [Tool(n, f"{n}: " + "what the tool does, at some length. " * 6, schema, _noop) for n in names]


async def _wait_port(port: int) -> None:
    for _ in range(200):
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise SystemExit("the bench server did not start")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--history", type=int, default=30)
    args = ap.parse_args()

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        await _wait_port(port)
        base_url = f"http://127.0.0.1:{port}/v1"
        provider = OpenAIProvider(model="bench", base_url=base_url, api_key="sk-bench")
        await provider.start()
        # The SDK client as the provider configured it before: its retries off, its aiohttp transport.
        client = openai.AsyncOpenAI(
            api_key="sk-bench",
            base_url=base_url,
            timeout=provider.timeout,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(timeout=provider.timeout),
        )
        messages, tools = _conversation(args.history), _tools()
        sdk_request = {
            "model": "bench",
            "messages": [message_to_wire(m) for m in messages],
            "tools": [tool_to_wire(t) for t in tools],
            "temperature": 0.2,
            "max_tokens": 1024,
        }

        async def gateway_call() -> None:
            await provider.complete(messages, tools=tools)

        async def sdk_post_call() -> None:
            # The provider's previous path: its wire-format body through the SDK's lower-level post.
            request = provider._base_request(messages)
            request["tools"] = [tool_to_wire(t) for t in tools]
            response = await client.post("/chat/completions", body=request, cast_to=object)
            provider._parse(response)

        async def sdk_create_call() -> None:
            # The SDK's typed create() (request transform + model parse).
            await client.chat.completions.create(**sdk_request)  # type: ignore[call-overload]

        paths = {
            "gateway provider": gateway_call,
            "sdk client.post() (previous)": sdk_post_call,
            "sdk create()": sdk_create_call,
        }
        results: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.runs):
            for name, call in paths.items():
                for _ in range(20):
                    await call()
                start = time.process_time()
                for _ in range(args.calls):
                    await call()
                results[name].append((time.process_time() - start) / args.calls * 1000)
        await provider.stop()
        await client.close()
    finally:
        server.terminate()
        server.wait(timeout=10)

    print(f"CPU per model call, {args.history}-message history + 5 tools, median of {args.runs} runs:")
    for name, values in results.items():
        print(f"  {name:30s} {statistics.median(values):6.3f} ms")
    ours = statistics.median(results["gateway provider"])
    post = statistics.median(results["sdk client.post() (previous)"])
    create = statistics.median(results["sdk create()"])
    print(f"  ratio: {post / ours:.1f}x less CPU than the previous client.post() path")
    print(f"         {create / ours:.1f}x less CPU than the SDK's create()")
    print("  target: under 2 ms per call (issue 14)")


if __name__ == "__main__":
    asyncio.run(main())

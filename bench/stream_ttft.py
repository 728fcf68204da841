"""Time to first token through the gateway (WebSocket and OpenAI SSE), against the model's own, same run.

The model is a local OpenAI-compatible peer in its own process that streams SSE:
its first content token ``--ttft-ms`` after the request, then ``--tokens`` tokens
``--token-ms`` apart. The gateway runs as its own ``goclaw serve`` process
(SQLite, ``llm.provider: openai`` pointed at the peer, ``server.openai_compat``);
this process is the client. Each run makes three requests in turn:

- **peer**: straight to the peer (``stream: true``): the model's own time to first token;
- **ws**: a message on one open ``/v1/ws`` connection (a new session each run): time to the
  first ``chunk`` frame, and to the ``reply`` frame;
- **sse**: ``POST /v1/chat/completions`` with ``stream: true``: time to the first content delta.

Every time to first token is read the same way (aiohttp, the first non-empty
content), and the gateway's overhead is each sample minus the median of the
peer's own in the same run. The whole-reply time is the same-run baseline for what
streaming replaced: before it, the first chunk went out only after the whole reply.

    .venv/bin/python bench/stream_ttft.py [--runs 40] [--ttft-ms 150] [--tokens 30] [--token-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.model_load import seed_users
from bench.turn_overhead import free_port, pct, wait_up

PEER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from aiohttp import web
    TTFT, TOKENS, GAP = float(sys.argv[2]) / 1000, int(sys.argv[3]), float(sys.argv[4]) / 1000
    WORDS = ["The ", "daily ", "report ", "comes ", "from ", "example_orders, ", "refreshed ", "nightly. "]
    STRUCTURED = {"extraction_result": {"items": []}, "revision_judgement": {"decisions": []}}
    def chunk(model, delta, finish=None):
        body = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\\n\\n".encode()
    async def chat(request):
        body = await request.json()
        model = body.get("model", "bench")
        if not body.get("stream"):
            fmt = (body.get("response_format") or {}).get("json_schema", {}).get("name")
            text = json.dumps(STRUCTURED.get(fmt, {})) if fmt else "".join(WORDS)
            return web.json_response({
                "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk(model, {"role": "assistant", "content": ""}))
        await asyncio.sleep(TTFT)
        for i in range(TOKENS):
            if i:
                await asyncio.sleep(GAP)
            await response.write(chunk(model, {"content": WORDS[i % len(WORDS)]}))
        await response.write(chunk(model, {}, "stop"))
        usage = {"prompt_tokens": 100, "completion_tokens": TOKENS, "total_tokens": 100 + TOKENS}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\\n\\n".encode())
        await response.write(b"data: [DONE]\\n\\n")
        await response.write_eof()
        return response
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)


async def sse_first_token(http: aiohttp.ClientSession, url: str, body: dict[str, Any], token: str) -> float:
    """Seconds from sending ``body`` to the first non-empty content delta; the stream is read to its end."""
    first = None
    t0 = time.perf_counter()
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:300]!r}")
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{url}: no content delta")
    return first


async def ws_first_token(ws: aiohttp.ClientWebSocketResponse, session: str) -> tuple[float, float]:
    """Seconds to the first chunk frame and to the reply frame of one message."""
    t0 = time.perf_counter()
    await ws.send_json({"session": session, "text": "where does the daily report come from?"})
    first = None
    while True:
        frame = await ws.receive_json(timeout=60)
        if frame["type"] == "chunk" and first is None:
            first = time.perf_counter() - t0
        elif frame["type"] == "reply":
            if frame.get("failed") or first is None:
                raise RuntimeError(f"websocket turn failed: {frame}")
            return first, time.perf_counter() - t0
        elif frame["type"] == "error":
            raise RuntimeError(f"websocket error: {frame}")


def summary(name: str, values_s: list[float], peer_ms: float | None = None) -> str:
    ms = [v * 1000 for v in values_s]
    text = f"{name:<28} median {statistics.median(ms):7.1f} ms  p90 {pct(ms, 0.9):7.1f} ms"
    if peer_ms is not None:
        over = [v - peer_ms for v in ms]
        text += f"   over the peer: median {statistics.median(over):+6.1f} ms  p90 {pct(over, 0.9):+6.1f} ms"
    return text


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ttft-ms", type=float, default=150)
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--token-ms", type=float, default=10)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db_url = f"sqlite+aiosqlite:///{tmp}/ttft.db"
        (user,) = await seed_users(db_url, 1)
        token = "bench-ttft-token-0123456789abcdef"
        peer_port, gw_port = free_port(), free_port()
        cfg = tmp / "ttft.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "database": {"url": db_url},
                    "llm": {
                        "provider": "openai",
                        "model": "bench-model",
                        "base_url": f"http://127.0.0.1:{peer_port}/v1",
                        "api_key": "sk-bench",
                    },
                    "server": {"port": gw_port, "openai_compat": True, "api_users": [{"token": token, "user": user}]},
                    "logging": {"level": "WARNING"},
                }
            )
        )
        env = {**os.environ, "NO_PROXY": "127.0.0.1", "PYTHONPATH": str(ROOT)}
        peer_args = [str(peer_port), str(args.ttft_ms), str(args.tokens), str(args.token_ms)]
        peer = subprocess.Popen([sys.executable, "-c", PEER, *peer_args], env=env)
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(cfg)], cwd=tmp, env=env)
        try:
            base = f"http://127.0.0.1:{gw_port}"
            await wait_up(f"{base}/healthz", timeout=90)
            samples: dict[str, list[float]] = {"peer": [], "ws": [], "ws_reply": [], "sse": []}
            peer_body = {"model": "bench-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
                http.ws_connect(f"{base}/v1/ws?token={token}") as ws,
            ):
                for i in range(args.warmup + args.runs):
                    keep = i >= args.warmup
                    direct = await sse_first_token(
                        http, f"http://127.0.0.1:{peer_port}/v1/chat/completions", peer_body, "sk-bench"
                    )
                    first, whole = await ws_first_token(ws, f"ttft-ws-{i}")
                    gw_body = {
                        "model": "goclaw",
                        "stream": True,
                        "user": f"ttft-sse-{i}",
                        "messages": [{"role": "user", "content": "where does the daily report come from?"}],
                    }
                    sse = await sse_first_token(http, f"{base}/v1/chat/completions", gw_body, token)
                    if keep:
                        samples["peer"].append(direct)
                        samples["ws"].append(first)
                        samples["ws_reply"].append(whole)
                        samples["sse"].append(sse)
        finally:
            for p in (gw, peer):
                p.terminate()
            for p in (gw, peer):
                p.wait(15)

    peer_ms = statistics.median(samples["peer"]) * 1000
    print(
        f"stream_ttft: {args.runs} runs; peer: first token after {args.ttft_ms:.0f} ms, "
        f"{args.tokens} tokens {args.token_ms:.0f} ms apart"
    )
    print(summary("peer, direct", samples["peer"]))
    print(summary("WebSocket first chunk", samples["ws"], peer_ms))
    print(summary("OpenAI SSE first delta", samples["sse"], peer_ms))
    print(summary("WebSocket whole reply (old)", samples["ws_reply"], peer_ms))


if __name__ == "__main__":
    asyncio.run(main())

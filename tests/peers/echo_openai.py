"""An OpenAI-compatible peer in its own process that answers after a delay and logs every request.

Usage: python -m tests.peers.echo_openai PORT DELAY_MS LOG_FILE [HOLD_FILE]

Every POST /v1/chat/completions waits DELAY_MS, then answers with the real
wire format: a structured request (``response_format`` json_schema: the
extractor, the judge, consolidation) gets an empty valid result, a chat request
gets ``re <tag>`` where tag is the first ``s<N>-m<N>`` in the last user message
(so a test can tell which reply answers which message). Each request is appended
to LOG_FILE as one JSON line: the schema name (or null) and the messages.
While HOLD_FILE exists, structured requests are held (a slow extraction model).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

from aiohttp import web

STRUCTURED = {
    "extraction_result": {"items": []},
    "revision_judgement": {"decisions": []},
    "consolidation_result": {"groups": []},
}
TAG = re.compile(r"s\d+-m\d+")


def main(port: int, delay_s: float, log_path: str, hold: Path | None = None) -> None:
    log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        fmt = (body.get("response_format") or {}).get("json_schema", {}).get("name")
        log.write(json.dumps({"schema": fmt, "messages": body.get("messages", []), "at": time.time()}) + "\n")
        log.flush()
        await asyncio.sleep(delay_s)
        while fmt and hold is not None and hold.exists():
            await asyncio.sleep(0.05)
        if fmt:
            text = json.dumps(STRUCTURED.get(fmt, {}))
        else:
            users = [m for m in body.get("messages", []) if m.get("role") == "user"]
            found = TAG.search(str(users[-1].get("content", ""))) if users else None
            text = f"re {found.group(0)}" if found else "re ?"
        return web.json_response(
            {
                "id": "chatcmpl-echo",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "echo"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) / 1000, sys.argv[3], Path(sys.argv[4]) if len(sys.argv) > 4 else None)

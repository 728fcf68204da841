"""Dashboard memory pages at 100,000 records: first page, a deep keyset page, search, review queue, a record.

Run: PYTHONPATH=. python bench/dashboard_pages.py [--records 100000] [--runs 30]

Pages are fetched over real HTTP from the aiohttp app on 127.0.0.1 (login,
templates, escaping included). The baseline in the same run is the same deep
page read with OFFSET, the way the dashboard does not page.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestServer
from sqlalchemy import select

from bench.memory_prompt import fill
from gateway.app import Gateway
from gateway.config import Config
from gateway.web.dashboard import queries
from memory.models import MemoryRecord

TOKEN = "bench-dashboard-token-0123456789abcdef"


async def _time(runs: int, fn: object) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        await fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--deep", type=int, default=200, help="page number of the deep page")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        cfg = Config.model_validate({"database": {"url": url}, "server": {"dashboard_token": TOKEN}})
        gw = Gateway(cfg)
        await gw.start(channels=False, worker=False)
        info = await fill(gw.engine, args.records, 2000, random.Random(42))
        srv = TestServer(gw.web, host="127.0.0.1")
        await srv.start_server()
        base = str(srv.make_url("")).rstrip("/")
        async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:
            await http.get(f"{base}/?token={TOKEN}")

            async def get(path: str) -> str:
                async with http.get(base + path) as r:
                    assert r.status == 200, (path, r.status)
                    return await r.text()

            # Walk to the deep page once to get its cursor.
            path = "/dashboard/memory"
            for _ in range(args.deep - 1):
                html = await get(path)
                found = re.search(r'href="([^"]+)" class="next"', html)
                assert found, "no next page"
                path = found.group(1).replace("&amp;", "&")
            deep_path = path
            async with gw.engine.connect() as conn:
                some = (await conn.execute(select(MemoryRecord.id).where(MemoryRecord.status == "superseded"))).first()
            assert some is not None
            R = MemoryRecord.__table__.c
            offset_q = (
                select(MemoryRecord.__table__)
                .order_by(R.said_at.desc(), R.id.desc())
                .offset((args.deep - 1) * 50)
                .limit(51)
            )

            async def offset_page() -> None:
                async with gw.engine.connect() as conn:
                    (await conn.execute(offset_q)).all()

            deep_after = deep_path.split("after=", 1)[1]

            async def keyset_query() -> None:
                await queries.memory_page(gw.engine, queries.MemoryFilter(), after=deep_after, now=gw.clock())

            cases = {
                "memory page 1": lambda: get("/dashboard/memory"),
                f"memory page {args.deep} (keyset)": lambda: get(deep_path),
                f"page {args.deep} keyset (query only)": keyset_query,
                f"baseline: page {args.deep} by OFFSET (query only)": offset_page,
                "search, common word ('report')": lambda: get("/dashboard/memory?q=report"),
                "search, no match ('zzzqqq')": lambda: get("/dashboard/memory?q=zzzqqq"),
                "status superseded": lambda: get("/dashboard/memory?status=superseded"),
                "review queue (unverified)": lambda: get("/dashboard/memory/review"),
                "record + subject timeline": lambda: get(f"/dashboard/memory/record/{some[0]}"),
                "overview": lambda: get("/dashboard/"),
            }
            print(f"{info['records']} records on SQLite; {args.runs} runs each; ms median / p95")
            for name, fn in cases.items():
                p50, p95 = await _time(args.runs, fn)
                print(f"  {name:<48} {p50:7.1f} / {p95:7.1f}")
        await srv.close()
        await gw.stop()


if __name__ == "__main__":
    asyncio.run(main())

"""Benchmark: a turn's match over a store where some words are in every note (``prompt_candidates``).

A turn's prompt picks operational notes by the words of the conversation: the ``match`` part of
``MemoryStore.prompt_candidates``, the sum of ``1/df`` over the shared words, computed in SQL over
the ``memory_terms`` postings. Until 2026-12-06 (``0294933``) it grouped every posting of every
conversation word, so a word in every note cost each turn a read of all its postings; since, a
word in more than ``MATCH_WORD_POSTINGS`` notes is left out (counted, never grouped, then left out
of the store's statements for ``COMMON_WORD_TTL_S``); below that bound the ranking is the same.

Fills one database, once, with ``bench/consolidation.py``'s ``fill`` (this tree's code, 1% repeats,
seed 7): ``--notes`` live notes, each with the subject "note N" and a content "The <topic> <5-9
words> uses <word>_<n>.", so "note" is in every note and each of 20 topic words in about 5%. So was
"use" (the stemmer's "uses") while the index took a plural's singular that is a stop word; since
``ef5b3b8`` it does not, and with the database filled by such a tree "use" has no postings (the
queries with it then show a word the index leaves out, and "note" is the word in every note).
On PostgreSQL (``--postgres``) a fresh database, analyzed as autovacuum would (``VACUUM ANALYZE``)
and dropped at the end. Then, for each tree (this one and with
``--baseline-source DIR`` another, e.g. a worktree of ``aec8d3c``, the tree before), a
process of its own with that tree first on ``sys.path`` (``bench/ab.py``: the trees take turns
going first, run after run; medians of ``--runs``), on that same database, with the store built as
the gateway builds it (on SQLite the inline engine, and the hot store's raw reads):

- ``prompt_candidates`` for five fixed queries (their words as the store gets them, after
  ``memory.words.terms``; each word's notes printed beside it): vocabulary words, a topic word,
  "use", "use" with "note", and an 11-word turn-like query; ``--calls`` calls each, p50.
- ``memory_sections`` for ``--conversations`` seeded conversations (topic words, the store's own
  vocabulary, made-up words; a third end with "uses note", as when a reply quotes a note), once
  untimed (it reads the records' views, as a running gateway has them) then timed: mean and p99
  a call; then how many of the prompts are identical between the trees (the used ids, in order),
  and how many conversations' match scores are (best first, rounded to 12 decimals): a note's
  score is a float sum whose last bit follows the order the database adds the postings in, so
  notes sharing the same words can tie to within 1e-17 and come in another order in another tree
  with the same scores (at 5,000 notes, where the trees rank alike, 8 of 300 prompts on SQLite and
  91 on PostgreSQL on 2026-12-06).

On SQLite the figure is the process's CPU (SQLite runs inline on the calling thread, so that is
all of a call's work); on PostgreSQL the wall time (the work is in the server). The ratio
this / baseline is printed beside each.

Usage:
    .venv/bin/python bench/match_words.py [--notes 65536] [--runs 3] [--calls 15] [--conversations 300]
        [--postgres] [--baseline-source DIR]

For example, against the tree before the bound:
    git worktree add /tmp/mwbase aec8d3c
    .venv/bin/python bench/match_words.py --baseline-source /tmp/mwbase
    .venv/bin/python bench/match_words.py --postgres --baseline-source /tmp/mwbase

At 5,000 notes or fewer no word is past ``MATCH_WORD_POSTINGS`` (5,000): the two trees read the
same postings and rank alike. The bound shows above it: at 8,000 notes (SQLite, one run) the queries
with "use" took 0.11-0.14 of the baseline's CPU, and the match's scores of the conversations with
"uses note" differ (those words are left out) while 299 of their 300 prompts stayed the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Another tree's store (--baseline-source) imports that tree's code: this script runs again as a
# child with GOCLAW_BENCH_SOURCE pointing there (bench/ab.py).
SOURCE = Path(os.environ.get("GOCLAW_BENCH_SOURCE") or ROOT).resolve()
sys.path.insert(0, str(SOURCE))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import ab

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
"""``bench/consolidation.py``'s NOW: its notes are current then (reviewed by 60 days later)."""
TOKEN_BUDGET = 1200
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "xe", "zu", "pa", "qi", "fo", "de", "gi", "ha"]
QUERIES = {
    "rare": "3 vocabulary words",
    "topic": "a topic word",
    "use": '"use"',
    "use+note": '"use" and "note"',
    "turn-like": "a turn's 11 words",
}
"""The fixed queries' names (their figures' keys) and what each is."""


# ---- the parent: fill once, plan the queries, run the trees --------------------------------------


async def fill_once(url: str, notes: int) -> float:
    """The database at ``url`` migrated and filled with ``bench/consolidation.py``'s notes; the fill's seconds."""
    import consolidation

    from gateway.db import make_engine, upgrade

    if consolidation.NOW != NOW:
        raise RuntimeError("bench/consolidation.py's NOW moved: the notes would not be current at this NOW")
    engine = make_engine(url)
    try:
        await upgrade(engine)
        t0 = time.perf_counter()
        await consolidation.fill(engine, notes, 0.01, random.Random(7))
        return time.perf_counter() - t0
    finally:
        await engine.dispose()


async def document_frequencies(url: str) -> dict[str, int]:
    """Every indexed word and the notes that have it."""
    from sqlalchemy import text

    from gateway.db import make_engine

    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT term, COUNT(*) FROM memory_terms GROUP BY term"))
            return {term: int(n) for term, n in rows}
    finally:
        await engine.dispose()


def plan(df: dict[str, int], conversations: int) -> dict[str, Any]:
    """The fixed queries (words as the store gets them) and the seeded conversations, the same for every tree."""
    from consolidation import TOPICS

    vocab = sorted((t for t in df if t.isalpha() and t not in {*TOPICS, "use", "note"}), key=lambda t: (df[t], t))
    if len(vocab) < 3:
        raise RuntimeError(f"the fill indexed {len(vocab)} vocabulary words: too few notes")
    mid = len(vocab) // 2
    r1, r2, r3 = vocab[mid : mid + 3]  # words of a typical vocabulary word's frequency
    queries = {
        "rare": [r1, r2, "zzzq"],  # zzzq, daily, produce, procedure, current, number: in no note
        "topic": ["report", r3, "daily", "produce"],
        "use": ["use", "report", r1],
        "use+note": ["use", "note", "report"],
        "turn-like": ["12", r1, "use", r2, r3, "report", "procedure", "current", "number", "daily", "produce"],
    }
    rng = random.Random(3)
    made_up = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(800)]
    texts = []
    for i in range(conversations):
        words = [rng.choice(TOPICS) for _ in range(rng.randint(0, 3))]
        words += [rng.choice(vocab) for _ in range(rng.randint(0, 6))]
        words += [rng.choice(made_up) for _ in range(rng.randint(0, 6))]
        if i % 3 == 0:
            words += ["uses", "note"]  # what a reply quoting notes brings into the conversation
        texts.append("Can you help me with the " + " ".join(words) + " please?")
    return {"queries": queries, "conversations": texts}


# ---- the child: one tree's measurement on the filled database ------------------------------------

Prompts = dict[str, list[Any]]
"""What a child saw of the conversations: ``used``, each prompt's record ids in order; ``scores``, each
conversation's match scores best first, rounded to ``SCORE_DIGITS`` decimals."""
SCORE_DIGITS = 12
"""A note's score is a float sum of ``1/df`` whose last bit follows the order the database adds the
postings in (the plan's), so notes sharing the same words can differ by 1e-17 and the newest-first
order among them then follows that noise; rounded, such ties compare equal. On PostgreSQL the same
conversation's prompt can change so from one call to the next: a prepared statement may switch from
custom plans to a generic one after its fifth call (none changed with ``plan_cache_mode`` fixed)."""


async def child(url: str, plan_path: Path, prompts_path: Path, calls: int) -> ab.Figures:
    """Time the fixed queries and the conversations with this process's tree; what the prompts got to
    ``prompts_path``."""
    import memory.store
    from gateway.db import make_engine
    from gateway.heap import settle_heap
    from gateway.hotstore import hot_store
    from gateway.sqlite_inline import make_inline_engine
    from memory.render import _query_terms, memory_sections
    from memory.store import MemoryStore
    from pairing.principal import Principal

    where = Path(memory.store.__file__).resolve()
    if not where.is_relative_to(SOURCE):
        raise RuntimeError(f"measuring {SOURCE} but its store came from {where}")
    todo = json.loads(plan_path.read_text())
    sqlite = url.startswith("sqlite")
    # SQLite runs inline on the calling thread: the process's CPU is all of a call's work. On
    # PostgreSQL the work is the server's: the wall time.
    clock = time.process_time if sqlite else time.perf_counter
    engine = make_inline_engine(url) if sqlite else make_engine(url)
    store = MemoryStore(engine, clock=lambda: NOW, raw=hot_store(engine))  # as the gateway builds it
    cron = Principal.system("cron-system")  # an autonomous run's prompt: no personal records

    async def candidates(words: list[str]) -> Any:
        return await store.prompt_candidates(user_id=None, query_terms=words, now=NOW)

    async def sections(text: str) -> list[str]:
        got = await memory_sections(store, cron, text, token_budget=TOKEN_BUDGET, now=NOW)
        return list(got.used_ids)

    try:
        # Warm (each statement shape compiled, the records' views read, as in a running gateway), and
        # what each conversation's prompt got: its ids, and its match's scores (the words memory_sections
        # takes from the conversation).
        for words in todo["queries"].values():
            for _ in range(2):
                await candidates(words)
        seen: Prompts = {"used": [], "scores": []}
        for text in todo["conversations"]:
            seen["used"].append(await sections(text))
            matched = (await candidates(_query_terms(text))).matched_notes
            seen["scores"].append([round(score, SCORE_DIGITS) for _, score in matched])
        settle_heap()  # as goclaw serve does once started (gateway/heap.py)
        figures: ab.Figures = {}
        for name, words in todo["queries"].items():
            times: list[float] = []
            for _ in range(calls):
                t0 = clock()
                got = await candidates(words)
                times.append((clock() - t0) * 1000)
            figures[name] = statistics.median(times)
            figures[f"{name} matched"] = len(got.matched_notes)
        times, changed = [], 0  # the conversations' times; their prompts unlike their first call's
        for text, first in zip(todo["conversations"], seen["used"], strict=True):
            t0 = clock()
            ids = await sections(text)
            times.append((clock() - t0) * 1000)
            changed += ids != first  # notes of equal score in another order (a plan of its own, see SCORE_DIGITS)
        figures["sections mean"] = statistics.mean(times)
        figures["sections p99"] = _p99(times)
        figures["prompts changed"] = changed
        prompts_path.write_text(json.dumps(seen))
        return figures
    finally:
        await engine.dispose()


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


# ---- the report ------------------------------------------------------------------------------------


def _revision(tree: Path) -> str:
    """``tree``'s commit, and whether its tracked files differ from it (read only: no index refresh)."""
    git = ["git", "--no-optional-locks", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "not a git tree"
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def _show(r: ab.Figures) -> str:
    queries = ", ".join(f"{name} {r[name]:.2f}" for name in QUERIES)
    return f"{queries}; memory_sections mean {r['sections mean']:.2f}, p99 {r['sections p99']:.2f} ms"


def report(
    trees: dict[str, Path],
    medians: dict[str, ab.Figures],
    queries: dict[str, list[str]],
    df: dict[str, int],
    prompts: dict[str, list[Prompts]],
    *,
    postgres: bool,
) -> None:
    """The fixed queries' and the conversations' figures per tree, the ratios, and the prompts compared."""
    names = list(trees)
    both = "baseline" in names
    unit = "wall" if postgres else "CPU"
    for name in names:
        print(f"  {name:8} {trees[name]} ({_revision(trees[name])})")

    def row(label: str, key: str, extra: str = "") -> str:
        line = f"  {label:16}" + "".join(f" {medians[n][key]:9.2f}" for n in names)
        if both:
            base = medians["baseline"][key]
            line += f" {medians['this'][key] / base:9.2f}x" if base > 0 else f" {'-':>10}"
        return line + extra

    header = f"  {'':16}" + "".join(f" {n:>9}" for n in names) + (f" {'this/base':>10}" if both else "")
    print("\nthe fixed queries, their words as the store gets them (the notes each word is in):")
    for key, words in queries.items():
        print(f"  {key:10} {QUERIES[key]:18} " + ", ".join(f"{w} ({df.get(w, 0):,})" for w in words))
    print(f"\nprompt_candidates, {unit} p50 ms a call:")
    print(header + "  notes matched")
    for key in queries:
        print(row(key, key, "  " + " / ".join(f"{medians[n][f'{key} matched']:.0f}" for n in names)))
    conversations = len(prompts[names[0]][0]["used"])
    print(f"\nmemory_sections over {conversations} conversations, {unit} ms a call:")
    print(header)
    for stat in ("mean", "p99"):
        print(row(stat, f"sections {stat}"))
    for name in names:
        changed = medians[name]["prompts changed"]
        if changed or any(run["scores"] != prompts[name][0]["scores"] for run in prompts[name][1:]):
            print(
                f"  {name}: {changed:.0f} prompts (median) changed between a conversation's first and second "
                "call; the match's scores the same in every run: "
                + ("yes" if all(run["scores"] == prompts[name][0]["scores"] for run in prompts[name]) else "NO")
            )
    if not both:
        return
    this, base = prompts["this"][0], prompts["baseline"][0]
    same = [a == b for a, b in zip(this["used"], base["used"], strict=True)]
    same_scores = [a == b for a, b in zip(this["scores"], base["scores"], strict=True)]
    print(f"  prompts identical between the trees (the used ids in order): {sum(same)} of {conversations}")
    ties = sum(s and not u for u, s in zip(same, same_scores, strict=True))
    print(
        f"  the match's scores identical (best first, to {SCORE_DIGITS} decimals): {sum(same_scores)} of "
        f"{conversations}; prompts that differ with the same scores: {ties} (notes of equal score, in an order "
        "the last bit of a float sum sets)"
    )
    differ = [str(i) for i, s in enumerate(same_scores) if not s]
    if differ:
        print(f"  conversations whose scores differ: {', '.join(differ[:30])}{' ...' * (len(differ) > 30)}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notes", type=int, default=65_536, help="live notes in the store")
    ap.add_argument("--calls", type=int, default=15, help="timed calls of each fixed query")
    ap.add_argument("--conversations", type=int, default=300)
    ap.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)  # the child: what to run
    ap.add_argument("--prompts", type=Path, default=None, help=argparse.SUPPRESS)  # the child: what prompts got
    ab.add_arguments(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(await child(args.child, args.plan, args.prompts, args.calls)))
        return
    from memory_prompt import drop_pg_database, fresh_pg_database, vacuum_analyze

    trees = ab.trees(ROOT, args)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="goclaw-bench-") as tmp:
        folder = Path(tmp)
        pg_name = None
        if args.postgres:
            url, pg_name = await fresh_pg_database(args.pg_server)
        else:
            url = f"sqlite+aiosqlite:///{folder / 'bench.db'}"
        try:
            filled = await fill_once(url, args.notes)
            if pg_name:
                await vacuum_analyze(url)
            df = await document_frequencies(url)
            print(
                f"filled {args.notes:,} notes ({sum(df.values()):,} postings, {len(df):,} words) in {filled:.1f} s "
                f"({args.notes / filled:,.0f} notes/s)"
                + (", then VACUUM ANALYZE as autovacuum would" if pg_name else "")
                + f"; {time.perf_counter() - started:.1f} s so far"
            )
            todo = plan(df, args.conversations)
            plan_path = folder / "plan.json"
            plan_path.write_text(json.dumps(todo))
            prompts: dict[str, list[Prompts]] = {name: [] for name in trees}

            async def measure(name: str, tree: Path, run: int) -> ab.Figures:
                out = folder / f"prompts-{name}-{run}.json"
                child_args = ["--child", url, "--plan", str(plan_path), "--prompts", str(out)]
                got = ab.run_child(__file__, tree, [*child_args, "--calls", str(args.calls)])
                prompts[name].append(json.loads(out.read_text()))
                return got

            t0 = time.perf_counter()
            medians = await ab.alternate(trees, args.runs, measure, _show)
            where = "PostgreSQL" if args.postgres else "SQLite"
            print(
                f"\n{where}, {args.notes:,} notes, medians of {args.runs} runs "
                f"(measurements {time.perf_counter() - t0:.1f} s, all {time.perf_counter() - started:.1f} s):"
            )
            report(trees, medians, todo["queries"], df, prompts, postgres=args.postgres)
        finally:
            if pg_name:
                await drop_pg_database(args.pg_server, pg_name)


if __name__ == "__main__":
    asyncio.run(main())

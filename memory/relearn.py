"""Relearn: learn again from session archives, with the live path's verdicts, dated when said.

policy (RBAC matrix, "Relearned from a session archive"): admin -> "learned,
dated when the session was"; regular user -> "quarantined as ``unverified`` for
``review_learned``; personal lines not learned". And: "A relearned or confirmed
record older than the live value on its subject becomes history itself; it
does not retire the newer value."

- :func:`parse_archive` reads the markdown an archive is stored as (and
  exported as): the ``**Trust**:`` line of its header, its session and date
  range, and one ``- [iso] [msg:ID] [user:UID|-|agent] [role:R|-] [name:N] text``
  line per message, back into :class:`~memory.types.SliceMessage`. Every field is
  escaped (``memory.archive_format``, format 2), so no field can forge a line;
  a line that cannot be read exactly is not learned and the summary lists it,
  and a format-1 archive (written before the escaping) is read only when whole.
- :func:`relearn_archives` re-extracts each archive with the SAME ``lines_by_speaker``,
  extractor prompt, parser and ``handle_fact_extract`` as the live path, through
  the SAME write gate (source ``relearn``): each item is dated by the message
  it came from. Trust comes from the archive: only ``admin`` learns operational
  items; anything else (``user``, ``mixed``, ``none``, a missing line, a value
  it does not know) quarantines them as ``unverified``, and the summary says
  when the line was missing or unknown. A speaker whose own lines were not all
  stored as admin is never trusted, whatever the header says.
- Idempotent: the store does not write the same saying twice (same subject,
  same content, same ``said_at``, in any status), and each archive is written
  in one transaction, so a second run writes nothing new and an interrupted
  run, run again, completes without duplicates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from msgspec import Struct, field
from msgspec.structs import replace

from memory.archive_format import read_archive
from memory.belief_revision import BeliefReviser, RevisionOutcome
from memory.extract import (
    EXTRACTOR_PROMPT,
    Dropped,
    ExtractOutcome,
    GatedWriter,
    MalformedExtraction,
    SpeakerLines,
    handle_fact_extract,
    lines_by_speaker,
    parse_extraction,
)
from memory.store import MemoryRecordView, new_run_id
from memory.types import ExtractedItem, ExtractorModel, SliceMessage
from memory.writer import MemoryWriter
from pairing.principal import Principal

log = logging.getLogger(__name__)

TRUST_VALUES: tuple[str, ...] = ("admin", "mixed", "user", "none")
"""The values ``archive_trust`` writes; only ``admin`` lets operational items be learned."""

# The turn a relearn runs as: nobody's. Every speaker is then read under the role their own
# messages were stored with (policy: "For anyone else in the thread it is the role their
# messages were stored with"), never under the authority of whoever runs the relearn.
RELEARN_TURN = Principal.unpaired("relearn")


class ArchiveFormatError(ValueError):
    """The text is not a session archive (no header, or no message lines)."""


class ParsedArchive(Struct, frozen=True):
    """One archive as read from its markdown."""

    archive_id: str | None
    session_id: str | None
    trust: str | None
    """The ``**Trust**:`` value as written (lowercased), or None when the line is missing."""
    start_at: datetime | None
    end_at: datetime | None
    messages: tuple[SliceMessage, ...]
    origin: str = ""
    """Where it was read from (``database`` or a file path), for the summary."""
    unreadable: tuple[str, ...] = ()
    """``line N: why`` for each line that could not be read exactly (left out, never learned)."""
    format: int = 1
    """The archive format (``memory.archive_format``): 1 before fields were escaped, 2 since."""
    refused: str | None = None
    """Why nothing of this archive is relearned (a format-1 archive that is not whole), else None."""

    @property
    def skipped_lines(self) -> int:
        """How many lines were left out as unreadable."""
        return len(self.unreadable)

    @property
    def name(self) -> str:
        """The archive's id, else where it came from."""
        return self.archive_id or self.origin or "archive"

    @property
    def trusted(self) -> bool:
        """True only for ``**Trust**: admin``."""
        return self.trust == "admin"

    @property
    def trust_problem(self) -> str | None:
        """``missing`` or ``unknown`` when the trust line cannot be read as one of :data:`TRUST_VALUES`."""
        if self.trust is None:
            return "missing"
        return None if self.trust in TRUST_VALUES else "unknown"


def parse_archive(markdown: str, *, origin: str = "") -> ParsedArchive:
    """Read an archive's markdown back: its trust, session, date range and messages, exactly.

    Only the header (before the first ``##`` section) is read for the
    ``**Session**``/``**From**``/``**To**``/``**Trust**`` lines, so nothing a
    person wrote (in the summary or a message) can set the trust. Two
    different trust lines read as an unknown value. A line that cannot be
    read exactly is left out and listed in ``unreadable`` (it is never
    guessed at); a format-1 archive with such a line is refused whole
    (``refused``), since there a field could have forged a line
    (``memory.archive_format``).

    Raises:
        ArchiveFormatError: no ``# Session archive`` title and no message lines.
    """
    read = read_archive(markdown)
    if read.archive_id is None and not read.messages:
        raise ArchiveFormatError(f"{origin or 'the text'} is not a session archive (no title, no message lines)")
    trust: str | None
    if not read.trusts:
        trust = None
    elif len(set(read.trusts)) == 1:
        trust = read.trusts[0]
    else:
        trust = "conflicting: " + " / ".join(dict.fromkeys(read.trusts))
    messages = tuple(read.messages) if read.refused is None else ()
    start, end = read.start_at, read.end_at
    if messages:
        start = start or min(m.said_at for m in messages)
        end = end or max(m.said_at for m in messages)
    return ParsedArchive(
        read.archive_id,
        read.session_id,
        trust,
        start,
        end,
        messages,
        origin,
        tuple(read.unreadable),
        read.format,
        read.refused,
    )


def select_archives(
    archives: Iterable[ParsedArchive], *, session_id: str | None = None, since: datetime | None = None
) -> list[ParsedArchive]:
    """The archives of one session and/or ending at or after ``since``, oldest first."""
    chosen = [
        a
        for a in archives
        if (session_id is None or a.session_id == session_id)
        and (since is None or (a.end_at is not None and a.end_at >= since))
    ]
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(chosen, key=lambda a: (a.start_at or far, a.name))


# ---- the run -----------------------------------------------------------------------------


class ArchiveOutcome(Struct):
    """What relearn did with one archive."""

    archive: ParsedArchive
    learned: list[MemoryRecordView] = field(default_factory=list)
    """Written live."""
    history: list[MemoryRecordView] = field(default_factory=list)
    """Written, but said before the live value on their subject: history at once."""
    quarantined: list[MemoryRecordView] = field(default_factory=list)
    """Written as ``unverified`` for ``review_learned``."""
    dropped: list[Dropped] = field(default_factory=list)
    duplicates: list[ExtractedItem] = field(default_factory=list)
    not_memory: int = 0
    model_calls: int = 0
    error: str | None = None
    revisions: list[RevisionOutcome] = field(default_factory=list)

    def add(self, outcome: ExtractOutcome) -> None:
        """Sort one speaker's extraction outcome into this archive's counts."""
        for rec in outcome.written:
            if rec.status == "unverified":
                self.quarantined.append(rec)
            elif rec.status == "live":
                self.learned.append(rec)
            else:
                self.history.append(rec)
        self.dropped.extend(outcome.dropped)
        self.duplicates.extend(outcome.known)
        self.not_memory += len(outcome.not_memory)

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints for one archive."""
        return {
            "archive_id": self.archive.archive_id,
            "origin": self.archive.origin,
            "session_id": self.archive.session_id,
            "trust": self.archive.trust,
            "trust_problem": self.archive.trust_problem,
            "format": self.archive.format,
            "unreadable_lines": list(self.archive.unreadable),
            "learned": [r.as_json() for r in self.learned],
            "history": [r.as_json() for r in self.history],
            "quarantined": [r.as_json() for r in self.quarantined],
            "dropped": [{"kind": d.item.kind, "content": d.item.content, "reason": d.reason} for d in self.dropped],
            "duplicates": len(self.duplicates),
            "not_memory": self.not_memory,
            "model_calls": self.model_calls,
            "error": self.error,
        }


class RelearnSummary(Struct):
    """What a relearn run did, over all archives."""

    run_id: str
    dry_run: bool = False
    archives: list[ArchiveOutcome] = field(default_factory=list)
    interrupted: str | None = None
    """Why the run stopped early (the model could not be reached, ...); run it again to finish."""

    def _sum(self, f: Callable[[ArchiveOutcome], int]) -> int:
        return sum(f(a) for a in self.archives)

    @property
    def counts(self) -> dict[str, int]:
        """The summary's numbers, by name."""
        return {
            "archives_read": sum(1 for a in self.archives if a.error is None),
            "learned": self._sum(lambda a: len(a.learned)),
            "learned_as_history": self._sum(lambda a: len(a.history)),
            "quarantined": self._sum(lambda a: len(a.quarantined)),
            "dropped": self._sum(lambda a: len(a.dropped)),
            "duplicates": self._sum(lambda a: len(a.duplicates)),
            "not_memory": self._sum(lambda a: a.not_memory),
            "model_calls": self._sum(lambda a: a.model_calls),
            "archives_failed": sum(1 for a in self.archives if a.error is not None),
            "archives_without_trust": len(self.without_trust),
            "archives_with_unknown_trust": len(self.unknown_trust),
            "unreadable_lines": self._sum(lambda a: len(a.archive.unreadable)),
            "retired_by_belief_revision": self._sum(lambda a: sum(len(r.retired) for r in a.revisions)),
        }

    @property
    def without_trust(self) -> list[str]:
        """Archives with no ``**Trust**:`` line (read as not admin)."""
        return [a.archive.name for a in self.archives if a.archive.trust_problem == "missing"]

    @property
    def unknown_trust(self) -> list[tuple[str, str]]:
        """Archives whose ``**Trust**:`` value is not one it knows (read as not admin), with the value."""
        return [(a.archive.name, a.archive.trust or "") for a in self.archives if a.archive.trust_problem == "unknown"]

    def notes(self) -> list[str]:
        """Sentences for the operator about trust and failures."""
        out: list[str] = []
        if self.without_trust:
            out.append(
                f"{len(self.without_trust)} archive(s) had no **Trust**: line and were read as not admin "
                f"(operational items quarantined): {', '.join(self.without_trust)}"
            )
        if self.unknown_trust:
            listed = ", ".join(f"{name} ({value!r})" for name, value in self.unknown_trust)
            out.append(
                f"{len(self.unknown_trust)} archive(s) had an unknown **Trust**: value and were read as not admin "
                f"(operational items quarantined): {listed}"
            )
        for a in self.archives:
            if a.archive.unreadable and a.archive.refused is None:
                shown = "; ".join(a.archive.unreadable[:3])
                more = f" (and {len(a.archive.unreadable) - 3} more)" if len(a.archive.unreadable) > 3 else ""
                out.append(
                    f"archive {a.archive.name}: {len(a.archive.unreadable)} line(s) could not be read exactly "
                    f"and were not learned: {shown}{more}"
                )
            if a.error:
                out.append(f"archive {a.archive.name} was not relearned: {a.error}")
        if self.interrupted:
            out.append(f"interrupted: {self.interrupted}; run it again to finish (nothing is written twice)")
        if self.dry_run:
            out.append("dry run: nothing was written")
        return out

    def as_json(self) -> dict[str, Any]:
        """The JSON shape the CLI prints."""
        return {
            "run_id": self.run_id,
            "dry_run": self.dry_run,
            **self.counts,
            "archives_without_trust_ids": self.without_trust,
            "archives_with_unknown_trust_ids": [{"archive": n, "trust": v} for n, v in self.unknown_trust],
            "interrupted": self.interrupted,
            "notes": self.notes(),
            "archives": [a.as_json() for a in self.archives],
        }


Plan = list[tuple[SpeakerLines, list[ExtractedItem]]]


def speakers_of(archive: ParsedArchive) -> list[SpeakerLines]:
    """Each person's lines of an archive, trusted only under an ``admin`` archive and their own admin lines."""
    return [
        # policy: relearn keeps "the same verdict as the live path": a speaker is trusted only
        # when the archive says admin AND every one of their own lines was stored as admin.
        replace(sp, trusted=sp.trusted and archive.trusted)
        for sp in lines_by_speaker(archive.messages, turn_principal=RELEARN_TURN)
    ]


async def _extract(model: ExtractorModel, archive: ParsedArchive, out: ArchiveOutcome) -> Plan:
    plan: Plan = []
    for sp in speakers_of(archive):
        raw = await model(EXTRACTOR_PROMPT, sp.transcript())
        out.model_calls += 1
        plan.append((sp, parse_extraction(raw)))
    return plan


async def _write(batch: GatedWriter, archive: ParsedArchive, plan: Plan, run_id: str, out: ArchiveOutcome) -> None:
    for sp, items in plan:
        out.add(
            await handle_fact_extract(
                batch,
                items,
                speaker=sp,
                session_id=archive.session_id,
                source="relearn",
                run_id=run_id,
                archive_id=archive.archive_id,
            )
        )


async def relearn_archives(
    writer: MemoryWriter,
    model: ExtractorModel,
    archives: Iterable[ParsedArchive],
    *,
    dry_run: bool = False,
    reviser: BeliefReviser | None = None,
    run_id: str | None = None,
    on_archive: Callable[[ArchiveOutcome], None] | None = None,
) -> RelearnSummary:
    """Relearn from archives, oldest first, through the write gate (source ``relearn``).

    Args:
        writer: The gated writer.
        model: The extractor (the configured provider, as on the live path).
        archives: Parsed archives (see :func:`parse_archive`, :func:`select_archives`).
        dry_run: Extract and decide everything, in a transaction that is rolled back: nothing is kept.
        reviser: Belief revision for each record learned live (cause ``relearn``); None skips it.
        run_id: The run id on the records and revision rows (a fresh one by default).
        on_archive: Called after each archive (a progress bar).

    Returns:
        The summary. A malformed extractor answer fails that archive only; any
        other model failure stops the run (``interrupted``): what was written
        so far stays, whole archives only, and a rerun completes it.
    """
    summary = RelearnSummary(run_id or new_run_id("rl"), dry_run=dry_run)
    planned: list[tuple[ArchiveOutcome, Plan]] = []
    for archive in archives:
        out = ArchiveOutcome(archive)
        summary.archives.append(out)
        if archive.refused is not None:
            # Fail closed: an archive whose lines may be forged teaches nothing, and the summary says why.
            log.warning("relearn: archive %s refused: %s", archive.name, archive.refused)
            out.error = archive.refused
            if on_archive is not None:
                on_archive(out)
            continue
        try:
            plan = await _extract(model, archive, out)
        except MalformedExtraction as exc:
            log.warning("relearn: archive %s: %s", archive.name, exc)
            out.error = f"malformed extractor answer ({exc.problem})"
            plan = []
        except Exception as exc:
            log.warning("relearn interrupted at archive %s: %s", archive.name, exc)
            summary.archives.pop()
            summary.interrupted = f"{type(exc).__name__}: {exc}"
            break
        if dry_run:
            planned.append((out, plan))
        elif plan:
            # One transaction per archive: an interrupted run leaves whole archives only.
            async with writer.batch() as batch:
                await _write(batch, archive, plan, summary.run_id, out)
            if reviser is not None:
                ids = [r.id for r in out.learned]
                out.revisions = await reviser.revise_many(ids, cause="relearn", run_id=summary.run_id)
        if on_archive is not None:
            on_archive(out)
    if dry_run and planned:
        # One transaction for all, rolled back: later archives see what earlier ones would write.
        async with writer.batch(rollback=True) as batch:
            for out, plan in planned:
                await _write(batch, out.archive, plan, summary.run_id, out)
    return summary


def relearn_rows(summary: RelearnSummary) -> Sequence[tuple[str, int]]:
    """The summary table's rows: (what, how many)."""
    c = summary.counts
    return [
        ("archives read", c["archives_read"]),
        ("items learned", c["learned"]),
        ("learned as history (older than the live value)", c["learned_as_history"]),
        ("quarantined as unverified", c["quarantined"]),
        ("dropped (not learned)", c["dropped"]),
        ("duplicates (already on record)", c["duplicates"]),
        ("not memory (requests, tasks)", c["not_memory"]),
        ("retired by belief revision", c["retired_by_belief_revision"]),
        ("model calls", c["model_calls"]),
        ("archives failed", c["archives_failed"]),
        ("archives with no trust line", c["archives_without_trust"]),
        ("archives with unknown trust", c["archives_with_unknown_trust"]),
        ("lines not read exactly (not learned)", c["unreadable_lines"]),
    ]

"""Memory: records, extraction, the RBAC write gate, revisions, relearn, consolidation, rendering.

Depends on pairing's Principal/Role only.

- ``memory.gate``: the one write gate (``decide``), the seed's RBAC x learning matrix.
- ``memory.store`` / ``memory.writer``: append-only records and revisions; every write asks the gate.
- ``memory.extract``: ``lines_by_speaker``, the extractor prompt and schema, ``handle_fact_extract``,
  ``process_slice``, ``summary_owner``, ``archive_trust``.
- ``memory.rules``: the builtin model's rule-based classifier (``builtin_extract``).
- ``memory.tools``: ``memory_write``, ``memory_search``, ``handle_notes_directive``.
- ``memory.render``: ``memory_sections``, memory into the prompt within a token budget.
"""

from memory.extract import (
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    EXTRACTOR_PROMPT,
    ExtractOutcome,
    MalformedExtraction,
    SpeakerLines,
    archive_trust,
    handle_fact_extract,
    lines_by_speaker,
    parse_extraction,
    process_slice,
    summary_owner,
)
from memory.gate import GateDecision, Verdict, WriteAccess, decide
from memory.render import MemorySections, memory_sections
from memory.rules import builtin_extract, classify
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, RevisionView
from memory.tools import (
    MEMORY_SEARCH_SCHEMA,
    MEMORY_WRITE_SCHEMA,
    handle_notes_directive,
    memory_search,
    memory_write,
)
from memory.types import ExtractedItem, ExtractorModel, SliceMessage
from memory.writer import MemoryWriter, WriteResult

__all__ = [
    "EXTRACTION_SCHEMA",
    "EXTRACTION_SCHEMA_NAME",
    "EXTRACTOR_PROMPT",
    "MEMORY_SEARCH_SCHEMA",
    "MEMORY_WRITE_SCHEMA",
    "ExtractOutcome",
    "ExtractedItem",
    "ExtractorModel",
    "GateDecision",
    "MalformedExtraction",
    "MemoryRecordView",
    "MemorySections",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryWriter",
    "RevisionView",
    "SliceMessage",
    "SpeakerLines",
    "Verdict",
    "WriteAccess",
    "WriteResult",
    "archive_trust",
    "builtin_extract",
    "classify",
    "decide",
    "handle_fact_extract",
    "handle_notes_directive",
    "lines_by_speaker",
    "memory_search",
    "memory_sections",
    "memory_write",
    "parse_extraction",
    "process_slice",
    "summary_owner",
]

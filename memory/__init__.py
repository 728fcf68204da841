"""Memory: records, extraction, the RBAC write gate, revisions, relearn, consolidation, rendering.

Depends on pairing's Principal/Role only.

- ``memory.gate``: the one write gate (``decide``), the seed's RBAC x learning matrix.
- ``memory.store`` / ``memory.writer``: append-only records and revisions; every write asks the gate.
- ``memory.extract``: ``lines_by_speaker``, the extractor prompt and schema, ``handle_fact_extract``,
  ``process_slice``, ``summary_owner``, ``archive_trust``.
- ``memory.rules``: the builtin model's rule-based classifier (``builtin_extract``).
- ``memory.tools``: ``memory_write``, ``memory_search``, ``handle_notes_directive``.
- ``memory.render``: ``memory_sections``, memory into the prompt within a token budget.
- ``memory.belief_revision``: ``BeliefReviser``, the judge (``revision_judgement``) weighing a record both ways.
- ``memory.revisions``: the audit of retirements; ``undo_revision`` / ``undo_revision_run`` (admins only).
- ``memory.relearn``: ``parse_archive`` and ``relearn_archives`` (the live path's extraction and gate,
  dated when said).
- ``memory.review``: ``review_learned`` (list / confirm / reject quarantined records), ``retract_note``.
- ``memory.consolidate``: ``Consolidator`` (merges notes that say the same thing; 40 records a call, 6 calls a run).
- ``memory.tools_admin``: the admin tools ``review_learned`` and ``notes_distill`` with schemas and ``authorize_*``.
"""

from memory.belief_revision import (
    JUDGE_PROMPT_VERSION,
    REVISION_SCHEMA,
    REVISION_SCHEMA_NAME,
    BeliefReviser,
    JudgeModel,
    RevisionOutcome,
)
from memory.consolidate import (
    CONSOLIDATION_PROMPT_VERSION,
    CONSOLIDATION_SCHEMA,
    CONSOLIDATION_SCHEMA_NAME,
    ConsolidationModel,
    ConsolidationRun,
    Consolidator,
)
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
from memory.relearn import ParsedArchive, RelearnSummary, parse_archive, relearn_archives, select_archives
from memory.render import MemorySections, memory_sections
from memory.review import confirm_learned, list_unverified, reject_learned, retract_note, review_learned
from memory.revisions import UndoRefused, authorize_undo, list_revisions, undo_revision, undo_revision_run, undo_run
from memory.rules import builtin_consolidation_result, builtin_extract, builtin_revision_judgement, classify
from memory.store import MemoryRecordView, MemoryStore, MemoryStoreError, RevisionView
from memory.tools import (
    MEMORY_SEARCH_SCHEMA,
    MEMORY_WRITE_SCHEMA,
    handle_notes_directive,
    memory_search,
    memory_write,
)
from memory.tools_admin import (
    NOTES_DISTILL_DESCRIPTION,
    NOTES_DISTILL_SCHEMA,
    REVIEW_LEARNED_DESCRIPTION,
    REVIEW_LEARNED_SCHEMA,
    authorize_notes_distill,
    authorize_review_learned,
    notes_distill,
)
from memory.types import ExtractedItem, ExtractorModel, SliceMessage
from memory.writer import MemoryWriter, WriteResult

__all__ = [
    "CONSOLIDATION_PROMPT_VERSION",
    "CONSOLIDATION_SCHEMA",
    "CONSOLIDATION_SCHEMA_NAME",
    "EXTRACTION_SCHEMA",
    "EXTRACTION_SCHEMA_NAME",
    "EXTRACTOR_PROMPT",
    "JUDGE_PROMPT_VERSION",
    "MEMORY_SEARCH_SCHEMA",
    "MEMORY_WRITE_SCHEMA",
    "NOTES_DISTILL_DESCRIPTION",
    "NOTES_DISTILL_SCHEMA",
    "REVIEW_LEARNED_DESCRIPTION",
    "REVIEW_LEARNED_SCHEMA",
    "REVISION_SCHEMA",
    "REVISION_SCHEMA_NAME",
    "BeliefReviser",
    "ConsolidationModel",
    "ConsolidationRun",
    "Consolidator",
    "ExtractOutcome",
    "ExtractedItem",
    "ExtractorModel",
    "GateDecision",
    "JudgeModel",
    "MalformedExtraction",
    "MemoryRecordView",
    "MemorySections",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryWriter",
    "ParsedArchive",
    "RelearnSummary",
    "RevisionOutcome",
    "RevisionView",
    "SliceMessage",
    "SpeakerLines",
    "UndoRefused",
    "Verdict",
    "WriteAccess",
    "WriteResult",
    "archive_trust",
    "authorize_notes_distill",
    "authorize_review_learned",
    "authorize_undo",
    "builtin_consolidation_result",
    "builtin_extract",
    "builtin_revision_judgement",
    "classify",
    "confirm_learned",
    "decide",
    "handle_fact_extract",
    "handle_notes_directive",
    "lines_by_speaker",
    "list_revisions",
    "list_unverified",
    "memory_search",
    "memory_sections",
    "memory_write",
    "notes_distill",
    "parse_archive",
    "parse_extraction",
    "process_slice",
    "reject_learned",
    "relearn_archives",
    "retract_note",
    "review_learned",
    "select_archives",
    "summary_owner",
    "undo_revision",
    "undo_revision_run",
    "undo_run",
]

"""Grounding: is every identifier and content word of a derived text in its sources?

A text memory derives from other records (a consolidation merge) may only
restate them. A model asked to merge three notes can answer anything; code
checks that it wrote nothing its sources do not say, the way extraction checks
that an item's identifiers are in its speaker's own words
(``memory.extract.ungrounded_identifiers``).
"""

from __future__ import annotations

from collections.abc import Iterable

from memory.words import identifiers, terms


def ungrounded(text: str, sources: Iterable[str]) -> list[str]:
    """The identifiers and content words of ``text`` found in none of ``sources``, sorted.

    Identifiers (``memory.words.identifiers``) must appear verbatim (case aside)
    in a source; every other word beyond stopwords (``memory.words.terms``,
    which also folds a plural ``s``) must be one of a source's words.

    Args:
        text: The derived text (e.g. a merged note's content).
        sources: The texts it was derived from.

    Returns:
        What the sources do not say; empty when ``text`` is grounded.
    """
    pool = [s.lower() for s in sources]
    joined = "\n".join(pool)
    source_terms = {t for s in pool for t in terms(s)}
    missing = {t for t in identifiers(text) if t not in joined}
    missing.update(w for w in terms(text) if w not in source_terms)
    return sorted(missing)

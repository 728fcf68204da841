"""Words: subject keys, search terms and the token estimate, shared by the store and the prompt."""

from __future__ import annotations

import math
import re

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
_TERM = re.compile(r"[a-z0-9]{2,}")  # a one-letter run is never a term

# Words too common to say what a record is about.
STOPWORDS: frozenset[str] = frozenset(
    """
    a about after again all also am an and any are as at be been before being both but by can could did do
    does doing done for from had has have having he her here hers him his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours out over own please
    same she should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with would you
    your yours yourself let lets get got make made use used using want wants tell told say said ok okay
    hi hello hey thanks thank yes yeah sure one
    """.split()
)

MAX_TERM_CHARS = 64
_TOKEN = re.compile(r"[\w.:/@-]+", re.UNICODE)


def subject_key(subject: str) -> str:
    """Normalise a subject so the same topic matches however it is written.

    Lowercase; punctuation, hyphens and underscores become spaces; whitespace
    collapses. ``"Daily report source"`` and ``"daily-report  source"`` give
    the same key.
    """
    return " ".join(_NON_WORD.sub(" ", subject.lower()).split())[:200]


def terms(text: str) -> list[str]:
    """The searchable words of a text, in order, without stopwords or one-letter words.

    A trailing plural ``s`` is dropped (``reports`` -> ``report``) so a
    question finds the note that answers it; a word that is a stopword once
    it is dropped (``uses`` -> ``use``) is left out as the stopword is.
    """
    # One comprehension: the prompt's query terms run this over the conversation on every turn.
    return [
        term
        for word in _TERM.findall(text.lower())
        if word not in STOPWORDS
        and (term := (word[:-1] if len(word) > 3 and word[-1] == "s" and word[-2] != "s" else word)[:MAX_TERM_CHARS])
        not in STOPWORDS
    ]


def identifiers(text: str) -> set[str]:
    """Identifier-like tokens (tables, hosts, paths, addresses, numbers), lowercased.

    A token is one when it carries an underscore, a digit, a dot, a slash, a
    colon or an @ (``example_orders``, ``db01.internal``, ``10.0.0.7``, ``42``).
    """
    found = set()
    for raw in _TOKEN.findall(text.lower()):
        token = raw.strip(".:-/@")
        if len(token) >= 3 and any(c in token for c in "_0123456789./:@"):
            found.add(token)
    return found


def estimate_tokens(text: str) -> int:
    """Tokens a text costs in a prompt, estimated as one per four characters (rounded up)."""
    return math.ceil(len(text) / 4)

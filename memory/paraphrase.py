"""Whether a newly extracted note says the same as a live one in other words.

The issue this answers: an admin's exact ``@notes:`` wording was retired at
the trim by the extractor's paraphrase of the same fact. A paraphrase is no
new value, so it retires nothing: the earlier, more authoritative wording
stays (policy: "a new value for the same subject supersedes the old one").

Pure and conservative: two texts are the same fact only when they name the
same identifiers in the same order (tables, hosts, numbers), negate alike,
and share every meaningful word apart from the few that only link a source
to what it feeds ("uses", "is produced from", "prefers"...). Anything else is
a new value, and the subject rule decides as before.
"""

from __future__ import annotations

import re

from memory.words import terms

_TOKEN = re.compile(r"`[^`]+`|[\w.:/@-]+", re.UNICODE)
_NEGATION = re.compile(
    r"\b(?:not|never|no|none|nothing|without|stop|don't|doesn't|isn't|aren't|instead|rather)\b", re.I
)
# Words that only link a value to its subject; a paraphrase may swap one for another.
_LINKING = frozenset(
    """
    use uses table tables produce produced producing build built generate generated made pull pulled pulls compile
    compiled come comes came read reads reading based source sources data always going forward from now
    prefer prefers preferred like likes wish wishes answer answers reply replies
    """.split()
)


def _identifiers(text: str) -> list[str]:
    """Identifier-like tokens in order of first appearance (an underscore, digit, dot, slash, colon or @)."""
    out: list[str] = []
    for raw in _TOKEN.findall(text.lower()):
        token = raw.strip("`").strip(".:-/@,")
        if len(token) >= 2 and any(c in token for c in "_0123456789./:@") and token not in out:
            out.append(token)
    return out


def _meaning(text: str) -> frozenset[str]:
    return frozenset(t for t in terms(text) if t not in _LINKING)


def same_fact(earlier: str, later: str) -> bool:
    """True when ``later`` restates ``earlier`` in other words (nothing in it is a new value)."""
    if " ".join(earlier.lower().split()) == " ".join(later.lower().split()):
        return True
    if _identifiers(earlier) != _identifiers(later):
        return False
    if sorted(m.lower() for m in _NEGATION.findall(earlier)) != sorted(m.lower() for m in _NEGATION.findall(later)):
        return False
    a, b = _meaning(earlier), _meaning(later)
    return bool(a) and a == b

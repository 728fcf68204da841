"""A decision is a person's: the chat tools that decide act only on the person's own words.

seed 001: identity changes "only by the S5 decision path, when a named person
accepts a proposal", and an obligation ends "when a consumer dispositions" it.
In chat, the model is the one that calls ``identity_decide`` or
``obligation_resolve``; a prompt-injected model in an admin's turn could call
them on its own. So the tool acts only when the admin's own message in this
turn names the item and the decision ("accept ip_3f2a91", "resolve ob_77c1e0
as no-action"): the model can carry out a decision the person typed, never
make one. Pure: it reads the stored text of the person's message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MIN_PREFIX = 6


def _names_item(said: str, item_id: str) -> bool:
    wanted = item_id.lower()
    for token in re.findall(r"[a-z0-9_][a-z0-9_-]*", said.lower()):
        if token == wanted or (len(token) >= MIN_PREFIX and wanted.startswith(token)):
            return True
    return False


def _says(said: str, verbs: Iterable[str]) -> bool:
    low = said.lower()
    return any(re.search(rf"(?<![a-z-]){re.escape(v.lower())}(?![a-z])", low) for v in verbs)


def decision_refusal(said: str, item_id: str, verbs: Iterable[str], example: str) -> str | None:
    """None when ``said`` (the person's own message) names ``item_id`` and one of ``verbs``; else why not.

    Args:
        said: The text of the message the turn answers, as stored (never the model's words).
        item_id: The proposal or obligation the tool was asked to decide (a unique prefix of 6+ counts).
        verbs: Words that state the decision ("accept", "reject", "resolve", a disposition).
        example: How the person would say it, for the refusal.
    """
    if item_id and _names_item(said, item_id) and _says(said, verbs):
        return None
    return (
        f"A decision on {item_id or 'this'} is taken only on the person's own words, not the model's: "
        f"the administrator's message must name it and the decision, for example '{example}'. Nothing was changed."
    )

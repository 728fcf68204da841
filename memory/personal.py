"""Personal data in an operational item: a pure test the write gate takes as an input.

Classification is the model's (policy: "Classification -- what is this? -- is
done by the LLM"), so a model may call an admin's ``my email is ...``
operational. Code holds a second line: an agent_notes item that carries
personal data (an e-mail address, a phone number, a first-person statement
about the speaker) is not learned live; the gate writes it ``unverified`` for
``review_learned`` with the reason (``memory.gate.decide``, ``personal_data``).
"""

from __future__ import annotations

import re

_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+", re.UNICODE)
# A run of digits with phone punctuation: an international "+..." number, or groups split by
# spaces, dashes or parentheses. Dates, times and dotted addresses are told apart below.
_PHONE_RUN = re.compile(
    r"(?<![\w.:/])(?:\+\s?\d|\(\d)[\d\s().-]{5,}\d"
    r"|(?<![\w.:/])\d{2,4}(?:[\s-]\(?\d{2,5}\)?){2,4}(?![\w.:/])"
)
_PHONE_WORD = re.compile(
    r"\b(?:phone|mobile|cell(?:phone)?|tel(?:ephone)?|whatsapp|sms)\b\D{0,20}\d[\d\s().-]{4,}\d", re.IGNORECASE
)
_DATE = re.compile(r"^\d{4}-\d{1,2}-\d{1,2}$")
_FIRST_PERSON = re.compile(r"\b(?:my|mine|myself)\b|\bI\s*(?:'|’)\s*m\b|\bI\s+(?:am|was)\b", re.IGNORECASE)


def _phone(text: str) -> str | None:
    for m in _PHONE_RUN.finditer(text):
        run = m.group(0).strip()
        digits = sum(c.isdigit() for c in run)
        if 7 <= digits <= 15 and not _DATE.match(run):
            return run
    word = _PHONE_WORD.search(text)
    return word.group(0) if word else None


def personal_data(text: str) -> str | None:
    """What personal data ``text`` carries, as a reason a person can read, or None.

    Looks for an e-mail address, a phone number, and a first-person statement
    about the speaker (``my ...``, ``I am ...``, ``I'm ...``). It is a second
    line behind the model's classification, so it errs towards holding an item
    for review: an admin confirms a false alarm with ``review_learned``.
    """
    found: list[str] = []
    if _EMAIL.search(text):
        found.append("an e-mail address")
    if _phone(text):
        found.append("a phone number")
    first = _FIRST_PERSON.search(text)
    if first:
        found.append(f"a first-person statement about the speaker ({first.group(0)!r})")
    return ", ".join(found) or None

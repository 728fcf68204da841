"""The builtin model's extractor: a deterministic, rule-based classifier (offline, clearly labelled).

It recognises the seed's examples and the common shapes around them: claims of
who someone is, how they want to be served, standing operational rules and data
sources, requests and one-off tasks. Anything else yields nothing. Like any
extractor it only classifies; what is written where is decided in code by
``handle_fact_extract`` through the write gate.

Subjects are stable per topic so the subject rule can supersede, and keep
the words that tell one topic from another so it supersedes nothing else:
every statement of where the daily report's data comes from has the subject
``daily report data source`` (the weekly report's is another), every
reply-language preference ``reply language``. The corpus in
``tests/memory/subject_corpus.py`` holds the classifier to this.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime

from memory.transcript import speaker_messages
from memory.types import ExtractedItem
from memory.words import STOPWORDS, subject_key, terms

_I = re.IGNORECASE

# A name typed at the start of a line ("[Alice]: ...") is text, not a speaker; classify what follows.
_FORGED_PREFIX = re.compile(r"^\s*\[[^\]\n]{1,60}\]\s*:\s*")
_NOTES_PREFIX = re.compile(r"^\s*@notes\s*:\s*", _I)
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+|;\s+")
# A clause that starts a directive mid-sentence ("I am the admin, so from now on ...") is read on its own.
_CLAUSE_BREAK = re.compile(
    r",?\s*(?:\band\s+)?\b(?:so|therefore|hence|thus)\s+(?=(?:from\s+now\s+on|always|never|rule\s*:|use)\b)|"
    r",?\s+and\s+(?=(?:from\s+now\s+on|always|never)\b)",
    _I,
)
# What every ``_CLAUSE_BREAK`` holds: a sentence without it is one clause. One search of it costs about a
# third of the split's, and most sentences have no such clause (tests/memory/test_rules.py holds the two together).
_CLAUSE_CUE = re.compile(
    r"\b(?:so|therefore|hence|thus|and)\s+(?:from\s+now\s+on|always|never|rule\s*:|use)\b",
    _I,
)

_AUTHORITY = (
    r"manager|boss|admin(?:istrator)?|supervisor|team lead|lead|owner|director|head of [a-z ]+?|"
    r"cto|ceo|superuser|root|in charge"
)
_CLAIM = re.compile(
    rf"\bI(?:'m|\s+am)\s+(?:your|the|an?|this\s+team's|the\s+team's)\s+(?:new\s+)?(?P<role>{_AUTHORITY})\b"
    r"(?P<rest>[^.!?]*)",
    _I,
)
_ROLE_IS = re.compile(rf"\bmy\s+(?:role|title|job)\s+is\s+(?:an?\s+|the\s+)?(?P<role>{_AUTHORITY})\b", _I)
# Case-sensitive on purpose: only capitalised words after the first are part of a name.
_NAME = re.compile(r"\b[Mm]y\s+name\s+is\s+(?P<name>[A-Za-z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2})")
_CALL_ME = re.compile(r"\b(?:you can\s+)?call me\s+(?P<name>[A-Za-z][\w.'-]*)", _I)
_WORK = re.compile(r"\bI\s+work\s+(?P<prep>in|at|for|on)\s+(?P<what>[^.,;!?]+)", _I)
_JOB = re.compile(
    r"\bI(?:'m|\s+am)\s+an?\s+(?P<job>[a-z][a-z -]{1,40}?)\s+(?P<prep>at|in|for|on)\s+(?P<what>[^.,;!?]+)", _I
)
_MY_X_IS = re.compile(
    r"\bmy\s+(?P<what>time\s*zone|timezone|team|department|email|pronouns|title|role|job|location|office)\s+"
    r"(?:is|are)\s+(?P<value>[^.,;!?]+)",
    _I,
)
_BASED = re.compile(r"\bI(?:'m|\s+am)\s+(?:based|located)\s+in\s+(?P<where>[^.,;!?]+)", _I)
_LANGUAGES = (
    r"english|french|german|spanish|italian|portuguese|dutch|polish|swedish|norwegian|danish|finnish|czech|greek|"
    r"turkish|russian|ukrainian|japanese|chinese|mandarin|korean|arabic|hebrew|hindi|indonesian|vietnamese|thai"
)
_LANGUAGE = re.compile(
    rf"\b(?:answer|reply|respond|write|speak|talk)(?:\s+to)?(?:\s+me)?\s+(?:only\s+)?in\s+(?P<lang>{_LANGUAGES})\b",
    _I,
)
_LANGUAGE_NAME = re.compile(rf"\bin\s+(?:{_LANGUAGES})\b", _I)
_PREFER = re.compile(r"\bI\s+(?:prefer|like|(?:would|'d)\s+(?:prefer|like))\s+(?!you\b)(?P<what>[^.;!?]+)", _I)
_STYLE = re.compile(
    r"\b(?:be|keep\s+it|keep\s+(?:your\s+)?answers)\s+(?P<how>brief|short|concise|detailed|formal|casual)\b", _I
)
# A word that each pattern ``_personal`` reads starts with, followed there by a space or an apostrophe: a
# sentence without one (most requests and procedures) is nothing personal, and one search says so where
# eleven did (tests/memory/test_rules.py holds the patterns to it).
_PERSONAL_CUE = re.compile(r"\b(?:I|my|call|answer|reply|respond|write|speak|talk|be|keep)\b", _I)
_DIRECTIVE = re.compile(
    r"^\s*(?:rule\s*:|from\s+now\s+on\b|going\s+forward\b|as\s+of\s+now\b|always\b|never\b|"
    r"(?:please\s+)?(?:make\s+sure\s+to|remember\s+to|remember\s+that)\b)\s*,?\s*",
    _I,
)
_YOU_WILL = re.compile(
    r"\byou\s+(?:will|should|must|need\s+to|are\s+to|have\s+to)\s+(?P<verb>produce|generate|build|make|create|compile|"
    r"prepare|write|run|pull|assemble)\s+(?P<obj>[^.!?]*?)\s+(?P<prep>from|using|out\s+of|based\s+on|with)\s+"
    r"(?P<src>[^.!?]+)",
    _I,
)
_SOURCE_IS = re.compile(
    r"\b(?P<noun>report|dashboard|export|summary|forecast)\b[^.!?]*?(?:=|\bis\s+(?:produced|built|generated|made|"
    r"pulled|compiled)\s+from|\b(?:comes|come)\s+from|\buses|\breads\s+from|\bsource\s+is|\bis\s+based\s+on)\s+"
    r"(?P<src>[^.!?]+)",
    _I,
)
_IDENTIFIER = re.compile(r"`[^`]+`|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z]\w*\.[a-z]\w*\b", _I)
_HOST = re.compile(
    r"(?<![@\w.-])(?:\d{1,3}(?:\.\d{1,3}){3}|[a-z0-9-]+(?:\.[a-z0-9-]+)*\.(?:com|net|org|io|internal|local|lan|corp|cloud|dev))\b",
    _I,
)
_DATA_WORD = re.compile(
    r"\b(?:use[sd]?|using|from|source|tables?|reads?|quer(?:y|ies)|pulls?|instead\s+of|rather\s+than|not)\b", _I
)
_PRODUCT = re.compile(r"\b(report|dashboard|export|summary|forecast|invoice)s?\b", _I)
# Words that say where data comes from, without "table" (a statement about a table is about that table).
_USE_WORD = re.compile(r"\b(?:use[sd]?|using|from|source|reads?|quer(?:y|ies)|pulls?|instead\s+of|rather\s+than)\b", _I)
_MAX_QUALIFIERS = 2
_NOT_QUALIFIERS = frozenset(
    "this that these those new current old today today's tomorrow's yesterday's every each whole same "
    "produce generate build run create compile prepare pull assemble send".split()
)
_THING_IS = re.compile(
    r"^\s*(?:the\s+|our\s+)?(?P<thing>[a-z][a-z0-9 _-]{2,40}?)\s+(?:is|are|lives\s+(?:on|at))\s+(?P<value>.+)$", _I
)
_IMPERATIVE = re.compile(
    r"^\s*(?:(?:please|kindly)\s+|(?:can|could|would|will)\s+you\s+(?:please\s+)?|I\s+(?:need|want)\s+you\s+to\s+)?"
    r"(?P<verb>produce|generate|run|make|create|compile|prepare|send|show|give|get|fetch|pull|summari[sz]e|write|draft|"
    r"check|list|find|email|post|build|do|update|book|schedule|remind|translate|calculate|count)\b(?P<rest>[^?]*)",
    _I,
)
_KNOWN_PROCEDURE = re.compile(r"\b(report|dashboard|export|summary|forecast)s?\b", _I)


def _clean(text: str) -> str:
    return " ".join(text.strip().strip(",.;:!?… ").split())


# "yourself", "your" and "you" as words. Which one matched is told by its length: case-insensitive
# matching is one character for one ("YOURſELF" is "yourself"), so lowercasing the match would not tell.
_SECOND_PERSON = re.compile(r"\b(?:yourself|your|you)\b", _I)
_THIRD_PERSON = {len("yourself"): "itself", len("your"): "the agent's", len("you"): "the agent"}


def _third_person(text: str) -> str:
    return _SECOND_PERSON.sub(lambda m: _THIRD_PERSON[len(m.group())], text)


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        clauses = _CLAUSE_BREAK.split(sentence) if _CLAUSE_CUE.search(sentence) else (sentence,)
        out.extend(c for c in (_clean(x) for x in clauses) if c)
    return out


def is_directive(text: str) -> bool:
    """True for a standing instruction: ``rule: ...``, ``from now on ...``, ``always ...``, ``@notes: ...``."""
    body = _FORGED_PREFIX.sub("", text)
    return bool(_NOTES_PREFIX.match(body) or _DIRECTIVE.match(body))


def _product_name(text: str) -> str | None:
    """The product a statement is about with the words that tell it apart: ``daily report``, ``sales dashboard``.

    Only the words right before the product noun count ("the weekly report",
    "our finance export"); articles, "this", "new" and the like do not, so
    "this report" and "the report" are both ``report``.
    """
    product = _PRODUCT.search(text)
    if product is None:
        return None
    words = re.findall(r"[a-z][a-z0-9-]*", text[: product.start()].lower())
    qualifier: list[str] = []
    for word in reversed(words[-_MAX_QUALIFIERS:]):
        if word in STOPWORDS or word in _NOT_QUALIFIERS:
            break
        qualifier.insert(0, word)
    return " ".join([*qualifier, product.group(1).lower()])


def operational_subject(text: str) -> str:
    """A stable subject for an operational statement (used by ``@notes:`` too).

    Data-source statements (tables, ``use X instead of Y``) are
    ``<product> data source``, the product named with the words that tell it
    apart (``daily report data source`` and ``weekly report data source`` are
    two subjects; ``report data source`` when no product is named); a
    statement about a table, host or server names it; otherwise the thing the
    statement is about, or its first words.
    """
    body = _DIRECTIVE.sub("", _NOTES_PREFIX.sub("", text), count=1)
    hosts = _HOST.findall(body)
    idents = [i for i in _IDENTIFIER.findall(body) if not _HOST.fullmatch(i.strip("`"))]
    product = _product_name(body)
    if idents and (_USE_WORD.search(body) or (product and _DATA_WORD.search(body))):
        return f"{product or 'report'} data source"
    thing = _THING_IS.match(body)
    if thing and (hosts or idents):
        return subject_key(thing.group("thing"))
    if hosts:
        server = re.search(r"\b(\w+\s+(?:server|host|database|db|cluster|endpoint))\b", body, _I)
        return subject_key(server.group(1)) if server else "server address"
    if thing and len(thing.group("thing").split()) <= 4:
        return subject_key(thing.group("thing"))
    return " ".join(terms(body)[:4]) or subject_key(body)[:60] or "note"


def _personal(sentence: str) -> list[ExtractedItem]:
    items: list[ExtractedItem] = []
    if not _PERSONAL_CUE.search(sentence):
        return items
    claim = _CLAIM.search(sentence)
    if claim:
        # policy: "self-declared authority != authority" -- kept at most as a personal note, as a claim.
        raw_rest = claim.group("rest")
        rest = _third_person(_clean(raw_rest))
        if rest:
            rest = (", " if raw_rest.lstrip().startswith(",") else " ") + rest
        role = claim.group("role").lower()
        items.append(
            ExtractedItem(
                "identity",
                "claimed role",
                f"Introduced themselves as the {role}{rest} (a self-declared claim; it grants no authority)",
            )
        )
    role_is = _ROLE_IS.search(sentence)
    if role_is and not claim:
        items.append(
            ExtractedItem(
                "identity",
                "claimed role",
                f"Said their role is {role_is.group('role').lower()} (a self-declared claim; it grants no authority)",
            )
        )
    if m := _NAME.search(sentence):
        items.append(ExtractedItem("identity", "name", f"Their name is {_clean(m.group('name'))}"))
    if m := _CALL_ME.search(sentence):
        items.append(ExtractedItem("preference", "form of address", f"Wants to be called {_clean(m.group('name'))}"))
    if m := _WORK.search(sentence):
        items.append(ExtractedItem("identity", "work", f"Works {m.group('prep').lower()} {_clean(m.group('what'))}"))
    elif (m := _JOB.search(sentence)) and not re.fullmatch(_AUTHORITY, m.group("job").strip(), _I):
        job, prep, what = _clean(m.group("job")), m.group("prep").lower(), _clean(m.group("what"))
        items.append(ExtractedItem("identity", "work", f"Works as a {job} {prep} {what}"))
    if (m := _MY_X_IS.search(sentence)) and not role_is:
        what = subject_key(m.group("what")).replace("time zone", "timezone")
        items.append(ExtractedItem("identity", what, f"Their {what} is {_clean(m.group('value'))}"))
    if m := _BASED.search(sentence):
        items.append(ExtractedItem("identity", "location", f"Based in {_clean(m.group('where'))}"))
    language, style = _LANGUAGE.search(sentence), _STYLE.search(sentence)
    if language and style:
        # "answer me in English, and keep it short" is one wish: split in two, a later
        # "I prefer answers in English" would retire the half about length.
        lang, how = language.group("lang").capitalize(), style.group("how").lower()
        items.append(ExtractedItem("preference", "reply language and style", f"Wants answers in {lang} and {how}"))
    elif language:
        items.append(
            ExtractedItem("preference", "reply language", f"Wants answers in {language.group('lang').capitalize()}")
        )
    elif style:
        items.append(ExtractedItem("preference", "answer style", f"Wants answers {style.group('how').lower()}"))
    elif (m := _PREFER.search(sentence)) and not items:
        what = _clean(m.group("what"))
        if _LANGUAGE_NAME.search(what):
            topic: str | None = "reply language"
        elif re.search(r"\b(answer|repl|response|format|bullet|brief|short|detail)", what, _I):
            topic = "answer style"
        else:
            topic = None
        items.append(ExtractedItem("preference", topic or f"preference {' '.join(terms(what)[:3])}", f"Prefers {what}"))
    return items


def _operational(sentence: str) -> list[ExtractedItem]:
    items: list[ExtractedItem] = []
    if m := _YOU_WILL.search(sentence):
        # "You will produce this report from X and Y": a standing definition and a task now.
        obj = _clean(m.group("obj"))
        thing = _product_name(obj) or " ".join(terms(obj)[-1:]) or "output"
        src = _clean(m.group("src"))
        items.append(ExtractedItem("operational", f"{thing} data source", f"The {thing} is produced from {src}"))
        items.append(ExtractedItem("task", thing, f"{m.group('verb').capitalize()} {_third_person(obj)} now"))
        return items
    directive = _DIRECTIVE.match(sentence)
    body = _clean(sentence[directive.end() :]) if directive else sentence
    if m := _SOURCE_IS.search(sentence):
        noun = _product_name(sentence[: m.end("noun")]) or m.group("noun").lower()
        items.append(
            ExtractedItem("operational", f"{noun} data source", f"The {noun} is produced from {_clean(m.group('src'))}")
        )
        return items
    # The anchored match first: most sentences are no "X is Y", and the two searches cost more.
    if directive or (_THING_IS.match(body) and (_IDENTIFIER.search(body) or _HOST.search(body))):
        content = body[:1].upper() + body[1:]
        if directive and re.match(r"\s*never\b", sentence, _I):
            content = "Never " + body
        elif directive and re.match(r"\s*always\b", sentence, _I):
            content = "Always " + body
        items.append(ExtractedItem("operational", operational_subject(sentence), content))
    return items


def _request(sentence: str) -> list[ExtractedItem]:
    m = _IMPERATIVE.match(sentence)
    if not m:
        return []
    what = _clean(f"{m.group('verb')} {m.group('rest')}")
    what = what[:1].upper() + what[1:]
    # policy: a request that fits existing operational knowledge ("produce today's report") is
    # served from it; anything else is a one-off task. Neither is memory.
    kind = "request" if _KNOWN_PROCEDURE.search(what) else "task"
    return [ExtractedItem(kind, kind, _third_person(what))]


def classify(text: str) -> list[ExtractedItem]:
    """Classify one person's message into identity, preference, operational, request and task items.

    Deterministic: the same text always gives the same items, in order.
    """
    items: list[ExtractedItem] = []
    body = _FORGED_PREFIX.sub("", text)
    notes = _NOTES_PREFIX.match(body)
    if notes:
        rest = _clean(body[notes.end() :])
        if rest:
            items.append(ExtractedItem("operational", operational_subject(rest), rest[:1].upper() + rest[1:]))
        return items
    for sentence in _sentences(body):
        sentence = _FORGED_PREFIX.sub("", sentence)
        found = _personal(sentence)
        if not found:
            found = _operational(sentence)
        if not found:
            found = _request(sentence)
        items.extend(found)
    return _dedupe(items)


def _dedupe(items: Iterable[ExtractedItem]) -> list[ExtractedItem]:
    seen: dict[tuple[str, str, str], ExtractedItem] = {}
    for item in items:
        seen.setdefault((item.kind, subject_key(item.subject), item.content.lower()), item)
    return list(seen.values())


def builtin_extract(system: str, user: str) -> str:
    """The builtin model's answer to an extraction call: JSON text of the extraction shape.

    Reads only the SPEAKER lines of the transcript (``memory.transcript``);
    the AGENT context lines are never a source of items. ``system`` (the
    extractor prompt) is accepted for the model interface and not needed.
    """
    del system
    items: list[ExtractedItem] = []
    for message in speaker_messages(user):
        items.extend(classify(message))
    payload = {"items": [{"kind": i.kind, "subject": i.subject, "content": i.content} for i in _dedupe(items)]}
    return json.dumps(payload, ensure_ascii=False)


# ---- the builtin judge and consolidation model -------------------------------------------------

# "use X instead of Y", "we no longer use Y": the phrase after the marker names the value it replaces.
_REPLACES_VALUE = re.compile(
    r"\b(?:instead\s+of|no\s+longer(?:\s+(?:use[sd]?|using|read(?:s|ing)?|pull(?:s|ing)?|go(?:es)?\s+to|from|with|is|are))*)"
    r"\s+(?P<old>[^.;,!?\n]+)",
    _I,
)
_ARTICLES = frozenset({"a", "an", "the"})


def _names_old_value(newer: str, older: str) -> bool:
    """True when ``newer`` says "instead of X" / "no longer X" and X's words are all in ``older``."""
    have = set(terms(older))
    for m in _REPLACES_VALUE.finditer(newer):
        named = set(terms(m.group("old")))
        if named and named <= have:
            return True
    return False


def _when(said_at: str) -> datetime:
    try:
        at = datetime.fromisoformat(said_at)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _records_of(user: str, key: str) -> list[dict[str, str]]:
    try:
        data = json.loads(user)
    except ValueError:
        return []
    value = data.get(key) if isinstance(data, dict) else None
    items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    out: list[dict[str, str]] = []
    for item in items:
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("id", "content", "said_at")):
            out.append({k: str(item.get(k) or "") for k in ("id", "subject", "content", "said_at")})
    return out


def builtin_revision_judgement(system: str, user: str) -> str:
    """The builtin model's judge (``revision_judgement``): conservative, deterministic.

    A candidate is replaced only when it is on the same normalised subject as
    the record, or when the later of the two says "instead of X" / "no longer
    X" and X's words are all in the earlier one. The later one (by ``said_at``)
    replaces the earlier; everything else is ``unrelated``. ``system`` (the
    judge prompt) is accepted for the model interface and not needed.
    """
    del system
    records = _records_of(user, "record")
    if not records:
        return json.dumps({"decisions": []})
    record = records[0]
    decisions: list[dict[str, str]] = []
    for cand in _records_of(user, "candidates"):
        relation, reason = "unrelated", "different topics"
        if _when(cand["said_at"]) != _when(record["said_at"]):
            record_later = _when(record["said_at"]) > _when(cand["said_at"])
            newer, older = (record, cand) if record_later else (cand, record)
            if subject_key(cand["subject"]) == subject_key(record["subject"]) and subject_key(record["subject"]):
                relation, reason = "replaces" if record_later else "replaced_by", "same subject, said later"
            elif _names_old_value(newer["content"], older["content"]):
                relation = "replaces" if record_later else "replaced_by"
                reason = "the later one names the earlier value it replaces"
        decisions.append({"record_id": cand["id"], "relation": relation, "reason": reason})
    return json.dumps({"decisions": decisions}, ensure_ascii=False)


def same_note_key(content: str) -> str:
    """What two notes must share to be the same note for the builtin consolidation model.

    Case, punctuation, spacing and articles do not count; every other word
    does, negations included ("use X" and "do not use X" stay apart).
    """
    return " ".join(w for w in subject_key(content).split() if w not in _ARTICLES)


def builtin_consolidation_result(system: str, user: str) -> str:
    """The builtin model's consolidation (``consolidation_result``): merges only identical notes.

    Notes whose content is the same apart from case, punctuation, spacing and
    articles are merged into one, worded as the latest of them (by
    ``said_at``). Nothing else is merged. ``system`` is accepted for the model
    interface and not needed.
    """
    del system
    groups: dict[str, list[dict[str, str]]] = {}
    for note in _records_of(user, "records"):
        key = same_note_key(note["content"])
        if key:
            groups.setdefault(key, []).append(note)
    merges = []
    for same in groups.values():
        if len(same) < 2:
            continue
        latest = max(same, key=lambda n: (_when(n["said_at"]), n["id"]))
        merges.append(
            {
                "record_ids": [n["id"] for n in same],
                "subject": latest["subject"],
                "content": latest["content"],
                "reason": "the same note, worded the same",
            }
        )
    return json.dumps({"merges": merges}, ensure_ascii=False)

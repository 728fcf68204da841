"""The session archive's markdown: written so no field can forge a line, read so nothing is guessed.

An archive is read back by ``goclaw memory relearn``, and what it says about
who spoke with which role decides what is learned under whose authority. So
the format carries every field a person controls (message id, display name,
text, the conversation and thread ids of the header, the summary) ESCAPED:

- ``\\`` -> ``\\\\``, newline -> ``\\n``, ``[`` -> ``\\[``, ``]`` -> ``\\]``;
- every other character that could end a line or hide in one (controls,
  line and paragraph separators, format characters, surrogates, unassigned
  and private-use code points) -> ``\\u{hex}``.

An escaped value therefore has no line break and no bracket, so it cannot end
its line, close its field or open another. The reader takes a field only
when it is exactly what the writer would have written for the value it
decodes to (:func:`decode_field` re-encodes and compares): anything else is an
unreadable line, left out and reported, never guessed at.

Format versions (the ``**Format**:`` header line):

- **2** (this module, :data:`ARCHIVE_FORMAT`): all of the above.
- **1** (archives written before, no ``**Format**:`` line): the text escaped
  ``\\`` and newline only, the name had ``]`` replaced, the message id and the
  header were written raw. Such an archive is still read, but only when it is
  whole: every message line reads, none carries another line's field markers,
  the lines match the header's ``**Messages**:`` count and there is one
  messages section. Otherwise a field may have forged a line, and the whole
  archive is refused (it is not relearned, and the report says why).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime

from msgspec import Struct, field

from memory.types import SliceMessage

ARCHIVE_FORMAT = 2
FORMAT_LINE = f"- **Format**: goclaw-archive {ARCHIVE_FORMAT}"

# Categories whose characters are always escaped: controls (incl. CR, NEL, the FS/GS/RS
# separators str.splitlines() breaks on), format characters (bidi overrides, zero-width),
# surrogates, private use, unassigned, and the line / paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT = {"\\": "\\\\", "\n": "\\n", "[": "\\[", "]": "\\]"}  # the backslash first: see encode_field
_UNSHORT = {"\\": "\\", "n": "\n", "[": "[", "]": "]"}
NONE_MARK = "-"
AGENT_MARK = "agent"
_RESERVED = (NONE_MARK, AGENT_MARK)


class FieldError(ValueError):
    """A field is not exactly what the writer writes for any value."""


def _code(ch: str) -> str:
    return f"\\u{{{ord(ch):x}}}"


def encode_field(value: str) -> str:
    """A value escaped so it holds no line break, no bracket and no control character.

    The whole values ``-`` and ``agent`` are reserved marks (no user, the
    agent), so as a value their first character is written ``\\u{..}``.
    """
    # The short escapes first, the backslash before the others (whose escapes add backslashes). What
    # they write is printable and never escaped again, so only a value still holding an unprintable
    # character is walked for the escaped categories (str.isprintable is False for each of them, and
    # for the spaces other than " ", which come out of the walk unchanged).
    out = value
    for ch, escape in _SHORT.items():
        out = out.replace(ch, escape)
    if not out.isprintable():
        out = "".join(_code(ch) if unicodedata.category(ch) in _ESCAPED_CATEGORIES else ch for ch in out)
    if out in _RESERVED:
        out = _code(out[0]) + out[1:]
    return out


_ESCAPE = re.compile(r"\\(?:u\{([0-9a-f]{1,6})\}|(.))", re.DOTALL)


def decode_field(raw: str) -> str:
    """The value ``raw`` encodes; only a canonical encoding is accepted.

    Raises:
        FieldError: an unknown escape, an out-of-range code point, or a raw
            character the writer would have escaped.
    """
    parts: list[str] = []
    pos = 0
    for m in _ESCAPE.finditer(raw):
        parts.append(raw[pos : m.start()])
        if m.group(1) is not None:
            code = int(m.group(1), 16)
            if code > 0x10FFFF:
                raise FieldError(f"escape \\u{{{m.group(1)}}} is not a character")
            parts.append(chr(code))
        elif m.group(2) in _UNSHORT:
            parts.append(_UNSHORT[m.group(2)])
        else:
            raise FieldError(f"unknown escape \\{m.group(2)!r}")
        pos = m.end()
    parts.append(raw[pos:])
    value = "".join(parts)
    # Exactly what the writer writes for this value, or it was not written by the writer.
    if encode_field(value) != raw:
        raise FieldError("not written the way the archive writes this value")
    return value


# ---- writing ------------------------------------------------------------------------------


def _optional(value: str | None) -> str:
    return NONE_MARK if value is None else encode_field(value)


def message_line(m: SliceMessage) -> str:
    """One message as its archive line (format 2)."""
    speaker = AGENT_MARK if m.is_agent else _optional(m.user_id or None)
    return (
        f"- [{m.said_at.isoformat()}] [msg:{encode_field(m.message_id)}] [user:{speaker}] "
        f"[role:{_optional(m.stored_role)}] [name:{encode_field(m.display_name)}] {encode_field(m.text)}"
    )


def render_archive_markdown(
    *,
    archive_id: str,
    session_id: str,
    channel: str,
    conversation_id: str,
    thread_id: str,
    messages: Sequence[SliceMessage],
    trust: str,
    summary: str,
) -> str:
    """The markdown document of a trimmed slice (format 2): a header, the summary, one line per message."""
    where = " / ".join(encode_field(v) for v in (channel, conversation_id))
    if thread_id:
        where += f" / thread {encode_field(thread_id)}"
    lines = [
        f"# Session archive {encode_field(archive_id)}",
        "",
        FORMAT_LINE,
        f"- **Session**: {encode_field(session_id)} ({where})",
        f"- **From**: {messages[0].said_at.isoformat()}",
        f"- **To**: {messages[-1].said_at.isoformat()}",
        f"- **Trust**: {encode_field(trust)}",
        f"- **Messages**: {len(messages)}",
        "",
        "## Summary",
        "",
        # Quoted: an escaped value has no line break, and quoted it cannot start a "## " section either.
        "> " + encode_field(summary),
        "",
        "## Messages",
        "",
    ]
    lines.extend(message_line(m) for m in messages)
    return "\n".join(lines) + "\n"


# ---- reading ------------------------------------------------------------------------------

_FIELD = r"(?:[^\\\[\]]|\\.)*"
_MESSAGE_V2 = re.compile(
    rf"^- \[(?P<at>[0-9T:.+\-]+)\] \[msg:(?P<mid>{_FIELD})\] \[user:(?P<user>{_FIELD})\] "
    rf"\[role:(?P<role>{_FIELD})\] \[name:(?P<name>{_FIELD})\] (?P<text>{_FIELD})$"
)
_MESSAGE_V1 = re.compile(
    r"^- \[(?P<at>[^\]]+)\] \[msg:(?P<mid>[^\]]*)\] \[user:(?P<user>[^\]]*)\] \[role:(?P<role>[^\]]*)\] "
    r"\[name:(?P<name>[^\]]*)\] ?(?P<text>.*)$"
)
# A format-1 line whose text (or id) carries another line's field markers may be two lines in one.
_V1_MARKERS = re.compile(r"\[(?:msg|user|role|name):")
_TITLE = re.compile(r"^#\s+Session archive\s+(?P<id>\S+)\s*$")
_HEADER = re.compile(r"^-\s+\*\*(?P<key>[A-Za-z]+)\*\*:\s*(?P<value>.*?)\s*$")
_FORMAT_VALUE = re.compile(r"^goclaw-archive (?P<n>\d+)$")


def _exact_time(value: str) -> datetime:
    at = datetime.fromisoformat(value)
    if at.tzinfo is None or at.isoformat() != value:
        raise ValueError(f"time {value!r} is not the archive's ISO form")
    return at


def _v1_time(value: str) -> datetime:
    at = datetime.fromisoformat(value.strip())
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _v1_unescape(text: str) -> str:
    # Format 1 escaped "\" as "\\" and a newline as "\n", nothing else.
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "n\\":
            out.append("\n" if text[i + 1] == "n" else "\\")
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_message_line(line: str) -> SliceMessage:
    """One format-2 message line, read exactly.

    Raises:
        FieldError: the line is not one the archive writes (the reason says where).
    """
    m = _MESSAGE_V2.match(line)
    if m is None:
        raise FieldError("not a message line of this format")
    try:
        said_at = _exact_time(m.group("at"))
    except ValueError as exc:
        raise FieldError(str(exc)) from None
    user, role = m.group("user"), m.group("role")
    is_agent = user == AGENT_MARK
    try:
        return SliceMessage(
            message_id=decode_field(m.group("mid")),
            user_id=None if is_agent or user == NONE_MARK else decode_field(user),
            stored_role=None if role == NONE_MARK else decode_field(role),
            display_name=decode_field(m.group("name")),
            text=decode_field(m.group("text")),
            said_at=said_at,
            is_agent=is_agent,
        )
    except FieldError as exc:
        raise FieldError(f"a field is not escaped as the archive writes it ({exc})") from None


def _v1_message(line: str) -> SliceMessage:
    m = _MESSAGE_V1.match(line)
    if m is None:
        raise FieldError("not a message line")
    if _V1_MARKERS.search(m.group("text")) or _V1_MARKERS.search(m.group("mid")):
        raise FieldError("carries another line's field markers")
    try:
        said_at = _v1_time(m.group("at"))
    except ValueError:
        raise FieldError("unreadable time") from None
    user, role = m.group("user").strip(), m.group("role").strip()
    is_agent = user == AGENT_MARK
    return SliceMessage(
        message_id=m.group("mid"),
        user_id=None if is_agent or user in ("", NONE_MARK) else user,
        stored_role=None if is_agent or role in ("", NONE_MARK) else role,
        display_name=m.group("name"),
        text=_v1_unescape(m.group("text")),
        said_at=said_at,
        is_agent=is_agent,
    )


class ReadArchive(Struct):
    """What :func:`read_archive` found (``memory.relearn`` turns it into a ``ParsedArchive``)."""

    format: int = 1
    archive_id: str | None = None
    session_id: str | None = None
    trusts: list[str] = field(default_factory=list)
    start_at: datetime | None = None
    end_at: datetime | None = None
    declared_count: list[str] = field(default_factory=list)
    messages: list[SliceMessage] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """``line N: why`` for each line that was not read (and so is not learned)."""
    refused: str | None = None
    """Why the whole archive is not to be relearned (format 1 with signs of a forged line)."""


def _header_value(key: str, raw: str, fmt: int) -> str:
    if fmt < 2:
        return raw
    return decode_field(raw)


def read_archive(markdown: str) -> ReadArchive:
    """Read an archive's markdown (either format) without guessing.

    Only the header (before the first ``##`` section) is read for the
    ``**Format**``/``**Session**``/``**From**``/``**To**``/``**Trust**``/``**Messages**``
    lines, so nothing a person wrote can set them; in format 2 their values
    are escaped, so nothing a person wrote can even reach that part.
    """
    out = ReadArchive()
    lines = markdown.splitlines()
    # The format is decided by the header alone, before any other line is read.
    for line in lines:
        if line.startswith("## "):
            break
        h = _HEADER.match(line)
        if h and h.group("key").lower() == "format":
            fm = _FORMAT_VALUE.match(h.group("value"))
            out.format = int(fm.group("n")) if fm else -1
            break
    if out.format not in (1, ARCHIVE_FORMAT):
        out.refused = "its **Format** line names a format this version does not read"
        return out
    section = "header"
    sections: list[str] = []
    for number, line in enumerate(lines, start=1):
        if section == "header" and (t := _TITLE.match(line)):
            try:
                out.archive_id = _header_value("id", t.group("id"), out.format)
            except FieldError:
                out.unreadable.append(f"line {number}: the archive id is not escaped as the archive writes it")
            continue
        if line.startswith("## "):
            section = line[3:].strip().lower()
            sections.append(section)
            continue
        if section == "header":
            _header_line(out, number, line)
            continue
        if section != "messages" or sections.count("messages") > 1 or not line.strip():
            if section == "messages" and line.strip():
                out.unreadable.append(f"line {number}: a second messages section")
            continue
        try:
            out.messages.append(parse_message_line(line) if out.format >= 2 else _v1_message(line))
        except FieldError as exc:
            out.unreadable.append(f"line {number}: {exc}")
    if out.format < 2:
        _check_v1_whole(out, sections)
    return out


def _header_line(out: ReadArchive, number: int, line: str) -> None:
    h = _HEADER.match(line)
    if not h:
        return
    key, value = h.group("key").lower(), h.group("value")
    try:
        if key == "session" and value:
            out.session_id = _header_value(key, value.split()[0], out.format)
        elif key == "trust":
            out.trusts.append(_header_value(key, value.strip(), out.format).lower())
        elif key == "messages":
            out.declared_count.append(value.strip())
        elif key in ("from", "to") and value:
            at = _exact_time(value) if out.format >= 2 else _v1_time(value)
            if key == "from":
                out.start_at = at
            else:
                out.end_at = at
    except (FieldError, ValueError) as exc:
        out.unreadable.append(f"line {number}: the {key} header is unreadable ({exc})")
        if key == "trust":
            # An unreadable trust line is a trust line nobody can vouch for: read as not admin.
            out.trusts.append("unreadable")


def _check_v1_whole(out: ReadArchive, sections: list[str]) -> None:
    """Refuse a format-1 archive with any sign that a raw field broke its structure."""
    why: list[str] = []
    if out.unreadable:
        why.append(f"{len(out.unreadable)} line(s) cannot be read exactly ({out.unreadable[0]})")
    if sections.count("messages") != 1 or sections.count("summary") > 1:
        why.append("its sections are not one summary and one messages section")
    if len(out.declared_count) > 1:
        why.append("it has more than one **Messages** line")
    elif out.declared_count and out.declared_count[0] != str(len(out.messages)):
        why.append(f"it declares {out.declared_count[0]} messages and holds {len(out.messages)} message lines")
    if why:
        out.refused = (
            "a format-1 archive (written before fields were escaped) that is not whole: "
            + "; ".join(why)
            + ". A field may have forged a line, so nothing in it is relearned"
        )

"""What web clients send, checked once: JSON bodies and frames, chat fields, ids.

Every surface that takes chat input (``POST /v1/chat``, ``/v1/ws`` frames, and the
OpenAI-compatible endpoint) parses with :func:`parse_json` and checks fields with the
``check_*`` functions, so one rule holds everywhere and a refused request is refused
before anything is stored. Every refusal is an :class:`ApiError` (400, or 413 for a
text over the limit) whose message names the field and says what to send instead.

Pure functions: values in, values or ``ApiError`` out.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gateway.web.api_error import ApiError

# Deeper than any body the API takes (an OpenAI chat request is about 5 levels); a
# 5,000-deep body made json.loads raise RecursionError, a 500.
MAX_JSON_DEPTH = 32
# Longer than any number the API takes (an int64 seed has 19 digits); 4,300+ digits
# made int() raise ValueError inside json.loads, a 500.
MAX_NUMBER_DIGITS = 32
MAX_SESSION_CHARS = 200
CHAT_FIELDS = ("session", "text", "message_id")
# Client ids never hold ':' (the gateway's own ids look like '<id>:reply'), spaces or
# brackets (which could break an archive line); see issue 9 items 2 and 7.
MESSAGE_ID_RULE = "1 to 128 characters from A-Z a-z 0-9 . _ ~ - (no spaces, colons or brackets)"
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A JSON string (escapes included), a quote that opens a string never closed, or structure.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*+"|"|[\[\]{}:]', re.DOTALL)


class ChatInput(NamedTuple):
    """One checked chat message: the caller's session name, the text, the client's id (if any)."""

    session: str
    text: str
    message_id: str | None


class LongNumber:
    """A JSON integer with more than ``MAX_NUMBER_DIGITS`` digits, kept unconverted.

    Converting it could raise (Python refuses 4,300+ digits) or cost quadratic time;
    kept as a marker, it fails the type check of whatever field holds it, so the
    refusal names that field.
    """

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"LongNumber({len(self.digits)} digits)"


def _parse_int(s: str) -> int | LongNumber:
    return int(s) if len(s.lstrip("-")) <= MAX_NUMBER_DIGITS else LongNumber(s)


def _quote(name: str) -> str:
    # Names come from the client: shown escaped and short, never raw.
    shown = name if len(name) <= 60 else name[:57] + "..."
    return ascii(shown)


def _pairs(what: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                # Two values for one field: which one a reader takes is ambiguous.
                raise ApiError(400, f"{what} has field {_quote(key)} twice: send each field once")
            out[key] = value
        return out

    return hook


def json_depth_problem(text: str, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``text`` nests too deep to parse safely (naming the top-level field), or None.

    A scan of the raw text, before ``json.loads`` recurses into it. Strings are
    skipped whole, so brackets inside them do not count.
    """
    if text.count("{") + text.count("[") <= max_depth:
        return None  # fewer openers than the limit, strings included: no nesting can pass it (a chat body)
    depth = 0
    top_key: str | None = None
    last_string: str | None = None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok == '"':
            break  # an unterminated string: the JSON is invalid; json.loads reports where
        if tok[0] == '"':
            last_string = tok
        elif tok == ":":
            if depth == 1 and last_string is not None:
                top_key = last_string
        elif tok in "[{":
            depth += 1
            if depth > max_depth:
                where = ""
                if top_key is not None:
                    try:
                        where = f" in field {_quote(json.loads(top_key))}"
                    except ValueError:
                        where = ""
                return (
                    f"is nested more than {max_depth} levels deep{where}: "
                    f"send at most {max_depth} levels of objects and lists"
                )
        else:
            depth -= 1
            if depth == 0:
                top_key = None
    return None


def parse_json(raw: bytes | str, *, what: str = "the body", max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode UTF-8 JSON safely: bounded depth, no huge integer conversion, no duplicate fields.

    Args:
        raw: the request body or frame.
        what: how the refusal names it ("the body", "the frame").
        max_depth: the deepest nesting of objects and lists accepted.

    Raises:
        ApiError: 400 naming what is wrong with the JSON.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                400, f"{what} is not valid UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start}): send UTF-8 JSON"
            ) from None
    else:
        text = raw
    problem = json_depth_problem(text, max_depth)
    if problem is not None:
        raise ApiError(400, f"{what} {problem}")
    try:
        return json.loads(text or "null", parse_int=_parse_int, object_pairs_hook=_pairs(what))
    except json.JSONDecodeError as exc:
        raise ApiError(
            400,
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
            'send a JSON object like {"session": "...", "text": "..."}',
        ) from None
    except RecursionError:  # the depth scan should make this unreachable; never a 500
        raise ApiError(400, f"{what} is nested too deep: send at most {max_depth} levels") from None


def _kind(value: Any) -> str:
    if isinstance(value, LongNumber):
        return f"a number of {len(value.digits)} digits"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return "a string"


def _bad_unicode(field: str, value: str) -> None:
    nul = value.find("\x00")
    if nul >= 0:
        # PostgreSQL cannot store NUL in text; no surface stores it.
        raise ApiError(400, f"field {field!r} contains a NUL character (at position {nul}): remove it")
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            f"field {field!r} contains a lone surrogate ({ascii(value[exc.start])[1:-1]} at position {exc.start}), "
            "which is not text: send valid Unicode (a surrogate only as half of a pair)",
        ) from None


def check_text(field: str, value: Any, *, max_chars: int) -> str:
    """A message text: a non-empty string of valid Unicode without NUL, at most ``max_chars``.

    Raises:
        ApiError: 400 naming the field, or 413 naming ``server.max_message_chars``.
    """
    if value is None:
        raise ApiError(400, f"field {field!r} is missing")
    if not isinstance(value, str):
        raise ApiError(400, f"field {field!r} must be a string, not {_kind(value)}")
    if not value.strip():
        raise ApiError(400, f"field {field!r} is empty")
    if len(value) > max_chars:
        raise ApiError(413, f"field {field!r} is longer than server.max_message_chars ({max_chars} characters)")
    _bad_unicode(field, value)
    return value


def check_session_name(value: Any, *, field: str = "session") -> str:
    """A session name: 1-200 characters, no control characters, NUL or lone surrogates; returned stripped.

    Raises:
        ApiError: 400 naming the field and the rule.
    """
    if value is None:
        raise ApiError(400, f"field {field!r} is missing")
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SESSION_CHARS:
        raise ApiError(400, f"field {field!r} must be a non-empty string of at most {MAX_SESSION_CHARS} characters")
    _bad_unicode(field, value)
    ctrl = _CONTROL.search(value)
    if ctrl is not None:
        raise ApiError(
            400,
            f"field {field!r} contains a control character ({ascii(ctrl.group())[1:-1]} at position {ctrl.start()}): "
            "use printable characters only",
        )
    return value.strip()


def check_message_id(value: Any, *, field: str = "message_id") -> str | None:
    """A client message id (optional): ``MESSAGE_ID_RULE``.

    Raises:
        ApiError: 400 naming the field and the rule.
    """
    if value is None:
        return None
    if not isinstance(value, str) or _MESSAGE_ID.fullmatch(value) is None:
        raise ApiError(400, f"field {field!r} must be {MESSAGE_ID_RULE}")
    return value


def check_known_fields(body: dict[str, Any], known: Sequence[str], *, what: str = "the body") -> None:
    """Refuse fields nobody reads, naming them and listing the known ones (as the YAML config does).

    Raises:
        ApiError: 400 naming each unknown field, with a did-you-mean where one is close.
    """
    unknown = [k for k in body if k not in known]
    if not unknown:
        return
    names = []
    for key in unknown[:5]:
        guess = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        names.append(_quote(key) + (f" (did you mean {guess[0]!r}?)" if guess else ""))
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    noun = "field" if len(unknown) == 1 else "fields"
    raise ApiError(400, f"{what} has unknown {noun} {', '.join(names)}{more}; known fields: {', '.join(known)}")


def validate_chat(body: Any, max_chars: int, *, what: str = "the body") -> ChatInput:
    """Check a parsed chat body ``{"session", "text", "message_id"?}``.

    Raises:
        ApiError: 400 (or 413) naming the field and what to send.
    """
    if not isinstance(body, dict):
        raise ApiError(400, f'{what} must be a JSON object: {{"session": "...", "text": "..."}}, not {_kind(body)}')
    check_known_fields(body, CHAT_FIELDS, what=what)
    session = check_session_name(body.get("session"))
    text = check_text("text", body.get("text"), max_chars=max_chars)
    message_id = check_message_id(body.get("message_id"))
    return ChatInput(session, text, message_id)


def parse_chat(raw: bytes | str, max_chars: int, *, what: str = "the body") -> ChatInput:
    """Parse and check one chat message: the one validation every chat surface uses.

    Raises:
        ApiError: 400 (or 413) naming what was wrong.
    """
    return validate_chat(parse_json(raw, what=what), max_chars, what=what)


def parse_frame(data: str | bytes) -> Any:
    """The JSON of one WebSocket frame (text frames only).

    Raises:
        ApiError: 400 for a binary frame or a frame that is not safe JSON.
    """
    if isinstance(data, bytes):
        raise ApiError(400, "binary frames are not accepted: send each message as a JSON text frame")
    return parse_json(data, what="the frame")


def query_int(query: Mapping[str, str], name: str, *, default: int | None, low: int, high: int) -> int | None:
    """An integer query parameter between ``low`` and ``high``; ``default`` when it is absent.

    Raises:
        ApiError: 400 naming the parameter and its range.
    """
    raw = query.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise ApiError(400, f"{name} must be a whole number from {low} to {high}, not {_quote(raw)}")
    return int(text)

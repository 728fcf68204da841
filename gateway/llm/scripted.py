"""Scripted findings for the offline model: ``FINDING key=value ...`` lines -> ``report_intelligence`` arguments.

A research SOP's instruction (or any message of a research run) may hold lines
like::

    FINDING severity=blocking affects=daily-report subject="orders export" claim="The export drops refunds"
        observation="vendor/export.py skips negative totals" evidence="vendor/export.py:88; release notes 2.4"

(one line each, the keyword at the start of a line or after a space; values
with spaces in double quotes). Keys:

==============  ===========================================================  =========
key             report_intelligence field                                    default
==============  ===========================================================  =========
severity        reported_severity: info, advisory, blocking, critical        required
claim           claim                                                        required
evidence        evidence[]: references separated by ``;``                    required
subject         subject                                                      the claim
observation     observation                                                  the claim
affects         affected_sops[]: SOP names separated by ``,`` (may be empty) none
confidence      confidence: low, medium, high                                medium
rationale       rationale (why this severity)                                none
observed        observed_at (ISO time)                                       now
expires         expires_at (ISO date or time)                                none
==============  ===========================================================  =========

The builtin model calls ``report_intelligence`` once per line, and only when
the tool is offered (a research SOP run); the tool validates the fields.

Likewise ``PROPOSE scope=agent_config subject="boundaries" text="..." rationale="..."``
becomes a ``propose_policy_change`` call when that tool is offered (paired people
and SOP runs), so an identity proposal can be made offline from ``goclaw chat``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

REPORT_TOOL = "report_intelligence"
PROPOSE_TOOL = "propose_policy_change"
SCRIPTED_TOOLS = frozenset({REPORT_TOOL, PROPOSE_TOOL})
# The keyword starts a line or follows a space (a runner may put the SOP's instruction after a prefix);
# the rest of that line is the finding.
_LINE = re.compile(r"(?m)(?:^|(?<=\s))FINDING\s+(.+)$")
_PROPOSE = re.compile(r"(?m)(?:^|(?<=\s))PROPOSE\s+(.+)$")


def _pairs(body: str) -> dict[str, str]:
    try:
        words = shlex.split(body)
    except ValueError:
        # Unbalanced quotes: pass on what can be read; the tool names the field that is wrong.
        words = body.split()
    out: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if eq:
            out[key.strip().lower()] = value.strip()
    return out


def finding_arguments(body: str) -> dict[str, Any]:
    """The ``report_intelligence`` arguments of one ``FINDING`` line's body (after the word FINDING)."""
    kv = _pairs(body)
    claim = kv.get("claim", "")
    args: dict[str, Any] = {
        "subject": kv.get("subject") or claim[:80],
        "claim": claim,
        "observation": kv.get("observation") or claim,
        "evidence": [e.strip() for e in kv.get("evidence", "").split(";") if e.strip()],
        "confidence": kv.get("confidence", "medium"),
        "reported_severity": kv.get("severity", ""),
        "affected_sops": [a.strip() for a in kv.get("affects", "").split(",") if a.strip()],
    }
    for key, field in (("rationale", "rationale"), ("observed", "observed_at"), ("expires", "expires_at")):
        if kv.get(key):
            args[field] = kv[key]
    return args


def scripted_findings(text: str) -> list[dict[str, Any]]:
    """Every ``FINDING`` line of ``text``, as ``report_intelligence`` arguments, in order."""
    return [finding_arguments(m.group(1)) for m in _LINE.finditer(text)]


def scripted_proposals(text: str) -> list[dict[str, Any]]:
    """Every ``PROPOSE`` line of ``text``, as ``propose_policy_change`` arguments, in order."""
    out: list[dict[str, Any]] = []
    for m in _PROPOSE.finditer(text):
        kv = _pairs(m.group(1))
        out.append({k: kv.get(k, "") for k in ("scope", "subject", "text", "rationale")})
    return out


def scripted_calls(text: str, offered: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls the offline model makes for ``text``: only for tools that were offered."""
    calls: list[tuple[str, dict[str, Any]]] = []
    if REPORT_TOOL in offered:
        calls += [(REPORT_TOOL, args) for args in scripted_findings(text)]
    if PROPOSE_TOOL in offered:
        calls += [(PROPOSE_TOOL, args) for args in scripted_proposals(text)]
    return calls

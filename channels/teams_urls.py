"""Which Bot Framework service URLs the Teams adapter may send to.

An activity's ``serviceUrl`` is where its reply goes. Taken as it comes, a
hostile activity (or a forged one in Emulator mode) makes the gateway post to
any host, a local Redis included. Replies and proactive sends go only to
service URLs matching an allowed entry.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

DEFAULT_ALLOWED_SERVICE_URLS: tuple[str, ...] = (
    # The public Bot Framework / Teams service hosts. The regional variants of
    # smba.trafficmanager.net (/amer/, /emea/, /apac/, /in/, /teams/ ...) are paths under it.
    "https://smba.trafficmanager.net/",
    "https://*.botframework.com/",
    # Microsoft 365 Government clouds (GCC, GCC High, DoD).
    "https://smba.infra.gcc.teams.microsoft.com/",
    "https://smba.infra.gov.teams.microsoft.us/",
    "https://smba.infra.dod.teams.microsoft.us/",
)


def _parts(url: str) -> tuple[str, str, int, str] | None:
    try:
        u = urlsplit(url.strip())
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname or u.username is not None or u.password is not None:
        return None
    return u.scheme, u.hostname.lower().rstrip("."), port or (443 if u.scheme == "https" else 80), u.path or "/"


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".botframework.com"
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def service_url_allowed(url: str, allowed: Collection[str]) -> bool:
    """Whether ``url`` falls under one of ``allowed``.

    An entry is a URL prefix: same scheme, same host (``*.`` matches any
    subdomain), same port (the scheme's default when none is written), and a
    path that starts with the entry's path. URLs with user info are refused:
    ``https://smba.trafficmanager.net@127.0.0.1/`` is a request to 127.0.0.1.
    """
    got = _parts(url)
    if got is None:
        return False
    scheme, host, port, path = got
    for entry in allowed:
        want = _parts(entry.replace("*.", "wildcard-marker.", 1)) if "*." in entry else _parts(entry)
        if want is None:
            continue
        w_scheme, w_host, w_port, w_path = want
        w_host = w_host.replace("wildcard-marker.", "*.", 1)
        prefix = w_path if w_path.endswith("/") else w_path + "/"
        if (
            scheme == w_scheme
            and port == w_port
            and _host_matches(w_host, host)
            and (path == w_path.rstrip("/") or path.startswith(prefix) or w_path == "/")
        ):
            return True
    return False


def invalid_entries(allowed: Collection[str]) -> list[str]:
    """Entries that are not http(s) URL prefixes (for config validation)."""
    bad = []
    for entry in allowed:
        probe = entry.replace("*.", "wildcard-marker.", 1)
        if _parts(probe) is None:
            bad.append(entry)
    return bad

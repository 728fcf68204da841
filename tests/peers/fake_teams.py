"""Local Bot Framework peers for Teams tests: the connector, the token service, activities.

Everything speaks the real wire format on 127.0.0.1 and runs in its own thread,
because botbuilder reaches these services with blocking ``requests`` calls, some
of them from the event loop's thread.

Typical use (see ``tests/channels/test_teams.py``)::

    with FakeConnector() as connector, BotFrameworkIdentity() as identity:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", identity.ca_bundle)
        adapter = make_teams_adapter(handler, identity)  # TeamsAdapter(APP_ID, APP_PASSWORD, ..., auth_overrides=...)
        await adapter.start()  # and adapter.add_routes(app) on the aiohttp app under test
        activity = teams_activity("personal", service_url=connector.service_url, text="hi")
        token = identity.mint_token(service_url=connector.service_url)
        ...  # POST activity with headers=auth_headers(token), then await adapter.drain()
        assert connector.messages[0].text == "..."
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import secrets
import shutil
import ssl
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Self
from urllib.parse import parse_qs, unquote

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from jwt.algorithms import RSAAlgorithm

from channels.base import MessageHandler
from channels.teams import TeamsAdapter

APP_ID = "3f0b7c2e-0000-4000-8000-00000000b07a"
"""The bot's Microsoft App ID in tests (also the audience of inbound tokens)."""
APP_PASSWORD = "test-client-secret"
BOT_ID = f"28:{APP_ID}"
"""The bot's id in Teams activities (``recipient.id``, ``mentioned.id``)."""
BOT_NAME = "goclaw"
TENANT_ID = "72f988bf-0000-4000-8000-0000000000aa"
OTHER_TENANT_ID = "0c9d1e55-0000-4000-8000-0000000000bb"
TEAM_ID = "19:team-general@thread.tacv2"
CHANNEL_ID = "19:c0ffee0000@thread.tacv2"
GROUP_CHAT_ID = "19:group-chat-1@thread.v2"
PERSONAL_CHAT_ID = "a:1personal-chat-with-ada"
USER_ID = "29:1user-ada"
USER_AAD_ID = "a1b2c3d4-0000-4000-8000-00000000ada0"
USER_NAME = "Ada Lovelace"

HTML_DUPLICATE = {"contentType": "text/html", "content": "<div>the message, again, as HTML</div>"}
"""The attachment Teams adds to every formatted message."""

Kind = Literal["personal", "groupChat", "channel"]


# ---- activities -------------------------------------------------------------------------


def teams_activity(
    kind: Kind = "personal",
    *,
    service_url: str,
    text: str = "hello",
    activity_type: str = "message",
    activity_id: str | None = None,
    mention: bool = False,
    reply_chain_id: str | None = None,
    tenant_id: str | None = TENANT_ID,
    sender_id: str = USER_ID,
    sender_aad_id: str | None = USER_AAD_ID,
    sender_name: str = USER_NAME,
    bot_id: str = BOT_ID,
    bot_name: str = BOT_NAME,
    attachments: Sequence[Mapping[str, Any]] = (),
    timestamp: str = "2026-11-30T09:15:42.123Z",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Bot Framework activity as Teams posts it, as a JSON-ready dict.

    Args:
        kind: ``personal`` (1:1), ``groupChat`` or ``channel``.
        service_url: Where the bot sends replies: a :class:`FakeConnector`'s URL.
        text: The message text; with ``mention`` and no ``<at>`` tag in it, the
            tag is put in front, as Teams does.
        activity_type: ``message``, ``typing``, ``conversationUpdate`` ...
        activity_id: The activity id (random when None).
        mention: Add a mention entity for the bot.
        reply_chain_id: For ``channel``: the root message id of the reply chain,
            making the conversation id ``<channel>;messageid=<id>``.
        tenant_id: Put in ``channelData.tenant.id`` and ``conversation.tenantId``.
        sender_id: ``from.id``.
        sender_aad_id: ``from.aadObjectId`` (left out when None).
        sender_name: ``from.name``.
        bot_id: ``recipient.id``.
        bot_name: ``recipient.name`` and the mention's display name.
        attachments: Raw attachments (``HTML_DUPLICATE``, ``file_attachment(...)``).
        timestamp: ``timestamp`` (ISO 8601 UTC, as Teams sends it).
        extra: Top-level keys to add or replace.
    """
    activity_id = activity_id or f"1{secrets.randbelow(10**12):012d}"
    conversation: dict[str, Any] = {"conversationType": kind}
    channel_data: dict[str, Any] = {}
    if tenant_id:
        conversation["tenantId"] = tenant_id
        channel_data["tenant"] = {"id": tenant_id}
    if kind == "personal":
        conversation["id"] = PERSONAL_CHAT_ID
    elif kind == "groupChat":
        conversation |= {"id": GROUP_CHAT_ID, "isGroup": True}
    else:
        conversation |= {
            "id": f"{CHANNEL_ID};messageid={reply_chain_id}" if reply_chain_id else CHANNEL_ID,
            "isGroup": True,
        }
        channel_data |= {
            "teamsChannelId": CHANNEL_ID,
            "teamsTeamId": TEAM_ID,
            "channel": {"id": CHANNEL_ID},
            "team": {"id": TEAM_ID},
        }
    sender: dict[str, Any] = {"id": sender_id, "name": sender_name}
    if sender_aad_id:
        sender["aadObjectId"] = sender_aad_id
    entities: list[dict[str, Any]] = [{"type": "clientInfo", "locale": "en-US", "platform": "Web"}]
    if mention:
        tag = f"<at>{bot_name}</at>"
        if tag not in text:
            text = f"{tag} {text}"
        entities.append({"type": "mention", "text": tag, "mentioned": {"id": bot_id, "name": bot_name}})
    activity: dict[str, Any] = {
        "type": activity_type,
        "id": activity_id,
        "timestamp": timestamp,
        "localTimestamp": timestamp.replace("Z", "+01:00"),
        "serviceUrl": service_url,
        "channelId": "msteams",
        "from": sender,
        "recipient": {"id": bot_id, "name": bot_name},
        "conversation": conversation,
        "channelData": channel_data,
        "locale": "en-US",
    }
    if activity_type == "message":
        activity |= {"text": text, "textFormat": "plain", "entities": entities}
        if attachments:
            activity["attachments"] = [dict(a) for a in attachments]
    return activity | dict(extra or {})


def file_attachment(name: str) -> dict[str, Any]:
    """A file a user shared in Teams, as it appears in ``attachments``."""
    return {
        "contentType": "application/vnd.microsoft.teams.file.download.info",
        "contentUrl": f"https://contoso.sharepoint.test/{name}",
        "name": name,
        "content": {"downloadUrl": f"https://contoso.sharepoint.test/dl/{name}", "fileType": name.rsplit(".", 1)[-1]},
    }


def make_teams_adapter(
    handler: MessageHandler, identity: BotFrameworkIdentity | None = None, **kwargs: Any
) -> TeamsAdapter:
    """A TeamsAdapter for tests: Emulator mode (no auth) without ``identity``,
    else ``APP_ID`` / ``APP_PASSWORD`` checked against that peer.

    Remember ``REQUESTS_CA_BUNDLE = identity.ca_bundle`` and ``await adapter.start()``.
    """
    if identity is None:
        return TeamsAdapter("", "", handler, **kwargs)
    return TeamsAdapter(
        identity.app_id, identity.app_password, handler, auth_overrides=identity.auth_overrides(), **kwargs
    )


def auth_headers(token: str | None) -> dict[str, str]:
    """Request headers for posting an activity, with a bearer token when given."""
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


# ---- a threaded HTTP server ------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    peer: Any


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, payload: object, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.peer._get(self)

    def do_POST(self) -> None:
        self.server.peer._post(self)


class _ThreadedPeer:
    """Start / stop a ``_Server`` in a thread; ``with`` closes it."""

    _scheme = "http"

    def __init__(self) -> None:
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> Self:
        """Listen on 127.0.0.1 on a free port."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.peer = self
        context = self._ssl_context()
        if context is not None:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=type(self).__name__, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """``http(s)://127.0.0.1:<port>``."""
        assert self._server is not None, "peer not started"
        return f"{self._scheme}://127.0.0.1:{self._server.server_address[1]}"

    def _ssl_context(self) -> ssl.SSLContext | None:
        return None

    def _get(self, request: _Handler) -> None:
        request._reply(404, {"error": {"code": "NotFound", "message": request.path}})

    def _post(self, request: _Handler) -> None:
        request._reply(404, {"error": {"code": "NotFound", "message": request.path}})


# ---- the connector ---------------------------------------------------------------------


@dataclass(frozen=True)
class PostedActivity:
    """One activity the bot posted to the connector."""

    conversation_id: str
    reply_to_id: str | None  # set when posted to .../activities/{activityId}
    activity: dict[str, Any]
    authorization: str | None

    @property
    def type(self) -> str:
        """The activity type (``message``, ``typing``)."""
        return str(self.activity.get("type"))

    @property
    def text(self) -> str | None:
        """The activity text."""
        return self.activity.get("text")


@dataclass
class _Failure:
    status: int
    retry_after: str | None
    activity_type: str | None


_ACTIVITY_PATH = re.compile(r"^/v3/conversations/(?P<conversation>[^/]+)/activities(?:/(?P<reply_to>[^/]+))?$")


class FakeConnector(_ThreadedPeer):
    """The Bot Framework connector service: records what the bot posts, answers ``{"id": ...}``.

    ``fail_next(n, status, retry_after)`` makes the next ``n`` posts fail, to
    exercise the adapter's retries.
    """

    def __init__(self) -> None:
        super().__init__()
        self._posted: list[PostedActivity] = []
        self._failures: list[_Failure] = []
        self._attempts = 0

    @property
    def service_url(self) -> str:
        """The ``serviceUrl`` to put in activities."""
        return self.base_url + "/"

    @property
    def posted(self) -> list[PostedActivity]:
        """Every activity delivered (answered 200), in order."""
        with self._lock:
            return list(self._posted)

    @property
    def messages(self) -> list[PostedActivity]:
        """The delivered activities of type ``message``, in order."""
        return [p for p in self.posted if p.type == "message"]

    @property
    def attempts(self) -> int:
        """How many activity posts arrived, failed ones included."""
        with self._lock:
            return self._attempts

    def fail_next(
        self, count: int, status: int = 429, retry_after: str | None = None, activity_type: str | None = "message"
    ) -> None:
        """Answer the next ``count`` posts with ``status`` (and ``Retry-After`` when given).

        Only posts of ``activity_type`` fail (None: any), so a typing indicator
        does not use up a failure meant for the reply.
        """
        with self._lock:
            self._failures.extend(_Failure(status, retry_after, activity_type) for _ in range(count))

    def _post(self, request: _Handler) -> None:
        match = _ACTIVITY_PATH.match(request.path.split("?", 1)[0])
        body = request._body()
        if match is None:
            request._reply(404, {"error": {"code": "NotFound", "message": request.path}})
            return
        activity = json.loads(body or b"{}")
        with self._lock:
            self._attempts += 1
            failure = self._failures[0] if self._failures else None
            if failure is not None and failure.activity_type in (None, activity.get("type")):
                self._failures.pop(0)
            else:
                failure = None
                self._posted.append(
                    PostedActivity(
                        conversation_id=unquote(match["conversation"]),
                        reply_to_id=unquote(match["reply_to"]) if match["reply_to"] else None,
                        activity=activity,
                        authorization=request.headers.get("Authorization"),
                    )
                )
                number = len(self._posted)
        if failure is not None:
            headers = {"Retry-After": failure.retry_after} if failure.retry_after is not None else None
            request._reply(failure.status, {"error": {"code": "Throttled", "message": "try later"}}, headers)
            return
        request._reply(200, {"id": f"posted-{number}"})


# ---- the token service: OpenID metadata, signing keys, client credentials --------------


@dataclass
class TokenRequest:
    """A client-credentials request the bot made for an outbound token."""

    form: dict[str, str]


@dataclass
class _Tls:
    directory: Path
    ca_bundle: Path
    context: ssl.SSLContext = field(repr=False)


def _make_tls() -> _Tls:
    """A throwaway CA and a certificate for 127.0.0.1 it signed (MSAL insists on https)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "goclaw test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="goclaw-fake-teams-"))
    ca_bundle = directory / "ca.pem"
    ca_bundle.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file = directory / "server.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file = directory / "server.key"
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return _Tls(directory, ca_bundle, context)


class BotFrameworkIdentity(_ThreadedPeer):
    """Bot Framework's token side on 127.0.0.1 over TLS: what inbound tokens are checked against,
    and where the bot gets its outbound token.

    * OpenID metadata + JWKS (``TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL``): the
      public half of an RSA key this peer signs channel tokens with.
    * A client-credentials token endpoint (``TO_CHANNEL_FROM_BOT_LOGIN_URL``),
      reached by MSAL; the login URL's first path segment is ``adfs`` because
      MSAL only skips its instance discovery (a call to login.microsoftonline.com)
      for ADFS-style authorities, and MSAL insists on https.

    Set ``REQUESTS_CA_BUNDLE`` to :attr:`ca_bundle` so ``requests`` trusts it.
    """

    _scheme = "https"
    issuer = "https://api.botframework.test"
    oauth_scope = "https://api.botframework.test/.default"

    def __init__(self, app_id: str = APP_ID, app_password: str = APP_PASSWORD, channel_id: str = "msteams") -> None:
        super().__init__()
        self.app_id = app_id
        self.app_password = app_password
        self._channel_id = channel_id
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = f"test-key-{uuid.uuid4().hex[:12]}"
        # botbuilder caches OpenID metadata per URL for the whole process: a fresh
        # path per instance keeps a reused port from serving yesterday's keys.
        self._prefix = f"/{uuid.uuid4().hex}"
        self._tls: _Tls | None = None
        self._token_requests: list[TokenRequest] = []

    def start(self) -> Self:
        """Make the TLS certificate, then listen."""
        self._tls = _make_tls()
        return super().start()

    def close(self) -> None:
        """Stop serving and delete the certificate files."""
        super().close()
        if self._tls is not None:
            shutil.rmtree(self._tls.directory, ignore_errors=True)
            self._tls = None

    def _ssl_context(self) -> ssl.SSLContext | None:
        assert self._tls is not None
        return self._tls.context

    @property
    def ca_bundle(self) -> str:
        """Path of the CA certificate to trust (``REQUESTS_CA_BUNDLE``)."""
        assert self._tls is not None, "peer not started"
        return str(self._tls.ca_bundle)

    @property
    def openid_metadata_url(self) -> str:
        """Where botbuilder finds the signing keys' location."""
        return f"{self.base_url}{self._prefix}/v1/.well-known/openidconfiguration"

    @property
    def login_url(self) -> str:
        """The authority MSAL gets the bot's outbound token from."""
        return f"{self.base_url}/adfs"

    @property
    def token_requests(self) -> list[TokenRequest]:
        """Client-credentials requests received, in order."""
        with self._lock:
            return list(self._token_requests)

    def auth_overrides(self) -> dict[str, str]:
        """The ``TeamsAdapter(auth_overrides=...)`` that points botbuilder at this peer."""
        return {
            "TO_BOT_FROM_CHANNEL_TOKEN_ISSUER": self.issuer,
            "TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL": self.openid_metadata_url,
            "TO_CHANNEL_FROM_BOT_OAUTH_SCOPE": self.oauth_scope,
            "TO_CHANNEL_FROM_BOT_LOGIN_URL": self.login_url,
        }

    def mint_token(
        self,
        *,
        service_url: str,
        audience: str | None = None,
        expired: bool = False,
        issuer: str | None = None,
        signing_key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        """A channel-to-bot token as the Bot Framework signs it (RS256).

        Args:
            service_url: The ``serviceurl`` claim; must match the activity's.
            audience: ``aud``; the bot's app id when None (use another for
                "wrong audience").
            expired: Expired an hour ago (beyond botbuilder's 5-minute leeway).
            issuer: ``iss``; this peer's issuer when None.
            signing_key: Sign with another key (a forged token); this peer's when None.
        """
        now = dt.datetime.now(dt.UTC)
        start = now - dt.timedelta(hours=2) if expired else now - dt.timedelta(minutes=1)
        claims = {
            "iss": issuer or self.issuer,
            "aud": audience or self.app_id,
            "serviceurl": service_url,
            "nbf": start,
            "iat": start,
            "exp": start + dt.timedelta(hours=1),
        }
        return jwt.encode(claims, signing_key or self._key, algorithm="RS256", headers={"kid": self.key_id})

    def _get(self, request: _Handler) -> None:
        path = request.path.split("?", 1)[0]
        if path == f"{self._prefix}/v1/.well-known/openidconfiguration":
            request._reply(
                200,
                {
                    "issuer": self.issuer,
                    "jwks_uri": f"{self.base_url}{self._prefix}/v1/keys",
                    "id_token_signing_alg_values_supported": ["RS256"],
                    "token_endpoint_auth_methods_supported": ["private_key_jwt"],
                },
            )
        elif path == f"{self._prefix}/v1/keys":
            jwk = RSAAlgorithm.to_jwk(self._key.public_key(), as_dict=True)
            jwk |= {"kid": self.key_id, "use": "sig", "endorsements": [self._channel_id]}
            request._reply(200, {"keys": [jwk]})
        elif path == "/adfs/.well-known/openid-configuration":
            request._reply(
                200,
                {
                    "issuer": self.login_url,
                    "authorization_endpoint": f"{self.login_url}/oauth2/authorize",
                    "token_endpoint": f"{self.login_url}/oauth2/token",
                },
            )
        else:
            super()._get(request)

    def _post(self, request: _Handler) -> None:
        if request.path.split("?", 1)[0] != "/adfs/oauth2/token":
            super()._post(request)
            return
        form = {k: v[0] for k, v in parse_qs(request._body().decode()).items()}
        with self._lock:
            self._token_requests.append(TokenRequest(form))
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.app_password:
            request._reply(401, {"error": "invalid_client", "error_description": "bad client id or secret"})
            return
        request._reply(
            200, {"access_token": f"bot-token-{secrets.token_hex(8)}", "expires_in": 3600, "token_type": "Bearer"}
        )

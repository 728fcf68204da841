"""The operator's YAML config, validated by pydantic models.

Errors name the dotted key path and its line in the file, with a did-you-mean
for a misspelt key. Secrets are ``${ENV_VAR}`` references held as ``SecretStr``;
a reference to an unset variable in a secret is kept as an :class:`UnresolvedSecret`
and fails only when the secret is used (:func:`check_secrets` before serving, or
reading it), so a command that never uses a secret does not need it set.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url

from channels.teams_urls import DEFAULT_ALLOWED_SERVICE_URLS, invalid_entries
from gateway.automation.config import AutomationConfig
from gateway.errors import ConfigError
from pairing.admission import DmPolicy, GroupPolicy
from pairing.principal import Role

RETIRED_SETTINGS = {
    ("memory", "quarantine_learned_facts"): (
        "memory.quarantine_learned_facts is retired and nothing reads it: non-admin operational items "
        "are dropped by the memory policy; remove the key"
    ),
    ("session", "max_concurrent_sessions"): (
        "session.max_concurrent_sessions is retired and nothing reads it: sessions are no longer limited "
        "(each waits only for its own turn); to bound load on the model set llm.max_concurrent_calls; remove the key"
    ),
}


class UnresolvedSecret(SecretStr):
    """A secret whose ``${VAR}`` is unset: reading it is a :class:`ConfigError` naming the variable and key."""

    def __init__(self, variable: str, where: str) -> None:
        super().__init__("")
        self.variable = variable
        self.where = where

    def problem(self) -> str:
        """The one line an operator reads: which key, which line, which variable."""
        return (
            f"{self.where}: environment variable {self.variable} is not set "
            f"(export it, or write ${{{self.variable}:-default}})"
        )

    def get_secret_value(self) -> str:
        """Raises ConfigError: the variable was not set when the config was loaded."""
        raise ConfigError([self.problem()])

    # Comparing or hashing a config must not read the secret.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnresolvedSecret) and (other.variable, other.where) == (self.variable, self.where)

    def __hash__(self) -> int:
        return hash((self.variable, self.where))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentConfig(_Model):
    """Who the agent is (the identity section of every prompt)."""

    name: str = "goclaw"
    persona: str = (
        "You are the team's assistant. You help the people who message you, remember what they tell you "
        "about themselves, and follow the procedures the administrators have taught you."
    )


class DatabaseConfig(_Model):
    """Where records live."""

    url: str = "sqlite+aiosqlite:///data/goclaw.db"
    echo: bool = False
    # SQLite: past this size the job process starts the write-ahead log again (new writes wait for its last
    # frames to be copied, 8-14 ms under load) and the next commit cuts the file back to it. Without that a
    # busy gateway's WAL file only grew.
    wal_limit_mb: float = Field(default=16.0, gt=0, le=4096)

    @property
    def wal_limit_bytes(self) -> int:
        return int(self.wal_limit_mb * 1024 * 1024)

    @field_validator("url")
    @classmethod
    def _known_driver(cls, v: str) -> str:
        if not (v.startswith("sqlite+aiosqlite://") or v.startswith("postgresql+asyncpg://")):
            raise ValueError("use sqlite+aiosqlite:///path/to.db or postgresql+asyncpg://user@host/db")
        return v


class LLMConfig(_Model):
    """The model behind the agent."""

    provider: Literal["builtin", "openai", "anthropic"] = "builtin"
    model: str = "builtin-offline"
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_seconds: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=3, ge=0, le=10)
    max_tool_steps: int = Field(default=6, ge=1, le=50)
    temperature: float = Field(default=0.2, ge=0, le=2)
    max_tokens: int = Field(default=1024, ge=16)
    # Model calls this process has in flight at once; more wait their turn (the model server's capacity).
    max_concurrent_calls: int = Field(default=256, ge=1)

    @model_validator(mode="after")
    def _provider_needs(self) -> LLMConfig:
        if self.provider == "anthropic" and not _secret(self.api_key):
            raise ValueError("llm.provider anthropic needs llm.api_key (for example ${ANTHROPIC_API_KEY})")
        if self.provider == "openai" and not _secret(self.api_key) and not self.base_url:
            raise ValueError(
                "llm.provider openai needs llm.api_key, or llm.base_url for a local server (Ollama, vLLM, ...)"
            )
        if self.provider != "builtin" and self.model == "builtin-offline":
            raise ValueError(f"llm.model must name the {self.provider} model to use (for example gpt-4o-mini)")
        if self.base_url and not re.match(r"^https?://[^\s/]+", self.base_url):
            raise ValueError(f"llm.base_url {self.base_url!r} is not an http(s) URL")
        return self


class ApiUser(_Model):
    """An HTTP API / WebSocket caller: a bearer token mapped to a unified user id."""

    token: SecretStr
    user: str

    @field_validator("token")
    @classmethod
    def _long_enough(cls, v: SecretStr) -> SecretStr:
        if isinstance(v, UnresolvedSecret):
            return v  # checked when it is used (check_secrets)
        if len(v.get_secret_value()) < 16:
            raise ValueError("API tokens must be at least 16 characters")
        return v


class ServerConfig(_Model):
    """The web server: Teams endpoint, API, WebSocket, web chat."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    dashboard_token: SecretStr | None = None
    api_users: list[ApiUser] = Field(default_factory=list)
    max_message_chars: int = Field(default=8000, ge=1)
    openai_compat: bool = False  # POST /v1/chat/completions and GET /v1/models for api_users
    # Bearer token for /metrics on a non-loopback host (open on loopback).
    metrics_token: SecretStr | None = None
    # Browser origins besides the server's own that may POST or open the WebSocket (a reverse proxy's URL).
    allowed_origins: list[str] = Field(default_factory=list)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        for origin in v:
            if not re.fullmatch(r"https?://[^\s/]+", origin.strip().rstrip("/")):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port], e.g. https://bot.example.com"
                )
        return v

    @field_validator("dashboard_token", "metrics_token")
    @classmethod
    def _secret_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        # A short shared secret is guessable; the same rule as API tokens. An unset
        # ${VAR} is checked when the secret is used (UnresolvedSecret), not here.
        if v is not None and not isinstance(v, UnresolvedSecret) and len(v.get_secret_value()) < 16:
            raise ValueError("this token must be at least 16 characters")
        return v


class SessionConfig(_Model):
    """History window per session."""

    max_messages: int = Field(default=40, ge=4)
    keep_messages: int = Field(default=10, ge=1)
    # Retired (a semaphore held across the model call): read by nothing; a config that sets it gets a warning.
    max_concurrent_sessions: int | None = None
    history_token_budget: int = Field(default=6000, ge=256)
    # Extract what a session taught once it has been quiet this long (0: only at the trim).
    idle_extract_seconds: float = Field(default=120, ge=0)
    # At start, answer messages younger than this that a crash left unanswered (0: never).
    resume_unanswered_seconds: int = Field(default=300, ge=0)
    # A background job's lease, renewed while it runs: a dead worker's job is taken over after this.
    job_lease_seconds: int = Field(default=30, ge=2)
    # How long a message being answered holds back the session's later messages in other processes
    # if its process dies (renewed every third of it while the turn runs; gateway/ordering.py).
    answer_lease_seconds: float = Field(default=30, ge=2)

    @model_validator(mode="after")
    def _keep_below_max(self) -> SessionConfig:
        if self.keep_messages >= self.max_messages:
            raise ValueError("session.keep_messages must be smaller than session.max_messages")
        return self


class _ChannelCommon(_Model):
    enabled: bool = False
    dm_policy: DmPolicy = DmPolicy.PAIRING
    allow_from: list[str] = Field(default_factory=list)
    group_policy: GroupPolicy = GroupPolicy.OPEN
    allow_channels: list[str] = Field(default_factory=list)
    require_mention: bool = True

    @field_validator("allow_from", "allow_channels", mode="before")
    @classmethod
    def _ids_as_strings(cls, v: Any) -> Any:
        # Discord ids are large integers; YAML reads them as ints.
        return [str(x) for x in v] if isinstance(v, list) else v


class DiscordConfig(_ChannelCommon):
    """Discord bot settings."""

    token: SecretStr | None = None
    shard_ids: list[int] | None = None
    shard_count: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _token_when_enabled(self) -> DiscordConfig:
        if self.enabled and not _secret(self.token):
            raise ValueError("channels.discord.enabled is true but channels.discord.token is empty")
        if self.shard_ids and not self.shard_count:
            raise ValueError("channels.discord.shard_ids needs channels.discord.shard_count")
        return self


class TeamsConfig(_ChannelCommon):
    """Microsoft Teams (Bot Framework) settings."""

    app_id: str = ""
    app_password: SecretStr | None = None
    app_tenant_id: str = ""
    allowed_tenants: list[str] = Field(default_factory=list)
    # Where replies and proactive sends may go (URL prefixes, "*." for subdomains).
    allowed_service_urls: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOWED_SERVICE_URLS))

    @model_validator(mode="after")
    def _both_or_neither(self) -> TeamsConfig:
        if bool(self.app_id) != bool(_secret(self.app_password)):
            raise ValueError(
                "channels.teams needs both app_id and app_password (or neither, for local emulator testing)"
            )
        bad = invalid_entries(self.allowed_service_urls)
        if bad:
            raise ValueError(
                f"channels.teams.allowed_service_urls: {', '.join(map(repr, bad))} "
                "is not an http(s) URL prefix (for example https://smba.trafficmanager.net/)"
            )
        return self


class ChannelsConfig(_Model):
    """Platform adapters."""

    discord: DiscordConfig = Field(default_factory=DiscordConfig)
    teams: TeamsConfig = Field(default_factory=TeamsConfig)


class WriteAccess(_Model):
    """Who besides admins may ``memory_write`` to agent_notes."""

    users: list[str] = Field(default_factory=list)
    roles: list[Role] = Field(default_factory=list)


class MemoryConfig(_Model):
    """Memory policy settings."""

    write_access: WriteAccess = Field(default_factory=WriteAccess)
    notes_review_days: int = Field(default=90, ge=1, le=90)
    prompt_token_budget: int = Field(default=1200, ge=64)
    max_content_chars: int = Field(default=2000, ge=16)
    consolidation_time: str = "03:00"
    auto_distill: bool = True
    # Retired: read by nothing; a config that sets it gets a warning.
    quarantine_learned_facts: bool | None = None

    @field_validator("consolidation_time")
    @classmethod
    def _hh_mm(cls, v: str) -> str:
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", v):
            raise ValueError("use HH:MM in UTC, for example 03:00")
        return v


Severity = Literal["info", "advisory", "blocking", "critical"]
_SEVERITY_ORDER = ("info", "advisory", "blocking", "critical")


class FloorConfig(_Model):
    """A severity floor: a finding whose subject, observation or rationale matches is at least ``at_least``."""

    pattern: str
    at_least: Severity = "blocking"
    why: str = ""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"pattern {v!r} is not a valid regular expression ({exc})") from None
        return v


def _shipped_floors() -> list[FloorConfig]:
    # Seed 001: "The shipped policy raises any of those that names an invariant (INV-nnn) or
    # [the identity] to at least blocking, whatever the unit claimed."
    return [
        FloorConfig(pattern=r"\bINV-\d{3}\b", at_least="blocking", why="names an invariant"),
        FloorConfig(pattern=r"\b(?:global|agent_config|identity)\b", at_least="blocking", why="names the identity"),
    ]


class IntelligenceConfig(_Model):
    """How findings are routed (floors, the owed and blocking lines) and who may resolve what they raise."""

    floors: list[FloorConfig] = Field(default_factory=_shipped_floors)
    owed_at: Severity = "advisory"
    blocks_at: Severity = "blocking"
    resolvers: dict[Severity, list[Role]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _lines_in_order(self) -> IntelligenceConfig:
        if _SEVERITY_ORDER.index(self.blocks_at) < _SEVERITY_ORDER.index(self.owed_at):
            raise ValueError(
                f"intelligence.blocks_at ({self.blocks_at}) is below intelligence.owed_at ({self.owed_at}): "
                "only an owed finding opens an obligation that can hold"
            )
        for severity, roles in self.resolvers.items():
            if not roles:
                raise ValueError(f"intelligence.resolvers.{severity} is empty: name at least one role (admin, user)")
        return self

    def resolver_roles(self) -> dict[str, tuple[str, ...]]:
        """Roles that may resolve each severity (admins where the config names none)."""
        named: dict[str, list[Role]] = {str(k): v for k, v in self.resolvers.items()}
        return {s: tuple(r.value for r in named.get(s, [Role.ADMIN])) for s in _SEVERITY_ORDER}


class WorkerConfig(_Model):
    """Where the background work runs: durable jobs, idle extraction, consolidation, SOP schedules."""

    # inline: ``goclaw serve`` runs it: the jobs in a child process (gateway/jobproc.py), the rest on a
    # thread with its own event loop (off the turns' loop).
    # separate: ``goclaw serve`` runs none of it; ``goclaw worker`` does (PostgreSQL only).
    mode: Literal["inline", "separate"] = "inline"
    # Finished jobs are kept this many days (the dashboard counts them), then the worker deletes them
    # when it is idle; trims' and revisions' jobs are deleted as they finish (their outcome is recorded).
    keep_done_jobs_days: float = Field(default=7.0, ge=0)


class LoggingConfig(_Model):
    """Log output."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class Config(_Model):
    """The whole gateway configuration."""

    agent: AgentConfig = Field(default_factory=AgentConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    automation: AutomationConfig = Field(default_factory=AutomationConfig)
    intelligence: IntelligenceConfig = Field(default_factory=IntelligenceConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)

    @model_validator(mode="after")
    def _separate_worker_needs_postgres(self) -> Config:
        if self.worker.mode == "separate" and not self.database.url.startswith("postgresql"):
            raise ValueError(
                "worker.mode: separate needs PostgreSQL (database.url is SQLite, which one process owns); "
                "use worker.mode: inline (goclaw serve runs the background work itself), "
                "or point database.url at PostgreSQL"
            )
        return self

    @model_validator(mode="after")
    def _emulator_only_on_loopback(self) -> Config:
        teams = self.channels.teams
        if teams.enabled and not teams.app_id and not _loopback(self.server.host):
            raise ValueError(
                f"channels.teams has no app_id (Emulator mode: requests are not authenticated), so it serves only "
                f"on a loopback server.host, not {self.server.host!r}; set channels.teams.app_id and app_password, "
                "or server.host: 127.0.0.1"
            )
        return self

    # Set by the loader, not by YAML.
    warnings_: tuple[str, ...] = Field(default=(), exclude=True, alias="__warnings__")
    _source: tuple[str, str] | None = PrivateAttr(default=None)  # (the file's text, its path) as loaded

    @property
    def warnings(self) -> tuple[str, ...]:
        """Non-fatal notices (retired settings)."""
        return self.warnings_

    @property
    def source(self) -> tuple[str, str] | None:
        """The text this config was loaded from and the file's path; None if not loaded from a file.

        ``goclaw serve`` hands this text to its job process (``gateway/jobproc.py``), so a
        job process started again later runs with the config serve runs with, not with
        whatever the file holds by then.
        """
        return self._source


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _secret(v: SecretStr | None) -> str:
    # An unresolved reference counts as "given" here; using it names the variable.
    if isinstance(v, UnresolvedSecret):
        return "${" + v.variable + "}"
    return v.get_secret_value() if v is not None else ""


def secrets_in_use(cfg: Config) -> list[SecretStr | None]:
    """The secrets a running gateway reads with this config (``serve``, ``config check``)."""
    used: list[SecretStr | None] = [
        cfg.server.dashboard_token,
        cfg.server.metrics_token,
        *(u.token for u in cfg.server.api_users),
    ]
    if cfg.llm.provider != "builtin":
        used.append(cfg.llm.api_key)
    if cfg.channels.discord.enabled:
        used.append(cfg.channels.discord.token)
    if cfg.channels.teams.enabled:
        used.append(cfg.channels.teams.app_password)
    return used


def check_secrets(cfg: Config) -> None:
    """Fail, naming every unset variable and its key, if a secret this config uses is unresolved.

    Raises:
        ConfigError: one problem per unset variable.
    """
    problems = [s.problem() for s in secrets_in_use(cfg) if isinstance(s, UnresolvedSecret)]
    if problems:
        raise ConfigError(problems)


# ---- loading -----------------------------------------------------------------------

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _lines(node: yaml.Node, path: tuple[str | int, ...], out: dict[tuple[str | int, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            k = key.value
            out[(*path, k)] = key.start_mark.line + 1
            _lines(value, (*path, k), out)
            out[(*path, k)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def _substitute(value: Any, path: tuple[str | int, ...], env: dict[str, str], problems: list[str], where: Any) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, (*path, k), env, problems, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, (*path, i), env, problems, where) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        unset: list[str] = []

        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in env and env[name] != "":
                return env[name]
            if default is not None:
                return default
            unset.append(name)
            return ""

        resolved = _ENV_REF.sub(repl, value)
        if not unset:
            return resolved
        if _is_secret_field(path):
            # Resolved when used: a command that never reads this secret does not need it.
            return UnresolvedSecret(unset[0], where(path))
        problems.extend(
            f"{where(path)}: environment variable {name} is not set (export it, or write ${{{name}:-default}})"
            for name in unset
        )
        return ""
    return value


def _model_of(annotation: Any) -> type[BaseModel] | None:
    for c in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
        for a in getattr(c, "__args__", ()):
            if isinstance(a, type) and issubclass(a, BaseModel):
                return a
    return None


def _is_secret_field(path: tuple[str | int, ...]) -> bool:
    """Whether the key at ``path`` is a ``SecretStr`` setting."""
    model: type[BaseModel] | None = Config
    keys = [p for p in path if not isinstance(p, int)]
    for i, part in enumerate(keys):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return False
        if i == len(keys) - 1:
            ann = field.annotation
            return ann is SecretStr or SecretStr in getattr(ann, "__args__", ())
        model = _model_of(field.annotation)
    return False


def _fields_at(path: tuple[str | int, ...]) -> list[str]:
    model: Any = Config
    for part in path:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        nxt = None
        for c in candidates:
            if isinstance(c, type) and issubclass(c, BaseModel):
                nxt = c
            for a in getattr(c, "__args__", ()):
                if isinstance(a, type) and issubclass(a, BaseModel):
                    nxt = a
        if nxt is None:
            return []
        model = nxt
    return [n for n in getattr(model, "model_fields", {}) if not n.endswith("_")]


def load_config(path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Read, substitute and validate a config file.

    Raises:
        ConfigError: listing every problem, each with its dotted key and line.
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            [f"config file {p} not found: pass --config PATH, set GOCLAW_CONFIG, or copy config.example.yaml"]
        )
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"cannot read {p}: {exc.strerror}"]) from None
    return load_config_text(text, p, env)


def load_config_text(text: str, path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Substitute and validate a config's ``text`` as read from the file at ``path``.

    ``path`` names the file in messages, and its folder anchors a relative SQLite path.

    Raises:
        ConfigError: listing every problem, each with its dotted key and line.
    """
    p = Path(path)
    env = dict(os.environ) if env is None else env
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{at}: not valid YAML ({problem})"], str(p)) from None
    lines: dict[tuple[str | int, ...], int] = {}
    if node is not None:
        _lines(node, (), lines)
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(["the top level must be a mapping of sections (agent:, database:, llm:, ...)"], str(p))

    def where(loc: tuple[str | int, ...]) -> str:
        dotted = ".".join(str(x) for x in loc) or "(top level)"
        for i in range(len(loc), -1, -1):
            if loc[:i] in lines:
                return f"{dotted} (line {lines[loc[:i]]})"
        return dotted

    problems: list[str] = []
    raw = _substitute(raw, (), env, problems, where)
    if problems:
        # A missing variable makes later checks on that value noise: report it alone.
        raise ConfigError(problems, str(p))
    warnings: list[str] = []
    for key_path, message in RETIRED_SETTINGS.items():
        section = raw.get(key_path[0])
        if isinstance(section, dict) and key_path[1] in section:
            warnings.append(f"{message} (line {lines.get(key_path, '?')})")
    try:
        cfg = Config.model_validate({**raw, "__warnings__": tuple(warnings)})
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-after")))
            if err["type"] == "extra_forbidden":
                known = _fields_at(loc[:-1])
                guess = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
                hint = (
                    f"; did you mean '{guess[0]}'?" if guess else (f"; known keys: {', '.join(known)}" if known else "")
                )
                problems.append(f"{where(loc)}: unknown key{hint}")
            else:
                msg = err["msg"].removeprefix("Value error, ")
                problems.append(f"{where(loc)}: {msg}")
        raise ConfigError(problems, str(p)) from None
    cfg = anchor_database(cfg, p.resolve().parent)
    cfg._source = (text, str(p))
    return cfg


def anchor_database(cfg: Config, folder: Path) -> Config:
    """``cfg`` with a relative SQLite path made absolute against ``folder`` (the config file's).

    The database belongs to the config, not to the shell's current folder: the
    CLI run from elsewhere with ``--config`` opens the gateway's database instead
    of silently creating an empty one.
    """
    url = make_url(cfg.database.url)
    db = url.database
    if not url.drivername.startswith("sqlite") or not db or db == ":memory:" or db.startswith("file:"):
        return cfg
    if Path(db).is_absolute():
        return cfg
    anchored = url.set(database=str(folder / db)).render_as_string(hide_password=False)
    return cfg.model_copy(update={"database": cfg.database.model_copy(update={"url": anchored})})


def find_config_path(explicit: str | None) -> Path:
    """``--config``, else ``GOCLAW_CONFIG``, else ``./config.yaml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("GOCLAW_CONFIG")
    if env:
        return Path(env)
    return Path("config.yaml")


def default_config() -> Config:
    """The embedded defaults (used by tests and `goclaw chat` without a file)."""
    return Config()

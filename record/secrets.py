"""Masking of secrets in text: everything the platform prints, raises or records goes through ``redact``.

A storage URL (``postgresql://optuna:PASSWORD@postgres:5432/optuna``), a tracking URI with credentials, a
query-string token or a secret from the environment must never reach a terminal, a log, an exception
message, an MLflow param or tag, or an Optuna attribute. ``redact(text)`` masks, wherever they appear in
the text:

- the password of any ``scheme://user:PASSWORD@host`` (the user name stays: it says which role was used);
- the value of secret-named keys: query strings and libpq/DSN pairs (``?token=...``, ``&X-Amz-Signature=``,
  ``password=...``), JSON/YAML-like ``"password": "..."``, and ``Authorization: Basic|Bearer ...`` headers;
- the values of secret environment variables (``SECRET_ENV`` and every ``*_PASSWORD``, ``*_TOKEN``,
  ``*_SECRET``, ``*_SECRET_KEY``, ``*_API_KEY``, ``*_ACCESS_KEY`` variable), raw and URL-encoded, read at each
  call so a secret set later is masked too;
- values registered with ``register(value)`` (e.g. the password of a ``--storage`` URL given on the command
  line, which no environment variable holds).

Hand-written because no dependency does this: SQLAlchemy masks only the URLs it renders itself
(``URL.render_as_string(hide_password=True)``) and pip's ``redact_auth_from_url`` only whole URLs.
A user name alone (``https://NAME@host``) is left as it is; a token used as a user name is masked only when an
environment variable or ``register`` knows it.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"

# Environment variables whose values are secrets (besides the name patterns below).
SECRET_ENV = (
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_ADMIN_PASSWORD",
    "MLFLOW_WORKER_PASSWORD",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "POSTGRES_PASSWORD",
    "MLFLOW_DB_PASSWORD",
    "OPTUNA_DB_PASSWORD",
    "PGPASSWORD",
    "RAY_AUTH_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCESS_KEY",
    "HF_TOKEN",
)
_SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:PASSWORD|PASSWD|TOKEN|SECRET|SECRET_KEY|API_KEY|ACCESS_KEY)$")
# Shorter values are not masked by value: "1", "true" or "admin" would blank out ordinary text.
MIN_SECRET_LENGTH = 6

_registered: set[str] = set()

# scheme://userinfo@ : the userinfo runs to the last "@" of the authority (an unencoded "@" in a password
# still leaves nothing of it behind); user and password split at the first ":".
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s'\"<>`]*)@")
_SECRET_KEY = (
    r"(?:[A-Za-z0-9]+[_.\-])*"
    r"(?:password|passwd|pwd|token|secret|secret[_\-]?key|api[_\-]?key|apikey|access[_\-]?key|accountkey"
    r"|signature|sig|credential|credentials|sharedaccesssignature)"
)
# key=value in query strings, DSNs (libpq "password=..."), command lines (--password=...) and logs.
_KEY_VALUE = re.compile(
    rf"(?P<key>(?<![A-Za-z0-9_]){_SECRET_KEY})(?P<sep>=|%3[Dd])(?P<value>[^&\s'\"`,;)#<>]+)", re.IGNORECASE
)
# "password": "value" / 'token': 'value' / password: value (JSON, Python reprs, YAML)
_QUOTED = re.compile(
    rf"(?P<key>[\"']?(?<![A-Za-z0-9_]){_SECRET_KEY}[\"']?\s*:[ \t]*)"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"'\n]*)(?P=q)|(?P<bare>[^\s,}\]\"']+))",
    re.IGNORECASE,
)
_AUTH_HEADER = re.compile(
    r"(?P<key>(?<![A-Za-z0-9_])(?:x-ray-)?(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+[ \t]+)?)"
    r"(?P<value>[A-Za-z0-9+/=._~\-*]+)",
    re.IGNORECASE,
)


def register(value: str | None) -> None:
    """Mask ``value`` in everything redacted from now on (a secret that no environment variable holds)."""
    if value and len(value) >= MIN_SECRET_LENGTH and value != MASK:
        _registered.add(value)


def register_url(url: str | None) -> None:
    """Register the password of a URL (e.g. a ``--storage`` or ``--tracking-uri`` given on the command line)."""
    if not url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.password:
        register(parts.password)
        register(unquote(parts.password))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets masked by value: registered ones and the secret environment variables', longest first."""
    env = os.environ if environ is None else environ
    values = set(_registered)
    for name, value in env.items():
        if (name in SECRET_ENV or _SECRET_ENV_NAME.search(name.upper())) and value and len(value) >= MIN_SECRET_LENGTH:
            values.add(value)
    forms = set()
    for v in values:
        forms.update({v, quote(v, safe=""), quote_plus(v, safe="")})
    forms.discard(MASK)
    return sorted((f for f in forms if len(f) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def _mask_known(text: str, known: Iterable[str]) -> str:
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    return text


def _mask_userinfo(match: re.Match) -> str:
    userinfo = match["userinfo"]
    if ":" not in userinfo:
        return match.group(0)
    user, _, password = userinfo.partition(":")
    if not password or password == MASK:
        return match.group(0)
    return f"{match['scheme']}{user}:{MASK}@"


def _mask_value(match: re.Match) -> str:
    value = match["value"]
    if value == MASK:
        return match.group(0)
    return match.group(0)[: match.start("value") - match.start(0)] + MASK


def _mask_quoted(match: re.Match) -> str:
    if match["q"] is not None:
        if not match["quoted"] or match["quoted"] == MASK:
            return match.group(0)
        return f"{match['key']}{match['q']}{MASK}{match['q']}"
    if match["bare"] == MASK:
        return match.group(0)
    return f"{match['key']}{MASK}"


def redact(text: str) -> str:
    """``text`` with every password, token and secret value in it replaced by ``***`` (see the module)."""
    if not isinstance(text, str):
        text = str(text)
    text = _mask_known(text, secret_values())
    text = _URL_USERINFO.sub(_mask_userinfo, text)
    text = _AUTH_HEADER.sub(_mask_value, text)
    text = _KEY_VALUE.sub(_mask_value, text)
    return _QUOTED.sub(_mask_quoted, text)


def redact_url(url: str) -> str:
    """A URL with its password and secret query parameters masked; user, host, port, path and the other
    parameters as they were (``postgresql://optuna:***@postgres:5432/optuna``)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a malformed port: then mask as text)
    except ValueError:
        return redact(url)
    if not parts.scheme or not parts.netloc:
        return redact(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            user, _, password = userinfo.partition(":")
            if password:
                netloc = f"{user}:{MASK}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        secret_key = re.compile(rf"^{_SECRET_KEY}$", re.IGNORECASE)
        if any(secret_key.match(k) for k, _ in pairs):
            query = urlencode([(k, MASK if secret_key.match(k) and v else v) for k, v in pairs], safe="*")
    return redact(urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)))


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``(url without its user:password@, user, password)``, decoded. For a tracking URI given with credentials
    (``http://user:pw@mlflow:5000``): pass the clean URI to MLflow and the credentials as
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, so that no URI the process holds (and MLflow prints,
    e.g. its "View run at" lines) carries the password. The password is registered for masking too."""
    try:
        parts = urlsplit(url)
        username, password = parts.username, parts.password
    except ValueError:
        return url, None, None
    if username is None and password is None:
        return url, None, None
    hostport = parts.netloc.rpartition("@")[2]
    clean = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    register_url(url)
    return clean, unquote(username) if username else username, unquote(password) if password is not None else None


def redact_mapping(mapping: Mapping[str, object]) -> dict[str, object]:
    """A copy of ``mapping`` (MLflow params or tags, a config) with every string value redacted, nested
    mappings and lists included; a value whose key names a secret (``password``, ``token``...) is masked whole."""
    secret_key = re.compile(rf"(?:^|[_.\-]){_SECRET_KEY}$", re.IGNORECASE)

    def clean(key: str, value: object) -> object:
        if isinstance(value, Mapping):
            return {k: clean(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(clean(key, v) for v in value)
        if isinstance(value, str):
            if value and secret_key.search(key):
                return MASK
            return redact(value)
        return value

    return {k: clean(str(k), v) for k, v in mapping.items()}


# the credentials a trial needs to write to an MLflow server with authentication, and nothing else
FORWARDED_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")


@dataclass(frozen=True)
class Credentials:
    """The driver's MLflow credentials (``FORWARDED_ENV``), carried to its trials inside their own arguments
    (Ray pickles them and prints none) and set in the trial's process by ``apply``. Not through Ray's
    runtime_env: every node's runtime_env_agent.log prints a runtime env's ``env_vars`` in full, and the job
    table keeps them. The nodes themselves need no credentials."""

    values: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_environ(cls) -> Credentials:
        return cls(tuple((k, os.environ[k]) for k in FORWARDED_ENV if os.environ.get(k)))

    def apply(self) -> None:
        """This process writes to MLflow as the driver's user (over what the node's environment says)."""
        os.environ.update(dict(self.values))

    def __repr__(self) -> str:  # a trial's arguments may be printed (a traceback, Ray's task repr)
        return f"Credentials({', '.join(k for k, _ in self.values)})"


class RedactingStream(io.TextIOBase):
    """A terminal stream that masks secrets (passwords in URLs, tokens, secret environment values) in everything
    written to it: our messages, library logs, tracebacks."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


def guard(tracking_uri: str | None = None, storage: str | None = None) -> str | None:
    """Credentials in a tracking server's URI go to MLflow's own variables, so that no URI this process holds (or
    MLflow prints) carries them; a database's password (MLflow's SQL store reads it from its URL only) and a
    storage URL's are registered for masking; stdout and stderr are masked.
    Gives the command's ``tracking_uri`` made clean (None where none was given)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri and not uri.lower().startswith(("http://", "https://")):  # a database's: its URL is how it logs in
        register_url(uri)
    elif uri:
        clean, user, password = split_credentials(uri)
        if password is not None:
            os.environ["MLFLOW_TRACKING_USERNAME"] = user or ""
            os.environ["MLFLOW_TRACKING_PASSWORD"] = password
            if tracking_uri:
                tracking_uri = clean
            else:
                os.environ["MLFLOW_TRACKING_URI"] = clean
    for url in (storage, os.environ.get("ABLATE_OPTUNA_STORAGE")):
        register_url(url)
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    return tracking_uri

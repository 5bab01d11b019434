"""Keeping credentials out of what a server shows: URLs in health pages, error bodies, logs, startup lines.

`redact_url` masks a URL's password and secret-looking query values; `redact_text` masks known secret strings and
any credential-carrying URL inside free text (an exception message that quotes the URL it failed on).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import unquote, unquote_plus

MASK = "***"

_SECRET_NAMES = frozenset(
    {
        "key",
        "apikey",
        "api_key",
        "access_key",
        "token",
        "access_token",
        "id_token",
        "refresh_token",
        "auth",
        "authorization",
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "client_secret",
        "sig",
        "signature",
        "credential",
        "credentials",
        "session",
        "sessionid",
    }
)
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_password", "_sig", "_signature")

# scheme://user:password@ inside text; the password runs to the last "@" before the host, as in urlsplit.
_USERINFO_IN_TEXT = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*):[^\s/?#'\"]*@")
_PARAM_IN_TEXT = re.compile(r"(?P<head>[?&;#](?P<name>[A-Za-z0-9_.%-]+)=)(?P<value>[^&;#\s'\"]*)")


def is_secret_param(name: str) -> bool:
    """Whether a query parameter name looks like it carries a credential (`api_key`, `X-Api-Key`, `sig`, ...)."""
    n = unquote_plus(name).strip().lower().replace("-", "_")
    return n in _SECRET_NAMES or n.endswith(_SECRET_SUFFIXES)


def _redact_params(query: str) -> str:
    out = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        out.append(f"{name}={MASK}" if eq and value and is_secret_param(name) else pair)
    return "&".join(out)


def _url_parts(url: str) -> tuple[str, str, str, str | None, str | None] | None:
    """(scheme://, netloc, path, query, fragment) by plain string splitting, so the rest is rebuilt byte for byte."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = len(rest)
    for c in "/?#":
        i = rest.find(c)
        if i != -1:
            end = min(end, i)
    netloc, tail = rest[:end], rest[end:]
    before, hash_, fragment = tail.partition("#")
    path, mark, query = before.partition("?")
    return scheme + sep, netloc, path, query if mark else None, fragment if hash_ else None


def redact_url(url: str) -> str:
    """`http://user:pass@h/x?api_key=k&a=1` -> `http://user:***@h/x?api_key=***&a=1`; safe to show and log."""
    parts = _url_parts(url)
    if parts is None:
        return redact_text(url)
    head, netloc, path, query, fragment = parts
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{hostport}"
    out = head + netloc + path
    if query is not None:
        out += "?" + _redact_params(query)
    if fragment is not None:
        out += "#" + _redact_params(fragment)
    return out


def url_secrets(url: str) -> list[str]:
    """The secret strings of a URL (password, secret query values), raw and percent-decoded, for `redact_text`."""
    parts = _url_parts(url)
    if parts is None:
        return []
    _, netloc, _, query, fragment = parts
    found: list[str] = []
    userinfo, at, _ = netloc.rpartition("@")
    if at and ":" in userinfo:
        pw = userinfo.split(":", 1)[1]
        found += [pw, unquote(pw)]
    for q in (query, fragment):
        for pair in (q or "").split("&"):
            name, eq, value = pair.partition("=")
            if eq and value and is_secret_param(name):
                found += [value, unquote_plus(value)]
    return sorted({s for s in found if s}, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with each known secret replaced by `***`, then any credential-carrying URL in it masked.

    Every occurrence is replaced even for a very short secret: a mangled message is better than a leaked one."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, MASK)
    text = _USERINFO_IN_TEXT.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _PARAM_IN_TEXT.sub(
        lambda m: m["head"] + MASK if m["value"] and is_secret_param(m["name"]) else m[0], text
    )


class RedactingFilter(logging.Filter):
    """A filter that passes every record through `redact`: message (after %-formatting), traceback, stack.

    Attached to a library's logger (httpx logs each request's full URL at INFO, password and query included)."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's to report, not ours
            return True
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            # Formatters append exc_text; dropping exc_info keeps handlers from re-rendering the raw traceback.
            record.exc_text, record.exc_info = self.redact(record.exc_text), None
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


@contextmanager
def redacting_logs(redact: Callable[[str], str], *logger_names: str) -> Iterator[RedactingFilter]:
    """Attach one `RedactingFilter` to the named loggers for the duration of the block (a server's lifespan)."""
    f = RedactingFilter(redact)
    loggers = [logging.getLogger(n) for n in logger_names]
    for lg in loggers:
        lg.addFilter(f)
    try:
        yield f
    finally:
        for lg in loggers:
            lg.removeFilter(f)

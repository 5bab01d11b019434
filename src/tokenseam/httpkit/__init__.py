"""Small HTTP pieces shared by `tokenseam serve` and `tokenseam gateway`: strict JSON bodies, OpenAI-style
errors, the server-sent-event response, a Host/CORS/API-key guard, a 500 shield,
credential redaction, and a background server for tests and benchmarks.

Depends only on starlette, the standard library and `tokenseam.wire` (the shared wire contract, which imports
nothing), so either app can use it.
"""

from .background import BackgroundServer
from .body import (
    DEFAULT_MAX_DEPTH,
    check_content_type,
    find_surrogate,
    json_depth,
    parse_json_object,
    read_body_bytes,
    read_json_body,
)
from .errors import HTTPError
from .guard import LOOPBACK_HOSTS, Guard, default_allowed_hosts, host_only, normalize_host
from .redact import (
    MASK,
    RedactingFilter,
    is_secret_param,
    redact_text,
    redact_url,
    redacting_logs,
    url_secrets,
)
from .shield import REQUEST_ID_HEADER, CatchErrors
from .sse import SSE_HEADERS, sse_response

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "LOOPBACK_HOSTS",
    "MASK",
    "REQUEST_ID_HEADER",
    "SSE_HEADERS",
    "BackgroundServer",
    "CatchErrors",
    "Guard",
    "HTTPError",
    "RedactingFilter",
    "check_content_type",
    "default_allowed_hosts",
    "find_surrogate",
    "host_only",
    "is_secret_param",
    "json_depth",
    "normalize_host",
    "parse_json_object",
    "read_body_bytes",
    "read_json_body",
    "redact_text",
    "redact_url",
    "redacting_logs",
    "sse_response",
    "url_secrets",
]

"""`tokenseam gateway`: the response cache as an HTTP app in front of any OpenAI-compatible server.

`create_gateway_app(upstream_url, ...)` builds the Starlette app; `cli_gateway` is the command. It shares
`tokenseam.httpkit` (body reader, error objects, SSE, guard, redaction) with `tokenseam serve`.
"""

from .app import UpstreamError, create_gateway_app

__all__ = ["UpstreamError", "create_gateway_app"]

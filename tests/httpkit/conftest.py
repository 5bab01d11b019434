"""A tiny Starlette app wired with httpkit's pieces: reads a JSON body with `read_json_body`, behind `Guard`."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tokenseam.httpkit import Guard, HTTPError, read_json_body

MAX_BYTES = 4096


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "world"})


def make_app(max_bytes: int = MAX_BYTES, **guard) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        try:
            body = await read_json_body(request, max_bytes)
        except HTTPError as e:
            return e.response()
        return JSONResponse({"body": body})

    middleware = [Middleware(Guard, **guard)] if guard else []
    return Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/hello", hello, methods=["GET"]),
            Route("/health", hello, methods=["GET"]),
        ],
        middleware=middleware,
    )


@pytest.fixture
def make_client():
    clients = []

    def make(max_bytes: int = MAX_BYTES, **guard) -> TestClient:
        c = TestClient(make_app(max_bytes, **guard), base_url="http://127.0.0.1")
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()

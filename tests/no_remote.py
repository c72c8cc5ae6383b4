"""respx routers with no routes: any HTTP request that would leave the process fails.

`guard(allow_loopback)` starts two respx routers, one for httpx (through httpcore) and one
for httpx2 (through httpcore2, the stack openai 3.x uses), neither with a route: a request
that reaches the network layer raises respx's `AllMockedAssertionError` and is recorded,
so a caller that swallows the error still fails the test at teardown. Tests add the
routes they mock to these routers. This backs pytest-socket's block; it does not
replace it (a library that opens sockets without httpx is still caught there).
"""

from __future__ import annotations

from typing import Any

import httpcore2
import respx
from respx.mocks import HTTPCoreMocker
from respx.models import AllMockedAssertionError

__all__ = ["Guard", "guard"]


class HTTPCore2Mocker(HTTPCoreMocker):
    """respx's httpcore mocker pointed at httpcore2 (httpx2's connection layer)."""

    name = "httpcore2"
    targets = [
        "httpcore2._sync.connection.HTTPConnection",
        "httpcore2._sync.connection_pool.ConnectionPool",
        "httpcore2._sync.http_proxy.HTTPProxy",
        "httpcore2._async.connection.AsyncHTTPConnection",
        "httpcore2._async.connection_pool.AsyncConnectionPool",
        "httpcore2._async.http_proxy.AsyncHTTPProxy",
    ]
    target_methods = ["handle_request", "handle_async_request"]

    @classmethod
    def from_sync_httpx_response(cls, httpx_response: Any, target: Any, **kwargs: Any) -> Any:
        return httpcore2.Response(status=httpx_response.status_code,
                                  headers=httpx_response.headers.raw,
                                  content=httpx_response.stream,
                                  extensions=httpx_response.extensions)

    @classmethod
    async def from_async_httpx_response(cls, httpx_response: Any, target: Any,
                                        **kwargs: Any) -> Any:
        return cls.from_sync_httpx_response(httpx_response, target)


class _Router(respx.MockRouter):
    """A router that records every request none of its routes answered."""

    def __init__(self, escaped: list[str], **kw: Any) -> None:
        super().__init__(**kw)
        self._escaped = escaped

    def resolve(self, request: Any) -> Any:
        try:
            return super().resolve(request)
        except AllMockedAssertionError:
            self._escaped.append(f"{request.method} {request.url}")
            raise

    async def aresolve(self, request: Any) -> Any:
        try:
            return await super().aresolve(request)
        except AllMockedAssertionError:
            self._escaped.append(f"{request.method} {request.url}")
            raise


class Guard:
    """The started routers (`httpx`, `httpx2`) and the requests they refused."""

    def __init__(self, allow_loopback: bool) -> None:
        self.escaped: list[str] = []
        self.httpx = _Router(self.escaped, assert_all_mocked=True, assert_all_called=False,
                             using="httpcore")
        self.httpx2 = _Router(self.escaped, assert_all_mocked=True, assert_all_called=False,
                              using="httpcore2")
        if allow_loopback:  # a test of `warp serve` talks to its server on 127.0.0.1
            for router in (self.httpx, self.httpx2):
                router.route(host="127.0.0.1").pass_through()

    def start(self) -> Guard:
        self.httpx.start()
        self.httpx2.start()
        return self

    def stop(self) -> None:
        self.httpx2.stop(quiet=True)
        self.httpx.stop(quiet=True)


def guard(allow_loopback: bool = False) -> Guard:
    """Starts a `Guard`; call `stop()` and then check `escaped` is empty."""
    return Guard(allow_loopback).start()


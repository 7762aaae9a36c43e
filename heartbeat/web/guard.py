"""The page's security guard: loopback and exposure checks, the Host header, the methods served
(GET/HEAD, and POST on the one answer path only), the token, and same-origin for that POST."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from heartbeat.config.shape import Listen
from heartbeat.model.errors import BadInput
from heartbeat.web.answer import is_answer_path

__all__ = ["HostCheck", "is_loopback", "check_exposure"]
_TOKEN_ENV = "HEARTBEAT_WEB_TOKEN"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- listening: where, and who may ask ----------------------------------------------------


def is_loopback(host: str) -> bool:
    """Only a loopback address (or ``localhost``) keeps the page on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere


def check_exposure(listen: Listen, token: str) -> None:
    """Refuse to serve TCP without a token: every local user can connect to a port, loopback too.

    A Unix socket is created 0600 (:func:`_bind_unix`): only this user (and root) can connect.
    """
    if not listen.path and not token:
        raise BadInput(f"refusing to serve {listen} without a token (any local user can connect to a TCP port, "
                       f"loopback too): set --token, ${_TOKEN_ENV} or [http] token, or listen on unix:PATH")


def _strip_port(header: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``1.2.3.4``, ``[::1]``, each with an optional ``:port``),
    lowercased, without the port and a trailing dot; None when it is not one of those shapes."""
    value = header.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket:
            return None
    else:
        name, bracket, rest = value.partition(":")
        rest = bracket + rest
    if rest and not (rest[0] == ":" and rest[1:].isdigit()):
        return None
    return name.rstrip(".") or None


def _is_unspecified(host: str) -> bool:
    """``0.0.0.0`` or ``::``: listening on every address of the machine."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class HostCheck:
    """Which ``Host`` headers this server answers: a DNS-rebinding page sends its own name.

    An address literal cannot be rebound; a name can. Served: the listen address itself, any
    address literal when listening on a wildcard address, ``localhost`` (and the loopback
    literals) when listening on loopback, a wildcard or a Unix socket, and the names of
    ``[http] allowed_hosts`` (``--allow-host``). The port is not compared: a rebinding page
    already uses the right one.
    """

    def __init__(self, listen: Listen, names: Iterable[str] = ()) -> None:
        self.names: set[str] = set()
        self.addresses: set[Any] = set()
        self.any_address = _is_unspecified(listen.host)
        for name in (*names, listen.host):
            # As a Host header spells it ("name", "name:8443", "[::1]"), a bare IPv6 address bracketed.
            bare_v6 = name.count(":") > 1 and not name.startswith("[")
            self._add(_strip_port(f"[{name}]" if bare_v6 else name))
        if listen.path or is_loopback(listen.host) or self.any_address:
            self.names.add("localhost")
            self.addresses.update((ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")))

    def _add(self, host: str | None) -> None:
        if not host:
            return
        try:
            self.addresses.add(ipaddress.ip_address(host))
        except ValueError:
            self.names.add(host)

    def allows(self, header: str) -> bool:
        host = _strip_port(header)
        if host is None:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names
        return self.any_address or address in self.addresses


# -- the application -------------------------------------------------------------------------


class _Guard:
    """ASGI middleware, before anything else runs: the Host header (:class:`HostCheck`), only
    GET/HEAD (and POST on :data:`~heartbeat.web.answer.ANSWER_PATH`), the token when one is set,
    and a POST sent from this page's own origin (:func:`_cross_site`)."""

    def __init__(self, app: ASGIApp, token: str, hosts: HostCheck | None) -> None:
        self.app = app
        self.token = token.encode()
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        host = request.headers.get("host", "")
        if self.hosts is not None and not self.hosts.allows(host):
            # 421 Misdirected Request: a page served under another name (DNS rebinding) reads nothing.
            shown = host.encode("ascii", "backslashreplace").decode()[:100]
            response = PlainTextResponse(f"host {shown!r} is not served here: add it to [http] allowed_hosts "
                                         "(heartbeat web --allow-host)\n", 421)
        elif scope["method"] not in ("GET", "HEAD") and not (scope["method"] == "POST" and is_answer_path(
                scope["path"])):
            response = PlainTextResponse("this server answers GET and HEAD only (and a question's answer, posted "
                                         "by its form on the task's page)\n", 405, headers={"Allow": "GET, HEAD"})
        elif self.token and not self._authorized(request):
            response = PlainTextResponse("a token is required: Authorization: Bearer TOKEN, or ?token=TOKEN\n", 401,
                                         headers={"WWW-Authenticate": 'Bearer realm="heartbeat"'})
        elif scope["method"] == "POST" and (refusal := _cross_site(request, host)):
            response = PlainTextResponse(refusal + "\n", 403)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _authorized(self, request: Any) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        candidate = given.strip() if scheme.lower() == "bearer" else request.query_params.get("token", "")
        # compare_digest on bytes of any length is constant-time in the length of the secret.
        return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), self.token)


def _cross_site(request: Any, host: str) -> str:
    """Why a POST did not come from this page's own origin, or "" when it did (or says nothing).

    A browser sends ``Origin`` with every POST (the pages' ``Referrer-Policy: same-origin`` keeps it
    from being ``null`` on our own forms) and ``Sec-Fetch-Site``; each, when present, must name this
    server: the scheme is not compared (a TLS proxy in front rewrites it), the host and port are,
    against the ``Host`` header the guard has already checked."""
    origin = request.headers.get("origin")
    if origin is not None:
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme not in ("http", "https") or rest.lower() != host.strip().lower():
            shown = origin.encode("ascii", "backslashreplace").decode()[:100]
            return f"cross-origin: a form posted from {shown!r} is refused; answer on this server's own page"
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        shown = site.encode("ascii", "backslashreplace").decode()[:20]
        return f"cross-origin: a form posted from a {shown!r} page is refused; answer on this server's own page"
    return ""

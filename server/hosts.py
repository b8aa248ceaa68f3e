"""HostCheck: refuse requests whose Host header is not the address the server was reached on.

A web page can make a browser send requests to a server on the user's machine; with DNS
rebinding its own host name even resolves to 127.0.0.1, so the browser treats the server as the
page's origin. Such requests carry the page's host name in Host. A request passes when its Host
is the local address its connection arrived on (an IP literal), `localhost` on a loopback
address, a name given with `--allow-host`, or anything when `*` was given.
"""

from __future__ import annotations

import ipaddress

from fastapi.responses import JSONResponse

from .errors import APIError

LOOPBACK_NAMES = ("localhost", "localhost.")


def host_name(header: str) -> str:
    """The name in a Host header, lower case, without its port or an IPv6 address's brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, local_address: str | None, allowed: tuple[str, ...]) -> bool:
    if header is None or "*" in allowed:  # no Host: not a browser (every browser sends one)
        return True
    name = host_name(header)
    if name in allowed:
        return True
    if local_address is None:
        return False
    try:
        local = ipaddress.ip_address(local_address)
    except ValueError:
        return False
    if name in LOOPBACK_NAMES:
        return local.is_loopback
    try:
        return ipaddress.ip_address(name) == local
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware: 403 for a Host header host_allowed() refuses."""

    def __init__(self, app, allowed: tuple[str, ...]):
        self.app = app
        self.allowed = tuple(h.lower() for h in allowed)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            local = (scope.get("server") or (None,))[0]
            if not host_allowed(header, local, self.allowed):
                name = host_name(header)
                error = APIError(
                    403,
                    f"the Host header {name!r} is not this server's address; if clients reach the "
                    f"server by that name, start it with --allow-host {name}",
                    None,
                    "host_not_allowed",
                )
                return await JSONResponse(error.body(), error.status)(scope, receive, send)
        await self.app(scope, receive, send)

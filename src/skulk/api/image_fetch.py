"""Fetching an image a caller names by http(s) URL, without letting the URL reach into the
node's own network (docs/VISION.md).

A URL the API node fetches is a request the caller makes *from inside* the cluster: left
unchecked, `http://169.254.169.254/` or `http://127.0.0.1:52415/...` would read cloud
metadata or the node's own endpoints. So, unless the operator allows private addresses
(`SKULK_IMAGE_FETCH_ALLOW_PRIVATE=1`): only http(s); the host is resolved first and every
address it resolves to must be public (no private, loopback, link-local, shared, reserved
addresses); the connection goes to the checked address itself (so a second DNS answer cannot
swap it: the name goes only in the Host header and TLS SNI); redirects are followed by hand,
each target checked the same way, at most `MAX_REDIRECTS`. Multicast and unspecified
addresses are refused even with the switch. A body over the per-image bound is cut off and
refused; every URL of a request shares one deadline (`FETCH_DEADLINE_S`).

The decisions (`url_refusal`, `address_refusal`, `redirect_target`) are pure; `fetch_images`
is the shell that owns DNS, sockets and the clock.

Errors (a 400 in the caller's shape, `param` naming the URL's field):

    ImageRefused (InvalidRequest)
    ├── image_url_refused   a scheme, host or address this node does not fetch, a redirect to one
    │                       or too many redirects
    └── image_fetch_failed  the fetch itself failed: unresolvable, unreachable, a non-2xx answer,
                            a body above the bound, past the deadline. A 400 (the caller's URL
                            is what failed, as OpenAI answers), not a 502: nothing of ours broke.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urljoin, urlsplit

import httpx

from skulk.api.errors import ImageRefused
from skulk.api.media import MAX_IMAGE_BYTES, MAX_REQUEST_IMAGE_BYTES, too_large
from skulk.shared.settings import setting

FETCH_DEADLINE_S: Final = 10.0
"""All the URLs of one request, resolved, fetched and read, within this many seconds: a slow
or stalling server costs the caller a 400, never a held request slot."""

MAX_REDIRECTS: Final = 3
"""Redirects followed per URL (each target checked like the first URL)."""

ALLOW_PRIVATE_ENV: Final = "SKULK_IMAGE_FETCH_ALLOW_PRIVATE"
"""The operator switch: `1` lets image URLs name private and loopback addresses (a LAN
image server); multicast and unspecified addresses stay refused."""

_SCHEMES: Final = frozenset({"http", "https"})
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    allow_private: bool = False
    deadline_s: float = FETCH_DEADLINE_S
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FetchPolicy:
        raw = setting(ALLOW_PRIVATE_ENV, env).lower()
        return cls(allow_private=raw not in ("", "0", "false", "no", "off"))


def _refused(param: str, why: str) -> ImageRefused:
    return ImageRefused(f"'{param}': this node does not fetch that URL: {why}.", param=param,
                          code="image_url_refused")


def _failed(param: str, why: str) -> ImageRefused:
    return ImageRefused(f"'{param}': the image could not be fetched: {why}.", param=param,
                          code="image_fetch_failed")


def url_refusal(url: str) -> str | None:
    """Why `url` is not fetched at all (its scheme or shape), or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return "it is not a valid URL"
    if parts.scheme.lower() not in _SCHEMES:
        return f"only http and https URLs are fetched, not {parts.scheme or 'a relative URL'!r}"
    if not parts.hostname:
        return "it names no host"
    if parts.username is not None or parts.password is not None:
        return "it carries credentials"
    return None


def address_refusal(address: IpAddress, *, allow_private: bool) -> str | None:
    """Why the node does not connect to `address` for an image, or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_refusal(address.ipv4_mapped, allow_private=allow_private)
    if address.is_multicast or address.is_unspecified:
        return f"{address} is a multicast or unspecified address"
    if allow_private:
        return None
    if address.is_loopback:
        return f"{address} is a loopback address"
    if address.is_link_local:
        return f"{address} is a link-local address"
    if address.is_private or address.is_reserved or not address.is_global:
        return f"{address} is a private or reserved address ({ALLOW_PRIVATE_ENV}=1 allows private ones)"
    return None


def redirect_target(url: str, status: int, location: str | None, hops: int, max_redirects: int) -> str | None:
    """The URL a response redirects to (relative locations resolved against `url`), None
    when it is no redirect; `ValueError` naming why when it is one not to follow."""
    if status not in _REDIRECTS:
        return None
    if not location:
        raise ValueError(f"a {status} redirect without a Location")
    if hops >= max_redirects:
        raise ValueError(f"more than {max_redirects} redirects")
    return urljoin(url, location)


async def system_resolve(host: str, port: int) -> Sequence[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _checked_addresses(host: str, port: int, policy: FetchPolicy, resolve: Resolver,
                             param: str) -> list[IpAddress]:
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            answers = await resolve(host, port)
        except OSError as exc:
            raise _failed(param, f"{host} does not resolve ({exc})") from None
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in answers]
    if not addresses:
        raise _failed(param, f"{host} does not resolve")
    for address in addresses:  # every answer: a name resolving to one public and one private address is refused
        if (why := address_refusal(address, allow_private=policy.allow_private)) is not None:
            raise _refused(param, why)
    return addresses


def _pinned(url: str, address: IpAddress) -> tuple[str, dict[str, str], dict[str, str]]:
    """`url` rewritten to connect to `address`, with the Host header and TLS server name
    of the original host."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    if ":" in host and not host_header.startswith("["):
        host_header = f"[{host}]" if parts.port is None else f"[{host}]:{parts.port}"
    extensions = {"sni_hostname": host} if parts.scheme.lower() == "https" else {}
    return parts._replace(netloc=netloc).geturl(), {"Host": host_header}, extensions


async def _read_bounded(response: httpx.Response, limit_bytes: int, param: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise too_large(int(declared), param)
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > limit_bytes:
            raise too_large(len(body), param)
    return bytes(body)


async def _fetch_one(client: httpx.AsyncClient, url: str, param: str, policy: FetchPolicy, resolve: Resolver,
                     limit_bytes: int) -> bytes:
    hops = 0
    while True:
        if (why := url_refusal(url)) is not None:
            raise _refused(param, why)
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        addresses = await _checked_addresses(parts.hostname or "", port, policy, resolve, param)
        target, headers, extensions = _pinned(url, addresses[0])
        try:
            async with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                try:
                    following = redirect_target(url, response.status_code, response.headers.get("location"), hops,
                                                policy.max_redirects)
                except ValueError as exc:
                    raise _refused(param, str(exc)) from None
                if following is None:
                    if not 200 <= response.status_code < 300:
                        raise _failed(param, f"the server answered {response.status_code}")
                    return await _read_bounded(response, limit_bytes, param)
        except httpx.HTTPError as exc:
            raise _failed(param, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        url, hops = following, hops + 1


async def fetch_images(urls: Sequence[tuple[str, str]], policy: FetchPolicy, *, resolve: Resolver = system_resolve,
                       transport: httpx.AsyncBaseTransport | None = None) -> dict[str, bytes]:
    """The bodies of the http(s) image URLs of one request, each `(url, param)` (the field
    that names it, for errors), fetched one after another under one deadline; their bytes
    together bounded by `MAX_REQUEST_IMAGE_BYTES`. A typed 400 for the first that fails."""
    fetched: dict[str, bytes] = {}
    if not urls:
        return fetched
    total = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.deadline_s
    async with httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False,
                                 timeout=httpx.Timeout(policy.deadline_s)) as client:
        for url, param in urls:
            if url in fetched:
                continue
            limit = min(MAX_IMAGE_BYTES, MAX_REQUEST_IMAGE_BYTES - total)
            try:
                async with asyncio.timeout_at(deadline):
                    body = await _fetch_one(client, url, param, policy, resolve, max(limit, 0))
            except TimeoutError:
                raise _failed(param, f"not fetched within {policy.deadline_s:g} s") from None
            except ImageRefused as error:
                if error.code == "image_too_large" and limit < MAX_IMAGE_BYTES:  # the request's budget, not the image's
                    raise ImageRefused(f"The request's images are more than {MAX_REQUEST_IMAGE_BYTES} bytes in all "
                                         f"(at '{param}').", param=param, code="images_too_large") from None
                raise
            fetched[url] = body
            total += len(body)
    return fetched


async def fetch_request_images(urls: Sequence[tuple[str, str]]) -> dict[str, bytes]:
    """`fetch_images` under this node's policy (`SKULK_IMAGE_FETCH_ALLOW_PRIVATE`)."""
    return await fetch_images(urls, FetchPolicy.from_env()) if urls else {}


__all__ = [
    "ALLOW_PRIVATE_ENV",
    "FETCH_DEADLINE_S",
    "MAX_REDIRECTS",
    "FetchPolicy",
    "address_refusal",
    "fetch_images",
    "fetch_request_images",
    "redirect_target",
    "system_resolve",
    "url_refusal",
]

"""Fetching image URLs (`skulk.api.image_fetch`): the pure refusals as tables, then the
shell against a scripted transport (public names, redirects, bounds) and a real HTTP server
on 127.0.0.1 (refused by default, fetched with the operator switch). No internet."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import AsyncIterator

import httpx
import pytest

from skulk.api import image_fetch
from skulk.api.errors import InvalidRequest
from skulk.api.image_fetch import FetchPolicy, address_refusal, fetch_images, redirect_target, url_refusal
from skulk.api.media import MAX_IMAGE_BYTES
from tests.api.vision_kit import image_bytes, loopback_server

PUBLIC = "93.184.216.34"
PNG = image_bytes()


@pytest.mark.parametrize(("url", "refused"), [
    ("https://images.example/cat.png", False),
    ("http://images.example:8080/cat.png", False),
    ("ftp://images.example/cat.png", True),
    ("file:///etc/passwd", True),
    ("https:///nohost", True),
    ("https://user:pw@images.example/cat.png", True),
    ("https://images.example:99999/", True),
    ("//images.example/cat.png", True),
])
def test_url_refusal(url: str, refused: bool) -> None:
    assert (url_refusal(url) is not None) == refused


@pytest.mark.parametrize(("address", "refused", "refused_with_switch"), [
    (PUBLIC, False, False),
    ("2606:2800:220:1:248:1893:25c8:1946", False, False),
    ("127.0.0.1", True, False),
    ("::1", True, False),
    ("10.1.2.3", True, False),
    ("172.16.0.1", True, False),
    ("192.168.1.1", True, False),
    ("100.64.0.1", True, False),  # carrier-grade NAT: not global
    ("169.254.169.254", True, False),  # cloud metadata
    ("fe80::1", True, False),
    ("fd00::1", True, False),
    ("::ffff:127.0.0.1", True, False),  # IPv4-mapped loopback
    ("0.0.0.0", True, True),
    ("::", True, True),
    ("224.0.0.1", True, True),
    ("ff02::1", True, True),
])
def test_address_refusal(address: str, refused: bool, refused_with_switch: bool) -> None:
    ip = ipaddress.ip_address(address)
    assert (address_refusal(ip, allow_private=False) is not None) == refused
    assert (address_refusal(ip, allow_private=True) is not None) == refused_with_switch


@pytest.mark.parametrize(("status", "location", "hops", "expected"), [
    (200, None, 0, None),
    (302, "/b.png", 0, "https://images.example/b.png"),
    (301, "https://cdn.example/c.png", 2, "https://cdn.example/c.png"),
    (307, "http://127.0.0.1/x", 0, "http://127.0.0.1/x"),  # followed only after its address is checked
    (302, None, 0, ValueError),
    (308, "/again", 3, ValueError),
])
def test_redirect_target(status: int, location: str | None, hops: int, expected: object) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError):
            redirect_target("https://images.example/a.png", status, location, hops, 3)
    else:
        assert redirect_target("https://images.example/a.png", status, location, hops, 3) == expected


def test_the_switch_is_a_declared_setting() -> None:
    assert not FetchPolicy.from_env({}).allow_private
    assert FetchPolicy.from_env({image_fetch.ALLOW_PRIVATE_ENV: "1"}).allow_private
    assert not FetchPolicy.from_env({image_fetch.ALLOW_PRIVATE_ENV: "off"}).allow_private


def resolver(table: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("no such host")
        return table[host]
    return resolve


async def _fetch(handler, url: str = "https://images.example/a.png", names=None, policy=FetchPolicy()):
    names = names if names is not None else {"images.example": [PUBLIC], "cdn.example": [PUBLIC]}
    return await fetch_images([(url, "messages[0].content[0].image_url.url")], policy, resolve=resolver(names),
                              transport=httpx.MockTransport(handler))


async def test_the_connection_goes_to_the_checked_address_with_the_names_host() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=PNG)

    assert await _fetch(handler) == {"https://images.example/a.png": PNG}
    [request] = seen
    assert (request.url.host, request.headers["host"], request.extensions["sni_hostname"]) == (
        PUBLIC, "images.example", "images.example")


async def _refusal(handler, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as raised:
        await _fetch(handler, **kwargs)
    assert raised.value.param == "messages[0].content[0].image_url.url"
    return raised.value


async def test_redirects_are_followed_by_hand_and_each_target_checked() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/a.png":
            return httpx.Response(302, headers={"location": "https://cdn.example/b.png"})
        return httpx.Response(200, content=PNG)

    assert await _fetch(handler) == {"https://images.example/a.png": PNG}

    def to_loopback(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "http://127.0.0.1:52415/state"})

    assert (await _refusal(to_loopback)).code == "image_url_refused"

    def forever(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": "/again"})

    error = await _refusal(forever)
    assert error.code == "image_url_refused" and "redirects" in error.message


async def test_a_name_with_any_private_answer_is_refused() -> None:
    error = await _refusal(lambda r: httpx.Response(200, content=PNG),
                           names={"images.example": [PUBLIC, "10.0.0.5"]})
    assert error.code == "image_url_refused" and "10.0.0.5" in error.message


async def _endless() -> AsyncIterator[bytes]:
    for _ in range(21):
        yield b"\0" * (1 << 20)


@pytest.mark.parametrize(("response", "code"), [
    (lambda: httpx.Response(404), "image_fetch_failed"),
    (lambda: httpx.Response(200, headers={"content-length": str(MAX_IMAGE_BYTES + 1)}, content=b""),
     "image_too_large"),
    (lambda: httpx.Response(200, content=_endless()), "image_too_large"),  # no length: cut off
])
async def test_failed_and_oversized_fetches(response, code: str) -> None:
    assert (await _refusal(lambda r: response())).code == code


async def test_an_unresolvable_or_unreachable_host_fails() -> None:
    assert (await _refusal(lambda r: httpx.Response(200), names={})).code == "image_fetch_failed"

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert (await _refusal(unreachable)).code == "image_fetch_failed"


# ---------------------------------------------------------------------------------------
# A real server on loopback
# ---------------------------------------------------------------------------------------


async def test_loopback_is_refused_by_default_and_fetched_with_the_switch() -> None:
    with loopback_server() as url:
        with pytest.raises(InvalidRequest) as raised:
            await fetch_images([(url, "u")], FetchPolicy())
        assert raised.value.code == "image_url_refused" and "loopback" in raised.value.message
        assert await fetch_images([(url, "u")], FetchPolicy(allow_private=True)) == {url: PNG}


async def test_a_stalled_server_fails_at_the_deadline() -> None:
    release = threading.Event()
    with loopback_server(release) as url:
        with pytest.raises(InvalidRequest) as raised:
            await fetch_images([(url, "u")], FetchPolicy(allow_private=True, deadline_s=0.3))
    assert raised.value.code == "image_fetch_failed"


async def test_the_request_budget_bounds_fetches_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_fetch, "MAX_REQUEST_IMAGE_BYTES", len(PNG) + 10)
    urls = [("https://images.example/a.png", "first"), ("https://images.example/b.png", "second")]
    with pytest.raises(InvalidRequest) as raised:
        await fetch_images(urls, FetchPolicy(), resolve=resolver({"images.example": [PUBLIC]}),
                           transport=httpx.MockTransport(lambda r: httpx.Response(200, content=PNG)))
    assert (raised.value.param, raised.value.code) == ("second", "images_too_large")

"""Choosing the store host: explicit setting > master's advertised store > bootstrap self."""

from __future__ import annotations

import pytest

from skulk.model_store.host import (
    StoreAddress,
    StoreAddressError,
    advertised_store,
    choose_store,
    parse_store_address,
)

OWN = StoreAddress("10.0.0.1", 52415)
MASTER = StoreAddress("10.0.0.2", 52415)
EXPLICIT = StoreAddress("10.0.0.9", 6000)


@pytest.mark.parametrize(
    ("explicit", "master", "own_hosts", "address", "source", "is_self"),
    [
        (None, None, frozenset(), OWN, "bootstrap", True),
        (None, MASTER, frozenset(), MASTER, "master", False),
        (EXPLICIT, MASTER, frozenset(), EXPLICIT, "explicit", False),
        (EXPLICIT, None, frozenset(), EXPLICIT, "explicit", False),
        (None, OWN, frozenset(), OWN, "master", True),
        (StoreAddress("localhost", 52415), MASTER, frozenset({"localhost"}), StoreAddress("localhost", 52415),
         "explicit", True),
        (StoreAddress("10.0.0.1", 9999), None, frozenset(), StoreAddress("10.0.0.1", 9999), "explicit", False),
    ],
)
def test_choose_store(explicit, master, own_hosts, address, source, is_self):
    choice = choose_store(explicit, master, OWN, own_hosts)
    assert (choice.address, choice.source, choice.is_self) == (address, source, is_self)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("store.lan", StoreAddress("store.lan", 52415)),
        ("10.0.0.2:6000", StoreAddress("10.0.0.2", 6000)),
        ("http://10.0.0.2:6000", StoreAddress("10.0.0.2", 6000)),
        ("https://store.lan", StoreAddress("store.lan", 52415, "https")),
        ("[fe80::1]:7000", StoreAddress("fe80::1", 7000)),
        (" store.lan/ ", StoreAddress("store.lan", 52415)),
    ],
)
def test_parse_store_address(text, expected):
    assert parse_store_address(text, 52415) == expected


@pytest.mark.parametrize("text", ["", "ftp://x", "host:notaport", "http://host/store", "http://:80"])
def test_parse_store_address_refuses(text):
    with pytest.raises(StoreAddressError):
        parse_store_address(text, 52415)


def test_base_url_brackets_v6():
    assert StoreAddress("fe80::1", 7000).base_url == "http://[fe80::1]:7000"


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://10.0.0.2:52415", StoreAddress("10.0.0.2", 52415)),
        ("http://[fe80::1]:52415", StoreAddress("fe80::1", 52415)),
        ("https://store.lan", StoreAddress("store.lan", 443, "https")),
        (None, None),
        ("", None),
        ("not a url at all/with/path", None),
    ],
)
def test_advertised_store_from_the_masters_api_endpoint(endpoint, expected):
    assert advertised_store(endpoint) == expected

"""The commands' JSON and URLs (scheduler/cli/wire.py) are the standard library's: the
same text as `json.dumps(..., separators=(",", ":"))`, the same values as `json.loads`
(and a ValueError where it refuses), and the same URLs as `urljoin`, `urlsplit` and
`urlencode` for the URLs the API gives, on generated inputs."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cli import wire

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(documents)
def test_json_out_and_back_is_the_standard_librarys(value: Any) -> None:
    text = wire.dumps(value)
    assert text == json.dumps(value, separators=(",", ":")).encode()
    assert wire.loads(text) == json.loads(text)
    pretty = json.dumps(value, indent=2, ensure_ascii=False)  # whitespace and UTF-8 too
    assert wire.loads(pretty.encode()) == json.loads(pretty)


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"a":}', "[1,2", '"unterminated', "{} {}", "nul", "01", b"\xff\xfe"],
)
def test_what_json_refuses_is_a_value_error(text: str | bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        wire.loads(text)


def test_json_constants_read_as_json_reads_them() -> None:
    assert math.isnan(wire.loads("NaN")) and wire.loads("[Infinity, -Infinity]") == [
        math.inf,
        -math.inf,
    ]
    with pytest.raises(TypeError, match="not JSON serializable"):
        wire.dumps({"when": object()})


hosts = st.sampled_from(["127.0.0.1", "localhost", "api.example.org", "[::1]", "Spur.Example"])
ports = st.one_of(st.none(), st.integers(1, 65535))
segments = st.lists(
    st.text(alphabet="abcxyz019-_.~", min_size=1, max_size=6).filter(lambda s: s not in ".."),
    max_size=4,
)
queries = st.dictionaries(
    st.text(alphabet="abc_=&é ", min_size=1, max_size=5), st.text(max_size=8), max_size=3
)


def url_of(scheme: str, host: str, port: int | None, path: list[str], slash: bool) -> str:
    netloc = host if port is None else f"{host}:{port}"
    return f"{scheme}://{netloc}/" + "/".join(path) + ("/" if slash and path else "")


@settings(max_examples=300)
@given(
    st.sampled_from(["http", "https"]),
    hosts,
    ports,
    segments,
    st.booleans(),
    segments,
    st.sampled_from(["", "/", "?", "//other.host:81", "http://elsewhere/x?cursor=abc"]),
    queries,
)
def test_urls_are_the_standard_librarys(
    scheme: str,
    host: str,
    port: int | None,
    base_path: list[str],
    slash: bool,
    ref_path: list[str],
    ref_kind: str,
    params: dict[str, str],
) -> None:
    base = url_of(scheme, host, port, base_path, slash)
    ref = {
        "": "/".join(ref_path),
        "/": "/" + "/".join(ref_path),
        "?": "?cursor=" + "/".join(ref_path),
    }.get(ref_kind, ref_kind)
    assert wire.join(base, ref) == urljoin(base, ref)
    joined = urljoin(base, ref) + ("?" + urlencode(params) if params else "")
    ours, theirs = wire.Url(joined), urlsplit(joined)
    assert (ours.scheme, ours.netloc, ours.path, ours.query) == (
        theirs.scheme,
        theirs.netloc,
        theirs.path,
        theirs.query,
    )
    assert (ours.host, ours.port) == (theirs.hostname, theirs.port)
    assert wire.query(params) == urlencode(params)


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "http://host:port/", "http://h:70000/"])
def test_a_url_the_client_cannot_use_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError):
        wire.Url(url)

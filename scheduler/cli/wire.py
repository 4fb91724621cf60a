"""What the commands put on the wire and read back: JSON bodies, and the URLs of the web
API (its base, a path under it, a query, the `next` link of a page).

Every command pays its imports at every start, and the standard library's `json` and
`urllib.parse` import `re`, which imports `enum`: together more than half of the
interpreter's own start (tests/scheduler/cli/test_startup.py, bench/cli.py). So JSON
goes through `_json`, the C codec the `json` package itself runs on (the same scanner
and encoder, without its Python layer), and URLs through the few lines below, which do
what `urljoin`, `urlsplit` and `urlencode` do for the URLs this API uses (absolute
http(s) URLs, paths without dot segments); tests/scheduler/cli/test_wire.py checks them
against the standard library's on generated inputs.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class _Decoding:
    """What the scanner reads of its decoder (json.decoder.JSONDecoder's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:  # NaN, Infinity, -Infinity, as json reads them
        return float(name.replace("Infinity", "inf"))


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_scan: Any = _json.make_scanner(_Decoding)  # type: ignore[arg-type]
# json.dumps(value, separators=(",", ":")): ASCII, no indent, keys as given, NaN allowed,
# no check for cycles (the commands send plain trees of their own).
_encode: Any = _json.make_encoder(
    None, _refuse, _json.encode_basestring_ascii, None, ":", ",", False, False, True
)


def loads(data: bytes | str) -> Any:
    """The value of a JSON document; ValueError if it is not one."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    text = text.strip(" \t\n\r")
    try:
        value, end = _scan(text, 0)
    except StopIteration as stop:
        raise ValueError(f"not JSON: nothing to read at {stop.value}") from None
    if end != len(text):
        raise ValueError(f"not JSON: extra data at {end}")
    return value


def dumps(value: Any) -> bytes:
    """`value` as compact JSON text (as `json.dumps` with separators `,` and `:`)."""
    return "".join(_encode(value, 0)).encode()


# -- URLs -----------------------------------------------------------------------------

# What a query's names and values keep as they are (urlencode's quote_plus: the
# unreserved characters); a space becomes +, everything else %XX of its UTF-8 bytes.
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


class Url:
    """An absolute http(s) URL, split as `urlsplit` splits it."""

    __slots__ = ("host", "netloc", "path", "port", "query", "scheme")

    def __init__(self, url: str) -> None:
        scheme, sep, rest = url.partition("://")
        if not sep or not scheme:
            raise ValueError(f"{url}: not an absolute URL")
        self.scheme = scheme.lower()
        cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
                  default=len(rest))  # fmt: skip
        self.netloc, tail = rest[:cut], rest[cut:]
        tail = tail.partition("#")[0]
        self.path, _, self.query = tail.partition("?")
        hostport = self.netloc.rpartition("@")[2]
        if hostport.startswith("["):  # an IPv6 address
            host, _, after = hostport[1:].partition("]")
            port_text = after[1:] if after.startswith(":") else ""
        else:
            host, _, port_text = hostport.partition(":")
        self.host = host.lower()
        if port_text and not port_text.isdigit():
            raise ValueError(f"{url}: the port is not a number")
        self.port = int(port_text) if port_text else None
        if self.port is not None and not 0 <= self.port <= 65535:
            raise ValueError(f"{url}: the port is out of range 0-65535")

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.netloc}"

    @property
    def target(self) -> str:
        """What a request line names: the path (at least `/`) and the query."""
        path = self.path or "/"
        return f"{path}?{self.query}" if self.query else path


def join(base: str, ref: str) -> str:
    """`ref` (a URL, or a path relative to `base`) as an absolute URL, as `urljoin` for
    references without dot segments."""
    if "://" in ref.partition("?")[0]:
        return ref
    url = Url(base)
    if ref.startswith("//"):
        return f"{url.scheme}:{ref}"
    if ref.startswith("/"):
        return url.origin + ref
    if not ref:
        return base.partition("#")[0]
    if ref.startswith("?"):
        return url.origin + (url.path or "/") + ref
    directory = url.path[: url.path.rfind("/") + 1] or "/"
    return url.origin + directory + ref


def query(params: Mapping[str, str]) -> str:
    """`urlencode(params)`: name=value pairs, each quoted as `quote_plus` quotes."""
    return "&".join(f"{_quote(str(k))}={_quote(str(v))}" for k, v in params.items())


def _quote(text: str) -> str:
    if (
        text.isascii()
        and text.replace("_", "a").replace(".", "a").replace("-", "a").replace("~", "a").isalnum()
    ):
        return text  # nothing to quote: the usual case (ids, names, states)
    out = []
    for byte in text.encode("utf-8"):
        if byte in _SAFE:
            out.append(chr(byte))
        elif byte == 0x20:
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


__all__ = ["Url", "dumps", "join", "loads", "query"]

"""One error family for the internal APIs, raised by handlers and by clients alike.

A client sees the error the server raised: `Refused` (400: the request can never
succeed as sent), `Unauthorized` (401, a refusal), `NotFound` (404), `Conflict` (409:
valid, but the state does not allow it now, e.g. holding a running job), `Unavailable`
(503, or no answer at all: worth retrying). Any other 5xx is `Unavailable` too; any other
4xx a `Refused` with its status.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING: every CLI command imports this, not typing
if TYPE_CHECKING:
    from typing import Any, ClassVar

UNREACHABLE = "unreachable"  # the code of an Unavailable that no server sent: no answer came


class RpcError(Exception):
    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "error"

    def __init__(self, message: str, *, code: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        if status is not None:
            self.status = status  # type: ignore[misc]

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code}


class Refused(RpcError):
    status = 400
    default_code = "bad_request"


class Unauthorized(Refused):
    status = 401
    default_code = "unauthorized"


class NotFound(RpcError):
    status = 404
    default_code = "not_found"


class Conflict(RpcError):
    status = 409
    default_code = "conflict"


class Unavailable(RpcError):
    status = 503
    default_code = "unavailable"


def error_for(status: int, message: str, code: str = "") -> RpcError:
    """The error an answer with this status stands for."""
    if status == 401:
        return Unauthorized(message, code=code)
    if status == 404:
        return NotFound(message, code=code)
    if status == 409:
        return Conflict(message, code=code)
    if status >= 500:
        return Unavailable(message, code=code, status=status)
    return Refused(message, code=code, status=status)


__all__ = [
    "Conflict",
    "NotFound",
    "Refused",
    "UNREACHABLE",
    "RpcError",
    "Unauthorized",
    "Unavailable",
    "error_for",
]

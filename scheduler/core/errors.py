"""Errors the core raises. Each carries a message meant for the person who asked."""


class InvalidSpec(ValueError):
    """A job, node or command description is malformed. `field`: the field at fault,
    when one is (the API maps the message onto it)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class Rejected(Exception):
    """A well-formed command that the current state refuses (the state is unchanged)."""

    def __init__(self, message: str, *, code: str = "rejected") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

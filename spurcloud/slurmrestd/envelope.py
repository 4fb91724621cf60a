"""What every slurmrestd answer carries: `meta`, `errors` and `warnings`, and the errors
as slurmrestd words them (`{error, error_number, description, source}`).

Where slurmrestd answers an error with HTTP 500 (an unknown job id, for one), we answer
the status the web API gives the same error (404, 400, 409, 503): clients read the
`errors` list either way, and no refusal of bad input is a server error here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

# The Slurm release each data_parser version first shipped with (meta.slurm.version).
VERSIONS: dict[str, tuple[int, int, int]] = {
    "v0.0.40": (23, 11, 0),
    "v0.0.41": (24, 5, 0),
    "v0.0.42": (24, 11, 0),
}
VERSION_RE = r"v0\.0\.4[0-2]"

# Slurm's error numbers (slurm_errno.h) for the errors these routes give.
SLURM_ERROR = -1
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1001
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
ESLURM_ACCESS_DENIED = 2002
ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE = 2014
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_INVALID_PARTITION_NAME = 2000
ESLURM_REST_INVALID_QUERY = 9000
ESLURM_REST_FAIL_PARSING = 9001
ESLURM_REST_INVALID_JOBS_DESC = 9002


@dataclass
class SlurmError(Exception):
    """A refusal in slurmrestd's shape, with the HTTP status we answer it with."""

    status: int
    error_number: int
    error: str
    description: str = ""
    source: str = ""
    warnings: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.description or self.error)

    def as_dict(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "error_number": self.error_number,
            "description": self.description or self.error,
            "source": self.source,
        }


def warning(description: str, source: str) -> dict[str, str]:
    return {"description": description, "source": source}


def meta(version: str, *, user: str = "", group: str = "", source: str = "") -> dict[str, Any]:
    major, minor, micro = VERSIONS.get(version, VERSIONS["v0.0.42"])
    return {
        "plugin": {
            "type": "openapi/slurmctld",
            "name": "Slurm OpenAPI slurmctld",
            "data_parser": f"data_parser/{version}",
            "accounting_storage": "",
        },
        "client": {"source": source, "user": user, "group": group},
        "command": [],
        "slurm": {
            "version": {"major": str(major), "minor": f"{minor:02d}", "micro": str(micro)},
            "release": f"{major}.{minor:02d}.{micro}",
            "cluster": str(settings.SPUR_CLUSTER_NAME),
        },
    }


def envelope(
    version: str,
    body: dict[str, Any],
    *,
    errors: list[dict[str, Any]] | None = None,
    warnings: list[dict[str, str]] | None = None,
    user: str = "",
    group: str = "",
    source: str = "",
) -> dict[str, Any]:
    """`body` with slurmrestd's `meta`, `errors` and `warnings` around it."""
    return {
        **body,
        "meta": meta(version, user=user, group=group, source=source),
        "errors": list(errors or ()),
        "warnings": list(warnings or ()),
    }

"""pgq_thin: the thin Python side of pgq. Every state change is one call of a pgq.* function."""

from pgq_thin.client import Client
from pgq_thin.errors import (
    ConnectionLost,
    InvalidArgument,
    JobNotFound,
    PermissionDenied,
    PgqError,
    WrongState,
)
from pgq_thin.migrate import migrate
from pgq_thin.models import (
    HealthFinding,
    Job,
    JobEvent,
    JobRecord,
    QueueSettings,
    QueueStats,
    Schedule,
    TenantSettings,
)

__all__ = [
    "Client",
    "HealthFinding",
    "JobEvent",
    "JobRecord",
    "TenantSettings",
    "ConnectionLost",
    "InvalidArgument",
    "Job",
    "JobNotFound",
    "PermissionDenied",
    "PgqError",
    "QueueSettings",
    "QueueStats",
    "Schedule",
    "WrongState",
    "migrate",
]
#: The package version: written here only (pyproject.toml reads it from here). The schema has a
#: version of its own, pgq.version(): the number of its newest migration.
__version__ = "0.1.0"

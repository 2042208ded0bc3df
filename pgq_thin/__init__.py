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
from pgq_thin.models import Job, QueueSettings, QueueStats

__all__ = [
    "Client",
    "ConnectionLost",
    "InvalidArgument",
    "Job",
    "JobNotFound",
    "PermissionDenied",
    "PgqError",
    "QueueSettings",
    "QueueStats",
    "WrongState",
    "migrate",
]
__version__ = "0.1.0"

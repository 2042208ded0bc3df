"""pgq_thin: the thin Python side of pgq. Every state change is one call of a pgq.* function."""

from pgq_thin.async_client import AsyncClient
from pgq_thin.client import Client
from pgq_thin.errors import (
    BadArgument,
    BadArgumentType,
    ConnectionLost,
    InvalidArgument,
    JobNotFound,
    LeaseLost,
    PermissionDenied,
    PgqError,
    WaitTimeout,
    WrongState,
)
from pgq_thin.migrate import migrate
from pgq_thin.models import (
    BatchStatus,
    DependencyResult,
    HealthFinding,
    Job,
    JobEvent,
    JobLink,
    JobRecord,
    JobResult,
    QueueGrant,
    QueueMetrics,
    QueueSettings,
    QueueStats,
    Schedule,
    TenantSettings,
    UnreadableJson,
)
from pgq_thin.worker import AsyncWorker, JobContext, OutcomeUnknown, Retry, Snooze, Worker

__all__ = [
    "AsyncClient",
    "AsyncWorker",
    "BatchStatus",
    "Client",
    "DependencyResult",
    "JobLink",
    "JobResult",
    "WaitTimeout",
    "HealthFinding",
    "JobEvent",
    "JobRecord",
    "QueueGrant",
    "TenantSettings",
    "BadArgument",
    "BadArgumentType",
    "ConnectionLost",
    "UnreadableJson",
    "InvalidArgument",
    "Job",
    "JobContext",
    "JobNotFound",
    "LeaseLost",
    "OutcomeUnknown",
    "PermissionDenied",
    "PgqError",
    "QueueMetrics",
    "QueueSettings",
    "QueueStats",
    "Retry",
    "Schedule",
    "Snooze",
    "Worker",
    "WrongState",
    "migrate",
]
#: The package version: written here only (pyproject.toml reads it from here). The schema has a
#: version of its own, pgq.version(): the number of its newest migration.
__version__ = "0.1.0"

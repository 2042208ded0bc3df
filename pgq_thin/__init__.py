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
    JobOutcome,
    JobRecord,
    JobResult,
    QueueGrant,
    QueueMetrics,
    QueueSettings,
    QueueStats,
    Schedule,
    SignalAnswer,
    SleepAnswer,
    StepLookup,
    StepRecord,
    TenantSettings,
    UnreadableJson,
)
from pgq_thin.tasks import Task
from pgq_thin.worker import AsyncWorker, JobContext, OutcomeUnknown, Parked, Retry, SignalTimeout, Snooze, Worker

__all__ = [
    "AsyncClient",
    "AsyncWorker",
    "BatchStatus",
    "Client",
    "DependencyResult",
    "JobLink",
    "JobOutcome",
    "JobResult",
    "SignalAnswer",
    "SleepAnswer",
    "StepLookup",
    "StepRecord",
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
    "Task",
    "Parked",
    "PermissionDenied",
    "PgqError",
    "QueueMetrics",
    "QueueSettings",
    "QueueStats",
    "Retry",
    "Schedule",
    "SignalTimeout",
    "Snooze",
    "Worker",
    "WrongState",
    "migrate",
]
#: The package version: written here only (pyproject.toml reads it from here). The schema has a
#: version of its own, pgq.version(): the number of its newest migration.
__version__ = "0.1.0"

"""The worker runtimes: run registered handlers on claimed jobs, in N threads (Worker) or N
asyncio tasks (AsyncWorker).

    worker = Worker(queues=["default"], concurrency=4)

    @worker.handler("send_email")
    def send_email(job, ctx):
        ...                      # return a JSON-serializable result (or None)

    worker.run()                 # blocks until SIGTERM / SIGINT or worker.stop()

A worker is made of parts, each a module of its own with one job (every state change is one pgq
function, called through pgq_thin.Client):

- ``claimer``: THE CLAIM LOOP. Claims with pgq.claim as many jobs as the ``prefetch`` policy
  allows (free slots, plus places for jobs that wait for a slot; more while claims come back
  full), hands them to the ``slots``, sweeps now and then (pgq.sweep), and sleeps until a NOTIFY,
  a freed slot or the next poll. After a claim that came back short (keys at their limit, a
  capped queue), a claim carries the completions queued meanwhile (pgq.complete_and_claim: one
  call, one commit, and the claim sees the places they free).
- ``executor``: runs one handler and turns its outcome into exactly one owner call
  (``outcomes`` maps returned / raised to the call): a handler that returns None joins the
  ``completer``'s queue, sent by its next pgq.complete_many or with the claimer's next claim,
  whichever takes it first; any other outcome is one call of pgq.complete,
  pgq.fail, pgq.snooze or pgq.mark_unknown (``owner``), repeated with the same attempt while the
  connection is down.
- ``held``: the registry of the jobs we hold, and the one place that decides that a job is
  settled once.
- ``renewer``: renews every held job's lease at about a third of the lease, by the database
  clock; a job that is no longer ours gets ``ctx.lease_lost`` and its outcome is discarded.
- ``listener``: LISTEN pgq on a dedicated connection; a payload naming one of our queues wakes
  the claimer. Polling is the fallback (and the only mechanism with listen=False). It LISTENs
  pgq_cancel too: pgq.cancel of a running job names its attempt, the renewer renews that job at
  once, and a refusal sets ``ctx.cancelled`` (an async handler's task is cancelled).
- ``middleware``: the chain of ``worker.middleware(fn)`` around each handler, composed once per
  run (none registered: the handler itself), and the on_start / on_stop hooks' rules.
- ``context``: the JobContext a handler gets (lease_lost, cancelled, deadline, progress,
  dependency results); ``transaction``: ``ctx.transaction()``, the handler's own transaction,
  whose end runs pgq.complete in it (settled through ``held`` like any other end).
- ``signals``: the first SIGTERM / SIGINT stops gracefully, the second at once.
- ``metrics`` (with ``metrics_port``): the worker's Prometheus metrics, counted around each
  handler (``JobWatch``), after each claim and when a held job is lost; ``tracing``: one
  OpenTelemetry span per job attempt when opentelemetry-api is installed. Neither library is
  imported unless asked for.
- ``threaded`` (Worker) wires the parts together; the shutdown waits for running jobs up to
  shutdown_timeout, then gives back what is left (pgq.release).
- ``aio`` (AsyncWorker) wires the same rules for asyncio: ``aio_parts`` holds the claimer,
  slots, completer, renewer, listener and owner calls as tasks; the registry, prefetch policy,
  outcomes, poll timer, database clock and signal rule are the very objects Worker uses.
"""

from pgq_thin.worker.aio import AsyncWorker
from pgq_thin.worker.base import POOLED_POLL_INTERVAL
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.outcomes import OutcomeUnknown, Retry, Snooze
from pgq_thin.worker.prefetch import AUTO_PREFETCH_DEEP, AUTO_PREFETCH_MAX, AUTO_PREFETCH_WAIT
from pgq_thin.worker.support import CHANNEL
from pgq_thin.worker.threaded import Worker

__all__ = ["AUTO_PREFETCH_DEEP", "AUTO_PREFETCH_MAX", "AUTO_PREFETCH_WAIT", "CHANNEL", "POOLED_POLL_INTERVAL",
           "AsyncWorker", "Handler", "JobContext", "OutcomeUnknown", "Retry", "Snooze", "Worker"]

"""The worker runtimes: run registered handlers on claimed jobs, in N threads (Worker) or N
asyncio tasks (AsyncWorker).

    worker = Worker(queues=["default"], concurrency=4)

    @worker.handler("send_email")
    def send_email(job, ctx):
        ...                      # return a JSON-serializable result (or None)

    worker.run()                 # blocks until SIGTERM / SIGINT or worker.stop()

A worker is made of parts, each a module of its own with one job (every state change is one pgq
function, called through pgq_thin.Client). Each part is written once, for asyncio, in the module of
its rules; the thread runtime's (pgq_thin/worker/threads/) is generated from it by
scripts/async_to_sync.py, and only how a part waits has two versions (``waits``, ``threads.waits``):

- ``claimer``: THE CLAIM LOOP. Claims with pgq.claim as many jobs as the ``prefetch`` policy
  allows (free slots, plus places for jobs that wait for a slot; more while claims come back
  full), hands them to the ``slots``, sweeps now and then (pgq.sweep), and sleeps until its
  ClaimNudge wakes it (a NOTIFY, a freed slot, its completions committed, stop) or the next poll.
  After a claim that came back short (keys at their limit, a capped queue), a claim carries the
  completions queued meanwhile (pgq.complete_and_claim: one call, one commit, and the claim sees
  the places they free).
- ``executor``: runs one handler and turns its outcome into exactly one owner call
  (``outcomes`` maps returned / raised to the call): a handler that returns None joins the
  ``completer``'s queue, sent by its next pgq.complete_many or with the claimer's next claim,
  whichever takes it first; any other outcome is one call of pgq.complete,
  pgq.fail, pgq.snooze or pgq.mark_unknown (``owner``), repeated with the same attempt while the
  connection is down. On asyncio an ``async def`` handler runs in the slot's task and a plain one
  in a handler thread (``bridge``); a thread runtime's slot calls it in its thread.
- ``held``: the registry of the jobs we hold, and the one place that decides that a job is
  settled once.
- ``renewer``: renews every held job's lease at about a third of the lease, by the database
  clock; a job that is no longer ours gets ``ctx.lease_lost`` and its outcome is discarded.
- ``listener``: LISTEN pgq on a dedicated connection; a payload naming one of our queues wakes
  the claimer. Polling is the fallback (and the only mechanism with listen=False). It LISTENs
  pgq_cancel too: pgq.cancel of a running job names its attempt, the renewer renews that job at
  once, and a refusal sets ``ctx.cancelled`` (an async handler's task is cancelled).
- ``heartbeat``: the worker in the registry of live workers (pgq.worker_heartbeat) at start,
  every heartbeat_interval and at a graceful stop; at start, a warning for each kind of its queues'
  pending jobs that no live worker handles (pgq.queue_kinds).
- ``middleware``: the chain of ``worker.middleware(fn)`` around each handler, composed once per
  run (none registered: the handler itself), and the on_start / on_stop hooks' rules.
- ``context``: the JobContext a handler gets (lease_lost, cancelled, deadline, progress,
  dependency results); ``durable``: its steps that run once, durable sleeps, signal waits,
  children and waits for them (a wait that parks the job ends the attempt: nothing is recorded
  for it); ``transaction``: ``ctx.transaction()``, the handler's own transaction,
  whose end runs pgq.complete in it (settled through ``held`` like any other end).
- ``signals``: the first SIGTERM / SIGINT stops gracefully, the second at once.
- ``metrics`` (with ``metrics_port``): the worker's Prometheus metrics, counted around each
  handler (``JobWatch``), after each claim and when a held job is lost; ``tracing``: one
  OpenTelemetry span per job attempt when opentelemetry-api is installed. Neither library is
  imported unless asked for.
- ``engine``: one run: builds the parts in dependency order (each takes its collaborators in its
  constructor), starts them, and shuts down (waits for running jobs up to shutdown_timeout, then
  gives back what is left: pgq.release). ``aio`` (AsyncWorker) awaits it; ``threaded`` (Worker)
  runs its generated twin.
"""

from pgq_thin.worker.aio import AsyncWorker
from pgq_thin.worker.base import POOLED_POLL_INTERVAL
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.durable import Parked, SignalTimeout
from pgq_thin.worker.outcomes import OutcomeUnknown, Retry, Snooze
from pgq_thin.worker.prefetch import AUTO_PREFETCH_DEEP, AUTO_PREFETCH_MAX, AUTO_PREFETCH_WAIT
from pgq_thin.worker.support import CHANNEL
from pgq_thin.worker.threaded import Worker

__all__ = ["AUTO_PREFETCH_DEEP", "AUTO_PREFETCH_MAX", "AUTO_PREFETCH_WAIT", "CHANNEL", "POOLED_POLL_INTERVAL",
           "AsyncWorker", "Handler", "JobContext", "OutcomeUnknown", "Parked", "Retry", "SignalTimeout", "Snooze",
           "Worker"]

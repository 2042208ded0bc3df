"""Procrastinate's adapter (runs in bench/peers/.work/venv): an App on its PsycopgConnector, async
tasks, ``app.run_worker_async(concurrency=W)`` with its defaults otherwise (LISTEN/NOTIFY on,
fetch_job_polling_interval 5 s, finished jobs kept). Schema: its schema manager. Jobs: one bulk
insert (``app.job_manager.batch_defer_jobs_async``).

Per-key limit (keyed, variant ``lock``): every job is deferred with ``lock=<its key>`` ("no two jobs
with the same lock string can run simultaneously").
"""

from __future__ import annotations

import asyncio
import signal

import peer
import procrastinate


def make_app(dsn: str, recorder: peer.Recorder) -> tuple[procrastinate.App, dict[str, procrastinate.tasks.Task]]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bench")
    async def noop() -> None:
        recorder.count()

    @app.task(name="keyed", queue="bench")
    async def keyed(key: str) -> None:
        start = peer.now()
        await asyncio.sleep(peer.SLEEP)
        recorder.add(key, start, peer.now())

    return app, {"noop": noop, "keyed": keyed}


async def enqueue(app: procrastinate.App, tasks: dict[str, procrastinate.tasks.Task], jobs: int,
                  keyed: bool) -> None:
    async with app.open_async():
        if keyed:
            new = [tasks["keyed"].configure(lock=peer.key_of(i)).make_new_job(key=peer.key_of(i)) for i in range(jobs)]
        else:
            new = [tasks["noop"].configure().make_new_job() for _ in range(jobs)]
        for start in range(0, jobs, 5000):
            await app.job_manager.batch_defer_jobs_async(new[start:start + 5000])


async def work(app: procrastinate.App, workers: int) -> None:
    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(queues=["bench"], concurrency=workers,
                                                          install_signal_handlers=False))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await asyncio.wait([worker, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        worker.cancel()  # its documented way to stop gracefully: running jobs finish first
        try:
            await worker
        except asyncio.CancelledError:
            pass


def main() -> None:
    args = peer.arguments()
    recorder = peer.Recorder()
    app, tasks = make_app(args.dsn, recorder)
    if args.mode == "migrate":
        async def apply() -> None:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(apply())
        return
    asyncio.run(enqueue(app, tasks, args.jobs, args.keyed))
    peer.ready_then_go()
    asyncio.run(work(app, args.workers))
    recorder.report()


if __name__ == "__main__":
    main()

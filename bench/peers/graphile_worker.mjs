// graphile-worker's adapter: run({ preset, taskList }) with concurrentJobs W and its defaults
// otherwise, but maxPoolSize max(10, W + 2) (its documented advice: "10 or concurrentJobs + 2,
// whichever is larger").
// Schema: runMigrations. Jobs: one bulk WorkerUtils.addJobs per 5,000.
//
// Variants: default; local-queue: the batching of its performance page (localQueue.size 500,
// completeJobBatchDelay 0, failJobBatchDelay 0). Per-key limit (keyed, variant named-queues):
// every job is added with queueName = its key (a named queue runs its jobs one at a time).

import { args, keyOf, now, peerImport, readyThenGo, Recorder, sleep, SLEEP_MS, terminated } from './peer.mjs'

const { makeWorkerUtils, run, runMigrations } = await peerImport('graphile-worker')
const opts = args()

if (opts.mode === 'migrate') {
  await runMigrations({ connectionString: opts.dsn })
  process.exit(0)
}

const utils = await makeWorkerUtils({ connectionString: opts.dsn })
for (let start = 0; start < opts.jobs; start += 5000) {
  const specs = []
  for (let i = start; i < Math.min(opts.jobs, start + 5000); i++) {
    specs.push(opts.keyed
      ? { identifier: 'keyed', payload: { key: keyOf(i) }, queueName: keyOf(i) }
      : { identifier: 'noop', payload: {} })
  }
  await utils.addJobs(specs)
}
await utils.release()

const recorder = new Recorder()
const taskList = {
  noop: async () => { recorder.count() },
  keyed: async (payload) => {
    const start = now()
    await sleep(SLEEP_MS)
    recorder.add(payload.key, start, now())
  }
}
const batching = opts.variant === 'local-queue'
  ? { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
  : {}
await readyThenGo()
const runner = await run({
  preset: {
    worker: { connectionString: opts.dsn, concurrentJobs: opts.workers, maxPoolSize: Math.max(10, opts.workers + 2), ...batching }
  },
  taskList,
  noHandleSignals: true
})
await terminated()
await runner.stop()
await recorder.report()
process.exit(0)

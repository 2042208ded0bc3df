// pg-boss's adapter: one PgBoss (pool size max(10, W + 2), like graphile-worker's) with
// work(queue, { localConcurrency: W, batchSize: 10, burstWhenBatchFull: true }) and its defaults
// otherwise: W workers, each fetching up to 10 jobs at once and fetching again at once while its
// fetches come back full (without burstWhenBatchFull a worker waits its polling interval, 2 s,
// after every fetch). A worker runs its batch's handlers one after the other, so at most W run at
// once. Schema: PgBoss.start() (its migrator) and createQueue. Jobs: one bulk insert per 5,000.
//
// Per-key limit (keyed): every job is inserted with group { id: its key }; variant local-groups:
// work(..., { localGroupConcurrency: 1 }) (in-memory, per process); db-groups: work(...,
// { groupConcurrency: 1 }) (counted in the database, across processes). Keyed workers poll every
// 0.5 s (pollingIntervalSeconds, its minimum) when a fetch comes back short.

import { args, keyOf, now, peerImport, readyThenGo, Recorder, sleep, SLEEP_MS, terminated } from './peer.mjs'

const { PgBoss } = await peerImport('pg-boss')
const opts = args()
const QUEUE = 'bench'
const connect = () => {
  const boss = new PgBoss({ connectionString: opts.dsn, max: Math.max(10, opts.workers + 2) })
  boss.on('error', (err) => process.stderr.write(`pg-boss error: ${err.message}\n`))
  return boss
}

if (opts.mode === 'migrate') {
  const boss = connect()
  await boss.start()
  await boss.createQueue(QUEUE)
  await boss.stop({ graceful: true })
  process.exit(0)
}

const loader = connect()
await loader.start()
for (let start = 0; start < opts.jobs; start += 5000) {
  const jobs = []
  for (let i = start; i < Math.min(opts.jobs, start + 5000); i++) {
    jobs.push(opts.keyed ? { data: { key: keyOf(i) }, group: { id: keyOf(i) } } : { data: {} })
  }
  await loader.insert(QUEUE, jobs)
}
await loader.stop({ graceful: true })

const recorder = new Recorder()
const options = { localConcurrency: opts.workers, batchSize: 10, burstWhenBatchFull: true }
if (opts.keyed) {
  options.pollingIntervalSeconds = 0.5
  if (opts.variant === 'local-groups') options.localGroupConcurrency = 1
  else if (opts.variant === 'db-groups') options.groupConcurrency = 1
  else throw new Error(`unknown keyed variant ${opts.variant}`)
}
await readyThenGo()
const boss = connect()
await boss.start()
await boss.work(QUEUE, options, async (jobs) => {
  if (!opts.keyed) {
    recorder.count(jobs.length)
    return
  }
  for (const job of jobs) {
    const start = now()
    await sleep(SLEEP_MS)
    recorder.add(job.data.key, start, now())
  }
})
await terminated()
await boss.stop({ graceful: true })
await recorder.report()
process.exit(0)

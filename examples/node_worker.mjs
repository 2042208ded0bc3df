// A pgq worker in Node.js with the `pg` package: the SQL API is all a worker needs.
//
// A job must finish within its lease (LEASE, or the queue's lease): this worker does not renew
// leases, so a job still running when its lease ends is claimed again by another worker and runs
// twice (this one's late write is then refused). Set LEASE longer than your longest job, or call
// pgq.renew(id, attempt) every third of the lease while a job runs (pgq_thin's workers do).
//
//   cd examples && npm install
//   DATABASE_URL=postgresql://... QUEUE=emails node node_worker.mjs [--drain]
//
// Environment (the same as psql_worker.sh):
//   PGQ_DSN or DATABASE_URL  where pgq is installed (when both are unset, pg's PG* variables apply)
//   QUEUE                    the queue to work on (default: default)
//   WORKER                   this worker's name, recorded as claimed_by (default: node-HOST-PID)
//   BATCH                    jobs claimed per pgq.claim call, 1 to 1000 (default: 10)
//   LEASE                    lease per claim, e.g. '2 minutes' (default: the queue's lease)
//   RETRY_IN                 delay before a failed job is retried (default: the queue's backoff)
//   POLL_INTERVAL            seconds to sleep after an empty claim (default: 1)
//
// --drain: exit (status 0) as soon as a claim returns nothing, instead of polling. Tests use it.
//
// The demo handler: a job whose payload has "fail": true fails (pgq.fail), one with "sleep": N
// takes N seconds first, anything else completes (pgq.complete) with a small result.
//
// Every value is a query parameter ($1, $2, ...), never pasted into SQL text, and every write
// quotes the attempt the claim returned: if the job was recovered and claimed again meanwhile
// (our lease expired), pgq answers "not yours" (false / NULL) and nothing changes.
// SIGTERM or SIGINT: the job at hand is finished, the rest of the batch is given back with
// pgq.release, and the worker exits.

import os from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";

const env = process.env;
const config = {
  connectionString: env.PGQ_DSN || env.DATABASE_URL || undefined,
  queue: env.QUEUE || "default",
  worker: env.WORKER || `node-${os.hostname()}-${process.pid}`,
  batch: Number.parseInt(env.BATCH || "10", 10),
  lease: env.LEASE || null,
  retryIn: env.RETRY_IN || null,
  pollInterval: Number.parseFloat(env.POLL_INTERVAL || "1"),
};

const args = process.argv.slice(2);
const unknown = args.filter((a) => a !== "--drain");
if (unknown.length > 0) {
  console.error(`node_worker: unknown argument: ${unknown[0]}`);
  process.exit(2);
}
const drain = args.includes("--drain");

const log = (message) => console.error(`node_worker[${config.worker}]: ${message}`);

// pg hands bigint (int8) columns back as strings; ids stay strings and go back as parameters.
const SQL = {
  claim: `SELECT id, attempt, kind, payload
          FROM pgq.claim(worker => $1, queues => ARRAY[$2::text], batch => $3::integer,
                         lease => $4::interval)`,
  complete: "SELECT pgq.complete(id => $1::bigint, attempt => $2::integer, result => $3::jsonb) AS ok",
  fail: `SELECT pgq.fail(id => $1::bigint, attempt => $2::integer, error => $3::text,
                         retry_in => $4::interval) AS state`,
  release: "SELECT pgq.release(id => $1::bigint, attempt => $2::integer) AS ok",
};

// The work. Returns the job's result; throws to fail it.
async function handleJob(job) {
  const { payload } = job;
  if (typeof payload.sleep === "number" && payload.sleep > 0) {
    await sleep(payload.sleep * 1000);
  }
  if (payload.fail === true) {
    throw new Error(`demo handler: job ${job.id} (${job.kind}) asked to fail: ${JSON.stringify(payload)}`);
  }
  return { handled_by: config.worker };
}

let stopping = false;
let wake = null; // resolves the sleep after an empty claim early, on a signal
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    if (!stopping) log("stopping: finishing the job at hand, releasing the rest");
    stopping = true;
    wake?.abort();
  });
}

async function main() {
  const client = new pg.Client({ connectionString: config.connectionString });
  await client.connect();
  log(`working on queue ${config.queue} (batch ${config.batch}${drain ? ", drain mode" : ""})`);
  let handled = 0;
  try {
    while (!stopping) {
      const { rows: jobs } = await client.query(SQL.claim, [
        config.worker, config.queue, config.batch, config.lease,
      ]);
      if (jobs.length === 0) {
        if (drain) break;
        wake = new AbortController();
        await sleep(config.pollInterval * 1000, undefined, { signal: wake.signal }).catch(() => {});
        continue;
      }
      for (const job of jobs) {
        const tag = `job ${job.id} attempt ${job.attempt}`;
        if (stopping) {
          const { rows } = await client.query(SQL.release, [job.id, job.attempt]);
          log(rows[0].ok ? `${tag}: released unstarted, pending again` : `${tag}: not ours any more, nothing to release`);
          continue;
        }
        let result;
        try {
          result = await handleJob(job);
        } catch (err) {
          const error = err instanceof Error ? (err.stack ?? err.message) : String(err);
          const { rows } = await client.query(SQL.fail, [job.id, job.attempt, error, config.retryIn]);
          const state = rows[0].state;
          log(state === null ? `${tag}: not ours any more, failure rejected`
            : state === "pending" ? `${tag}: failed; it will be retried after its backoff`
            : `${tag}: failed for good (no attempts left)`);
          handled += 1;
          continue;
        }
        const { rows } = await client.query(SQL.complete, [job.id, job.attempt, result]);
        log(rows[0].ok ? `${tag}: done` : `${tag}: not ours any more, completion rejected`);
        handled += 1;
      }
    }
  } finally {
    await client.end();
  }
  log(`exiting after ${handled} jobs`);
}

// The server's errors carry a SQLSTATE (pg.DatabaseError); the others (a refused connection, say)
// carry Node's own error code, such as ECONNREFUSED.
function describe(err) {
  if (err instanceof pg.DatabaseError) return `${err.message} (SQLSTATE ${err.code})`;
  return err?.code ? `${err.message} (Node error code ${err.code})` : String(err?.message ?? err);
}

main().catch((err) => {
  log(`fatal: ${describe(err)}`);
  process.exit(1);
});

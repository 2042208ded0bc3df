// Enqueue a job and wait for its result in Node.js with the `pg` package: LISTEN pgq_finished,
// read pgq.job_result. The same flow as psql_wait_result.sh, without its tick.
//
//   cd examples && npm install
//   DATABASE_URL=postgresql://... QUEUE=reports KIND=build PAYLOAD='{"month": "2026-11"}' \
//       node node_wait_result.mjs [--timeout SECONDS]
//   DATABASE_URL=postgresql://... node node_wait_result.mjs --job ID [--timeout SECONDS]
//
// The first form enqueues a job (pgq.enqueue(..., notify_finished => true)) and waits for it; the
// second waits for a job enqueued earlier with notify_finished => true (by any client).
//
// Environment (the same as psql_wait_result.sh):
//   PGQ_DSN or DATABASE_URL  where pgq is installed (when both are unset, pg's PG* variables apply)
//   QUEUE                    the queue to enqueue into (default: default)
//   KIND                     the job's kind (default: demo)
//   PAYLOAD                  the job's payload, a JSON object (default: {})
//
// Prints the outcome as one line of JSON on stdout, the same line psql_wait_result.sh prints:
//   {"id" : 42, "state" : "done", "result" : {...}, "last_error" : null, "finished_at" : "..."}
// Exit status, as pgq-thin wait's: 0 done; 1 failed or cancelled, or an error (SQL or connection:
// said on stderr, nothing on stdout); 3 not ended within --timeout (stderr names the job and its
// state then); 2 bad usage. Without --timeout it waits as long as it takes.
//
// A job enqueued with notify_finished => true makes the transaction that ends it (done, failed or
// cancelled) run pg_notify('pgq_finished', '<job id>'); other jobs notify nothing. The channel
// carries every such job's id: a waiter keeps only its own. A notification reaches the sessions
// listening when the ending transaction commits, so the order is: LISTEN, then enqueue, then one
// read of pgq.job_result anyway (with --job the job may have ended before the LISTEN), then wait
// for the id, then read the result. pgq.job_result answers the login that enqueued the job,
// pgq_admin, and roles whose read grants admit its queue; anyone else gets SQLSTATE P0002, as for
// an unknown id.

import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";

const env = process.env;
const config = {
  connectionString: env.PGQ_DSN || env.DATABASE_URL || undefined,
  queue: env.QUEUE || "default",
  kind: env.KIND || "demo",
  payload: env.PAYLOAD || "{}",
};

const log = (message) => console.error(`node_wait_result: ${message}`);
function usage(message) {
  log(message);
  process.exit(2);
}

let jobId = null;
let timeout = null;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 2) {
  const [flag, value] = [args[i], args[i + 1]];
  if (flag === "--job") {
    // Compared with the notification's payload as text: digits only, no leading zero.
    if (!/^[1-9][0-9]*$/.test(value ?? "")) usage(`--job takes a job id (a positive integer), not '${value ?? ""}'`);
    jobId = value;
  } else if (flag === "--timeout") {
    if (!/^[0-9]+(\.[0-9]+)?$/.test(value ?? "")) usage(`--timeout takes seconds, not '${value ?? ""}'`);
    timeout = Number.parseFloat(value);
  } else {
    usage(`unknown argument: ${flag}`);
  }
}

const FINAL = new Set(["done", "failed", "cancelled"]);

// pg hands bigint (int8) back as a string: the id stays a string, as the notification's payload is.
const SQL = {
  enqueue: `SELECT pgq.enqueue(queue => $1::text, kind => $2::text, payload => $3::jsonb,
                               notify_finished => true) AS id`,
  // The JSON is built by the server (::text: pg would parse it), byte for byte psql's line.
  result: `SELECT r.state, json_build_object('id', $1::bigint, 'state', r.state, 'result', r.result,
                                             'last_error', r.last_error, 'finished_at', r.finished_at)::text AS line
           FROM pgq.job_result($1::bigint) AS r`,
};

async function main() {
  const client = new pg.Client({ connectionString: config.connectionString });
  await client.connect();
  // Every id notified from the LISTEN on, kept until ours is known (a fast worker may end the job
  // before the enqueue's answer is read); then a waiter is woken by its own id.
  const notified = new Set();
  let wake = null;
  client.on("notification", (msg) => {
    if (msg.channel !== "pgq_finished") return;
    notified.add(msg.payload);
    if (msg.payload === jobId) wake?.();
  });
  try {
    await client.query("LISTEN pgq_finished");
    if (jobId === null) {
      const { rows } = await client.query(SQL.enqueue, [config.queue, config.kind, config.payload]);
      jobId = rows[0].id;
      log(`enqueued job ${jobId} (queue ${config.queue}, kind ${config.kind})`);
    }
    const deadline = timeout === null ? null : Date.now() + timeout * 1000;
    for (;;) {
      const arrived = new Promise((resolve) => { wake = resolve; });
      if (notified.has(jobId)) wake();
      const { rows } = await client.query(SQL.result, [jobId]);
      const { state, line } = rows[0];
      if (FINAL.has(state)) {
        console.log(line);
        if (state !== "done") log(`job ${jobId} ended ${state}`);
        return state === "done" ? 0 : 1;
      }
      if (deadline !== null && Date.now() >= deadline) {
        log(`timed out after ${timeout} s: job ${jobId} is still ${state}`);
        return 3;
      }
      log(`job ${jobId} is ${state}; waiting for its notification`);
      const timer = new AbortController();
      const waits = [arrived];
      if (deadline !== null) {
        waits.push(sleep(Math.max(0, deadline - Date.now()), undefined, { signal: timer.signal }).catch(() => {}));
      }
      await Promise.race(waits);
      timer.abort();
      notified.delete(jobId);
      // The loop reads the result again: the job's end, or the last word before the timeout.
    }
  } finally {
    await client.end();
  }
}

// The server's errors carry a SQLSTATE (pg.DatabaseError); the others (a refused connection, say)
// carry Node's own error code, such as ECONNREFUSED.
function describe(err) {
  if (err instanceof pg.DatabaseError) return `${err.message} (SQLSTATE ${err.code})`;
  return err?.code ? `${err.message} (Node error code ${err.code})` : String(err?.message ?? err);
}

main().then((code) => {
  process.exitCode = code;
}).catch((err) => {
  log(`fatal: ${describe(err)}`);
  process.exit(1);
});

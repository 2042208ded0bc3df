// A durable workflow in Node.js with the `pg` package (issue 39): the same workflow as
// psql_workflow.sh, with the same environment and the same log lines: steps that run once whatever
// crashes, a durable sleep, a wait for a human's approval and children awaited, none of which holds
// the worker.
//
//   cd examples && npm install
//   DATABASE_URL=postgresql://... node node_workflow.mjs [--drain]
//
// Environment: PGQ_DSN or DATABASE_URL, QUEUE (default: orders), WORKER, COOL_OFF (default
// '2 seconds'), APPROVAL_TIMEOUT (default '1 day'), POLL_INTERVAL (default 1).
//
// --drain: exit (status 0) as soon as a claim returns nothing. Tests use it.
//
// The workflow of an order (kind fulfil_order, payload {"order": N}), run from the top by every
// attempt: step "reserve"; the durable sleep "cool-off"; the approval "approved:N"; two children
// (kind pack_item) awaited; step "invoice" from their results; complete. Unlike the psql version,
// it reads the job's recorded steps once per attempt (pgq.get_steps): each step then costs one
// call, its record (pgq.record_step), or none when it is recorded already. A call that ends the
// attempt (sleeping, waiting) makes the handler return at once without completing; a call answered
// "not yours" (a stale attempt) stops it. Each step's body logs "step <name> ran".

import os from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";

const env = process.env;
const config = {
  connectionString: env.PGQ_DSN || env.DATABASE_URL || undefined,
  queue: env.QUEUE || "orders",
  worker: env.WORKER || `node-workflow-${os.hostname()}-${process.pid}`,
  coolOff: env.COOL_OFF || "2 seconds",
  approvalTimeout: env.APPROVAL_TIMEOUT || "1 day",
  pollInterval: Number.parseFloat(env.POLL_INTERVAL || "1"),
};
const args = process.argv.slice(2);
if (args.some((a) => a !== "--drain")) {
  console.error(`node_workflow: unknown argument: ${args.find((a) => a !== "--drain")}`);
  process.exit(2);
}
const drain = args.includes("--drain");
const log = (message) => console.error(`node_workflow[${config.worker}]: ${message}`);

// pg hands bigint (int8) columns back as strings; ids stay strings and go back as parameters.
const SQL = {
  claim: `SELECT id, attempt, kind, payload FROM pgq.claim(worker => $1, queues => ARRAY[$2::text], batch => 1)`,
  steps: "SELECT name, result FROM pgq.get_steps(id => $1::bigint, attempt => $2::integer, limit_rows => 10000)",
  record: "SELECT pgq.record_step(id => $1::bigint, attempt => $2::integer, name => $3::text, result => $4::jsonb) AS ok",
  sleep: "SELECT status FROM pgq.sleep(id => $1::bigint, attempt => $2::integer, name => $3::text, delay => $4::interval)",
  awaitSignal: `SELECT status, payload FROM pgq.await_signal(id => $1::bigint, attempt => $2::integer,
                name => $3::text, timeout => $4::interval)`,
  spawn: `SELECT pgq.spawn(id => $1::bigint, attempt => $2::integer, name => $3::text, queue => $4::text,
          kind => $5::text, payload => $6::jsonb) AS id`,
  awaitJobs: "SELECT pgq.await_jobs(id => $1::bigint, attempt => $2::integer, ids => $3::bigint[]) AS status",
  outcomes: `SELECT job_id, state, result FROM pgq.job_outcomes(id => $1::bigint, attempt => $2::integer,
             ids => $3::bigint[]) ORDER BY job_id`,
  complete: "SELECT pgq.complete(id => $1::bigint, attempt => $2::integer, result => $3::jsonb) AS ok",
  fail: `SELECT pgq.fail(id => $1::bigint, attempt => $2::integer, error => $3::text, retryable => false) AS state`,
};

// The attempt ended (the job sleeps or waits): the handler returns without completing.
class Parked extends Error {}
// The attempt is not ours any more (a stale attempt, or another login's): the handler stops.
class NotOurs extends Error {}

// One attempt of a job: its recorded steps read once, each step run only while it has none.
class Attempt {
  constructor(client, job) {
    this.client = client;
    this.id = job.id;
    this.attempt = job.attempt;
    this.recorded = null;
  }

  async step(name, body) {
    if (this.recorded === null) {
      const { rows } = await this.client.query(SQL.steps, [this.id, this.attempt]);
      this.recorded = new Map(rows.map((r) => [r.name, r.result]));
    }
    if (this.recorded.has(name)) return this.recorded.get(name);
    const result = await body();
    log(`job ${this.id}: step ${name} ran`);
    const { rows } = await this.client.query(SQL.record, [this.id, this.attempt, name, JSON.stringify(result)]);
    if (!rows[0].ok) throw new NotOurs();
    this.recorded.set(name, result);
    return result;
  }

  async sleep(name, delay) {
    const { rows } = await this.client.query(SQL.sleep, [this.id, this.attempt, name, delay]);
    if (rows.length === 0) throw new NotOurs();
    if (rows[0].status === "sleeping") {
      log(`job ${this.id}: sleeping (${name})`);
      throw new Parked();
    }
  }

  async waitForSignal(name, timeout) {
    const { rows } = await this.client.query(SQL.awaitSignal, [this.id, this.attempt, name, timeout]);
    if (rows.length === 0) throw new NotOurs();
    if (rows[0].status === "waiting") {
      log(`job ${this.id}: waiting for ${name}`);
      throw new Parked();
    }
    return rows[0]; // { status: "arrived", payload } or { status: "timed_out", payload: null }
  }

  async spawn(name, queue, kind, payload) {
    const { rows } = await this.client.query(SQL.spawn, [this.id, this.attempt, name, queue, kind,
      JSON.stringify(payload)]);
    if (rows[0].id === null) throw new NotOurs();
    return rows[0].id;
  }

  async waitForJobs(ids) {
    const { rows } = await this.client.query(SQL.awaitJobs, [this.id, this.attempt, ids]);
    if (rows[0].status === null) throw new NotOurs();
    if (rows[0].status === "waiting") {
      log(`job ${this.id}: waiting for its children ${ids.join(",")}`);
      throw new Parked();
    }
    return (await this.client.query(SQL.outcomes, [this.id, this.attempt, ids])).rows;
  }

  async end(sql, params) {
    const { rows } = await this.client.query(sql, [this.id, this.attempt, ...params]);
    if (rows[0].ok === false || rows[0].state === null) throw new NotOurs();
  }
}

async function fulfilOrder(run, payload) {
  const order = payload.order;
  await run.step("reserve", async () => ({ reservation: `r-${order}` }));
  await run.sleep("cool-off", config.coolOff);
  const approval = await run.waitForSignal(`approved:${order}`, config.approvalTimeout);
  if (approval.status === "timed_out") {
    log(`job ${run.id}: no approval in time`);
    await run.end(SQL.fail, ["not approved in time"]);
    return;
  }
  const kids = [];
  for (const n of [1, 2]) kids.push(await run.spawn(`pack-${n}`, config.queue, "pack_item", { order, item: n }));
  const outcomes = await run.waitForJobs(kids);
  const invoice = await run.step("invoice", async () => ({
    order,
    approved_by: approval.payload.by,
    packed: outcomes.map((o) => o.result),
  }));
  await run.end(SQL.complete, [JSON.stringify(invoice)]);
}

async function packItem(run, payload) {
  await run.end(SQL.complete, [JSON.stringify({ item: payload.item, packed: true })]);
}

const handlers = { fulfil_order: fulfilOrder, pack_item: packItem };

async function main() {
  const client = new pg.Client({ connectionString: config.connectionString });
  await client.connect();
  log(`working on queue ${config.queue}${drain ? " (drain mode)" : ""}`);
  try {
    for (;;) {
      const { rows } = await client.query(SQL.claim, [config.worker, config.queue]);
      if (rows.length === 0) {
        if (drain) break;
        await sleep(config.pollInterval * 1000);
        continue;
      }
      const job = rows[0];
      const run = new Attempt(client, job);
      try {
        const handler = handlers[job.kind];
        if (!handler) throw new Error(`no handler for kind ${job.kind}`);
        await handler(run, job.payload);
        log(`job ${job.id} attempt ${job.attempt}: done`);
      } catch (error) {
        if (error instanceof Parked) log(`job ${job.id} attempt ${job.attempt}: parked, the worker is free`);
        else if (error instanceof NotOurs) log(`job ${job.id} attempt ${job.attempt}: not ours any more: stopped`);
        else throw error;
      }
    }
  } finally {
    await client.end();
  }
  log("exiting");
}

main().catch((error) => {
  log(`error: ${error.message}`);
  process.exit(1);
});

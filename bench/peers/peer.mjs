// What every Node adapter of bench/peers shares: the command line, the READY/go handshake with
// run.py, the keyed workload's keys, and the RESULT line (the same protocol as peer.py):
//
//   node ADAPTER.mjs MODE DSN [--workers W] [--jobs N] [--variant V] [--keyed]
//
// migrate: install the system's schema with its own migrator, then exit. run: enqueue N jobs with
// the system's bulk API (not timed), print READY, wait for "go" on stdin, start the consumers, and
// on SIGTERM stop them gracefully and print RESULT {"handled": ..., "intervals": {key: [[s, e]]}}.
// The packages come from bench/peers/.work/node (run.py passes the folder in PEERS_NODE_MODULES).

import { createRequire } from 'node:module'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'

export const KEYS = 16
export const SLEEP_MS = 2

export function args () {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      workers: { type: 'string', default: '4' },
      jobs: { type: 'string', default: '0' },
      variant: { type: 'string', default: 'default' },
      keyed: { type: 'boolean', default: false }
    }
  })
  const [mode, dsn] = positionals
  if (!['migrate', 'run'].includes(mode) || !dsn) throw new Error('usage: ADAPTER.mjs migrate|run DSN [options]')
  return { mode, dsn, workers: Number(values.workers), jobs: Number(values.jobs), variant: values.variant, keyed: values.keyed }
}

export const keyOf = (i) => `key-${i % KEYS}`

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export const now = () => performance.now() / 1000

// Import an installed peer package from the scratch folder run.py installed it into.
export async function peerImport (name) {
  const require = createRequire(join(process.env.PEERS_NODE_MODULES, 'resolve.js'))
  return import(pathToFileURL(require.resolve(name)).href)
}

export async function readyThenGo () {
  process.stdout.write('READY\n')
  const lines = createInterface({ input: process.stdin })
  for await (const line of lines) {
    if (line.trim() === 'go') {
      lines.close()
      return
    }
  }
  throw new Error('run.py closed stdin before saying go')
}

// Resolves on the first SIGTERM (run.py's "stop").
export const terminated = () => new Promise((resolve) => process.once('SIGTERM', resolve))

export class Recorder {
  constructor () {
    this.handled = 0
    this.intervals = {}
  }

  count (n = 1) {
    this.handled += n
  }

  add (key, start, end) {
    (this.intervals[key] ??= []).push([start, end])
    this.handled += 1
  }

  // Resolves once the line is written: process.exit() right after a write to a pipe would cut it
  // off at the pipe's 64 KiB (a keyed run's intervals are more).
  report () {
    const line = 'RESULT ' + JSON.stringify({ handled: this.handled, intervals: this.intervals }) + '\n'
    return new Promise((resolve) => process.stdout.write(line, resolve))
  }
}

#!/usr/bin/env bash
# Enqueue a job and wait for its result in bash + psql only: LISTEN pgq_finished, read pgq.job_result.
#
#   DATABASE_URL=postgresql://... QUEUE=reports KIND=build PAYLOAD='{"month": "2026-11"}' \
#       ./examples/psql_wait_result.sh [--timeout SECONDS]
#   DATABASE_URL=postgresql://... ./examples/psql_wait_result.sh --job ID [--timeout SECONDS]
#
# The first form enqueues a job (pgq.enqueue(..., notify_finished => true)) and waits for it; the
# second waits for a job enqueued earlier with notify_finished => true (by any client).
#
# Environment:
#   PGQ_DSN or DATABASE_URL  where pgq is installed (when both are unset, psql's PG* variables apply)
#   QUEUE                    the queue to enqueue into (default: default)
#   KIND                     the job's kind (default: demo)
#   PAYLOAD                  the job's payload, a JSON object (default: {})
#   TICK                     seconds between the round trips that fetch notifications (default: 0.2)
#
# Prints the outcome as one line of JSON on stdout, the same line node_wait_result.mjs prints:
#   {"id" : 42, "state" : "done", "result" : {...}, "last_error" : null, "finished_at" : "..."}
# Exit status, as pgq-thin wait's: 0 done; 1 failed or cancelled, or an error (SQL or connection:
# said on stderr, nothing on stdout); 3 not ended within --timeout (stderr names the job and its
# state then); 2 bad usage. Without --timeout it waits as long as it takes.
#
# How it works. A job enqueued with notify_finished => true makes the transaction that ends it (done,
# failed or cancelled) run pg_notify('pgq_finished', '<job id>'); other jobs notify nothing, so the
# channel costs nothing to jobs nobody waits for. The channel carries every such job's id: a waiter
# keeps only its own. A notification reaches the sessions listening when the ending transaction
# commits, so the order is: LISTEN, then enqueue, then one read of pgq.job_result anyway (with --job
# the job may have ended before the LISTEN), then wait for the id, then read the result.
#
# pgq.job_result answers the login that enqueued the job, pgq_admin, and roles whose read grants
# admit its queue; anyone else gets SQLSTATE P0002, as for an unknown id.
#
# psql prints a notification only after its next command, so one psql session runs as a coprocess
# (LISTEN is per session) and is sent an empty round trip (SELECT WHERE false: no table is read)
# every TICK seconds; the job's row is read only after its notification arrived. A client library
# that hands notifications over as they arrive (node_wait_result.mjs) needs no tick.

set -uo pipefail

DSN=${PGQ_DSN:-${DATABASE_URL:-}}
QUEUE=${QUEUE:-default}
KIND=${KIND:-demo}
PAYLOAD=${PAYLOAD:-'{}'}
TICK=${TICK:-0.2}

usage() { echo "psql_wait_result: $*" >&2; exit 2; }

JOB=""
TIMEOUT=""
while (($#)); do
    case $1 in
        --job) JOB=${2-}; shift 2 || usage "--job needs a job id" ;;
        --timeout) TIMEOUT=${2-}; shift 2 || usage "--timeout needs a number of seconds" ;;
        -h|--help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) usage "unknown argument: $1 (try --help)" ;;
    esac
done
# The id is compared with the notification's payload as text: digits only, no leading zero.
if [[ -n $JOB && ! $JOB =~ ^[1-9][0-9]*$ ]]; then usage "--job takes a job id (a positive integer), not '$JOB'"; fi
if [[ -n $TIMEOUT && ! $TIMEOUT =~ ^[0-9]+(\.[0-9]+)?$ ]]; then usage "--timeout takes seconds, not '$TIMEOUT'"; fi
if [[ ! $TICK =~ ^[0-9]*\.?[0-9]+$ ]]; then usage "TICK takes seconds, not '$TICK'"; fi

log() { echo "psql_wait_result: $*" >&2; }

now_us() { echo "${EPOCHREALTIME/./}"; }  # bash 5: microseconds since the epoch
deadline=""
if [[ -n $TIMEOUT ]]; then
    deadline=$(( $(now_us) + $(awk -v t="$TIMEOUT" 'BEGIN { printf "%d", t * 1000000 }') ))
fi

# One psql session for the whole wait. Values reach SQL as psql variables quoted by psql (:'name'),
# never pasted into the SQL text; the job id is kept in the variable id.
args=(-X -At -q -F $'\x1f' -v ON_ERROR_STOP=1 -v queue="$QUEUE" -v kind="$KIND" -v payload="$PAYLOAD")
if [[ -n $DSN ]]; then args+=(-d "$DSN"); fi
if [[ -n $JOB ]]; then args+=(-v id="$JOB"); fi
coproc PSQL { exec psql "${args[@]}" 2>&1; }
exec {TO_PSQL}>&"${PSQL[1]}" {FROM_PSQL}<&"${PSQL[0]}"
# psql stops at its first error (ON_ERROR_STOP) and may be gone before the rest of what was sent
# is written: a write to it then fails (EPIPE) instead of killing the script with SIGPIPE, and the
# read that follows reports psql's message. At exit psql is told to quit.
trap '' PIPE
trap 'echo "\\q" >&"$TO_PSQL" 2>/dev/null; exec {TO_PSQL}>&-' EXIT

# Sends the SQL on stdin followed by a marker, and collects psql's output up to the marker into
# the array OUT. A notification for our job seen on the way sets NOTIFIED. psql stops at the first
# error (ON_ERROR_STOP): its message is logged and the script exits 1.
NOTIFIED=false
send() {
    local line
    OUT=()
    { cat; printf '\\echo __pgq_end__\n'; } >&"$TO_PSQL" 2>/dev/null
    while IFS= read -r line <&"$FROM_PSQL"; do
        case $line in
            __pgq_end__) return 0 ;;
            "Asynchronous notification \"pgq_finished\" with payload \"$JOB\" received"*) NOTIFIED=true ;;
            "Asynchronous notification "*) ;;  # another job's end, or another channel
            *) OUT+=("$line") ;;
        esac
    done
    log "psql stopped: ${OUT[*]:-(no output)}"
    exit 1
}

send <<'SQL'
LISTEN pgq_finished;
SQL

if [[ -z $JOB ]]; then
    send <<'SQL'
SELECT pgq.enqueue(queue => :'queue', kind => :'kind', payload => :'payload'::jsonb,
                   notify_finished => true) AS id \gset
\echo :id
SQL
    JOB=${OUT[0]}
    log "enqueued job $JOB (queue $QUEUE, kind $KIND)"
fi

# Reads the job's result: STATE and the JSON line RESULT.
read_result() {
    send <<'SQL'
SELECT r.state, json_build_object('id', :'id'::bigint, 'state', r.state, 'result', r.result,
                                  'last_error', r.last_error, 'finished_at', r.finished_at)
FROM pgq.job_result(:'id'::bigint) AS r;
SQL
    IFS=$'\x1f' read -r STATE RESULT <<< "${OUT[0]}"
}

finish() {
    echo "$RESULT"
    case $STATE in
        done) exit 0 ;;
        *) log "job $JOB ended $STATE"; exit 1 ;;
    esac
}

read_result
while :; do
    case $STATE in done|failed|cancelled) finish ;; esac
    log "job $JOB is $STATE; waiting for its notification"
    until $NOTIFIED; do
        if [[ -n $deadline ]] && (( $(now_us) >= deadline )); then
            read_result  # the last word: it may have ended since the last tick
            case $STATE in done|failed|cancelled) finish ;; esac
            log "timed out after ${TIMEOUT} s: job $JOB is still $STATE"
            exit 3
        fi
        sleep "$TICK"
        send <<'SQL'
SELECT WHERE false;
SQL
    done
    NOTIFIED=false
    read_result
done

#!/usr/bin/env bash
# A pgq worker in bash + psql only: the SQL API is all a worker needs.
#
# A job must finish within its lease (LEASE, or the queue's lease): this worker does not renew
# leases, so a job still running when its lease ends is claimed again by another worker and runs
# twice (this one's late write is then refused). Set LEASE longer than your longest job, or call
# pgq.renew(id, attempt) every third of the lease while a job runs (pgq_thin's workers do).
#
#   DATABASE_URL=postgresql://... QUEUE=emails ./examples/psql_worker.sh [--drain]
#
# Environment:
#   PGQ_DSN or DATABASE_URL  where pgq is installed (libpq URL or key=value string; when both are
#                            unset, psql's own PG* variables and defaults apply)
#   QUEUE                    the queue to work on (default: default)
#   WORKER                   this worker's name, recorded as claimed_by (default: psql-HOST-PID)
#   BATCH                    jobs claimed per pgq.claim call, 1 to 1000 (default: 10)
#   LEASE                    lease per claim, e.g. '2 minutes' (default: the queue's lease)
#   RETRY_IN                 delay before a failed job is retried (default: the queue's backoff)
#   POLL_INTERVAL            seconds to sleep after an empty claim (default: 1)
#
# --drain: exit (status 0) as soon as a claim returns nothing, instead of polling. Tests use it.
#
# The demo handler: a job whose payload has "fail": true fails (pgq.fail), one with "sleep": N
# takes N seconds first, anything else completes (pgq.complete). Put your own work in handle_job.
#
# Every value reaches SQL as a psql variable quoted by psql itself (:'name'), never pasted into
# the SQL text, and every write quotes the attempt the claim returned: if the job was recovered
# and claimed again meanwhile (our lease expired), pgq answers "not yours" and nothing changes.
#
# One psql process per call keeps this short and obvious; it costs a connection per call, so a
# busy worker wants a long-lived client (see node_worker.mjs). SIGTERM or SIGINT: the job at hand
# is finished, the rest of the batch is given back with pgq.release, and the worker exits.

set -uo pipefail

DSN=${PGQ_DSN:-${DATABASE_URL:-}}
QUEUE=${QUEUE:-default}
WORKER=${WORKER:-psql-${HOSTNAME:-$(uname -n)}-$$}
BATCH=${BATCH:-10}
LEASE=${LEASE:-}
RETRY_IN=${RETRY_IN:-}
POLL_INTERVAL=${POLL_INTERVAL:-1}

DRAIN=false
for arg in "$@"; do
    case $arg in
        --drain) DRAIN=true ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "psql_worker: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

log() { echo "psql_worker[$WORKER]: $*" >&2; }

# Runs the SQL on stdin with the given psql variables; prints unaligned rows, one per line, fields
# separated by the ASCII unit separator (0x1f). psql interpolates :'var' only in SQL it reads from
# stdin or a file, not in -c strings.
SEP=$'\x1f'
sql() {
    local args=(-X -At -q -F "$SEP" -v ON_ERROR_STOP=1)
    if [[ -n $DSN ]]; then args+=(-d "$DSN"); fi
    psql "${args[@]}" "$@"
}

stopping=false
trap 'stopping=true; log "stopping: finishing the job at hand, releasing the rest"' TERM INT

# The work. Returns 0 to complete the job; otherwise prints the reason for pgq.fail on stdout.
# bash cannot parse JSON, so the claim query hands over the fields this handler reads.
handle_job() {
    local id=$1 kind=$2 fail=$3 pause=$4 payload=$5
    if [[ $pause =~ ^[0-9]+(\.[0-9]+)?$ ]]; then  # not a negative or an exponent
        sleep "$pause"
    fi
    if [[ $fail == t ]]; then
        printf 'demo handler: job %s (%s) asked to fail: %s' "$id" "$kind" "$payload"
        return 1
    fi
    return 0
}

complete_job() {  # id attempt -> t | f
    sql -v id="$1" -v attempt="$2" <<'SQL'
SELECT pgq.complete(:'id'::bigint, :'attempt'::integer);
SQL
}

fail_job() {  # id attempt error -> the new state, or empty when not ours
    sql -v id="$1" -v attempt="$2" -v error="$3" -v retry_in="$RETRY_IN" <<'SQL'
SELECT pgq.fail(:'id'::bigint, :'attempt'::integer, :'error',
                retry_in => nullif(:'retry_in', '')::interval);
SQL
}

release_job() {  # id attempt -> t | f
    sql -v id="$1" -v attempt="$2" <<'SQL'
SELECT pgq.release(:'id'::bigint, :'attempt'::integer);
SQL
}

# One line per job: id, attempt, kind, fail (true/false), sleep (a number or empty), payload.
# Each field is free of newlines and of the separator: names are restricted, the two derived
# fields are computed here, and jsonb's text form escapes every control character.
claim_batch() {
    sql -v worker="$WORKER" -v queue="$QUEUE" -v batch="$BATCH" -v lease="$LEASE" <<'SQL'
SELECT c.id, c.attempt, c.kind,
       coalesce(c.payload -> 'fail' = 'true', false),
       CASE WHEN jsonb_typeof(c.payload -> 'sleep') = 'number' THEN c.payload ->> 'sleep' END,
       c.payload
FROM pgq.claim(:'worker', ARRAY[:'queue'], :'batch'::integer,
               nullif(:'lease', '')::interval) AS c;
SQL
}

log "working on queue $QUEUE (batch $BATCH$($DRAIN && echo ', drain mode'))"
handled=0
while ! $stopping; do
    if ! rows=$(claim_batch); then
        if $DRAIN; then
            log "claim failed; giving up"
            exit 1
        fi
        log "claim failed; retrying in ${POLL_INTERVAL}s"
        sleep "$POLL_INTERVAL"
        continue
    fi
    if [[ -z $rows ]]; then
        if $DRAIN; then
            break
        fi
        sleep "$POLL_INTERVAL" & wait $!
        continue
    fi

    while IFS=$SEP read -r id attempt kind fail pause payload; do
        if $stopping; then
            answer=$(release_job "$id" "$attempt") || answer=error
            case $answer in
                t) log "job $id attempt $attempt: released unstarted, pending again" ;;
                f) log "job $id attempt $attempt: not ours any more, nothing to release" ;;
                *) log "job $id attempt $attempt: the release did not reach the server; the lease will recover the job" ;;
            esac
            continue
        fi
        if error=$(handle_job "$id" "$kind" "$fail" "$pause" "$payload"); then
            answer=$(complete_job "$id" "$attempt") || answer=error
            case $answer in
                t) log "job $id attempt $attempt: done" ;;
                f) log "job $id attempt $attempt: not ours any more, completion rejected" ;;
                *) log "job $id attempt $attempt: the completion did not reach the server; the lease will recover the job" ;;
            esac
        else
            answer=$(fail_job "$id" "$attempt" "$error") || answer=error
            case $answer in
                '') log "job $id attempt $attempt: not ours any more, failure rejected" ;;
                error) log "job $id attempt $attempt: the failure did not reach the server; the lease will recover the job" ;;
                pending) log "job $id attempt $attempt: failed; it will be retried after its backoff" ;;
                *) log "job $id attempt $attempt: failed for good (no attempts left)" ;;
            esac
        fi
        handled=$((handled + 1))
    done <<< "$rows"
done
log "exiting after $handled jobs"
exit 0

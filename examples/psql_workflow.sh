#!/usr/bin/env bash
# A durable workflow in bash + psql only (issue 39): steps that run once whatever crashes, a durable
# sleep, a wait for a human's approval and children awaited, none of which holds the worker.
#
#   DATABASE_URL=postgresql://... ./examples/psql_workflow.sh [--drain]
#   psql -c "SELECT pgq.enqueue('orders', 'fulfil_order', '{\"order\": 7}')"
#   psql -c "SELECT pgq.signal('orders', 'approved:7', '{\"by\": \"ann\"}')"    # the approval
#
# Environment:
#   PGQ_DSN or DATABASE_URL  where pgq is installed (as psql_worker.sh)
#   QUEUE                    the queue of the orders and of their children (default: orders)
#   WORKER                   this worker's name (default: psql-workflow-HOST-PID)
#   COOL_OFF                 the durable sleep after the reservation (default: '2 seconds')
#   APPROVAL_TIMEOUT         how long an order waits for its approval (default: '1 day')
#   POLL_INTERVAL            seconds to sleep after an empty claim (default: 1)
#
# --drain: exit (status 0) as soon as a claim returns nothing. Tests use it.
#
# The workflow of an order (kind fulfil_order, payload {"order": N}), run from the top by every
# attempt of the job, each step's body at most once (its result recorded by pgq.record_step, read
# back by pgq.get_step):
#
#   1. step "reserve": reserve the stock (here: a log line) -> {"reservation": "r-N"}
#   2. pgq.sleep "cool-off": the attempt ends until then (the job sleeps, the worker is free)
#   3. pgq.await_signal "approved:N": the attempt ends until the approval (or its timeout)
#   4. pgq.spawn "pack-1", "pack-2": two children (kind pack_item), once each
#   5. pgq.await_jobs: the attempt ends until both children have ended
#   6. step "invoice": from the children's results (pgq.job_outcomes) -> the invoice
#   7. pgq.complete with the invoice.
#
# A call that ends the attempt (sleeping, waiting) makes the handler return at once without
# completing: pgq wakes the job when it may go on, and the next claim runs it from the top. Every
# call quotes the attempt the claim returned: a stale attempt is answered "not yours" and the
# handler stops. Each step's body logs "step <name> ran": a test counts them.

set -uo pipefail

DSN=${PGQ_DSN:-${DATABASE_URL:-}}
QUEUE=${QUEUE:-orders}
WORKER=${WORKER:-psql-workflow-${HOSTNAME:-$(uname -n)}-$$}
COOL_OFF=${COOL_OFF:-2 seconds}
APPROVAL_TIMEOUT=${APPROVAL_TIMEOUT:-1 day}
POLL_INTERVAL=${POLL_INTERVAL:-1}

DRAIN=false
for arg in "$@"; do
    case $arg in
        --drain) DRAIN=true ;;
        -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "psql_workflow: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

log() { echo "psql_workflow[$WORKER]: $*" >&2; }

# Runs the SQL on stdin with the given psql variables (quoted by psql: :'name'); prints unaligned
# rows, fields separated by the ASCII unit separator.
SEP=$'\x1f'
sql() {
    local args=(-X -At -q -F "$SEP" -v ON_ERROR_STOP=1)
    if [[ -n $DSN ]]; then args+=(-d "$DSN"); fi
    psql "${args[@]}" "$@"
}

# get_step ID ATTEMPT NAME -> "t<SEP>result", "f<SEP>", or nothing (not ours)
get_step() {
    sql -v id="$1" -v attempt="$2" -v name="$3" <<'SQL'
SELECT found, result FROM pgq.get_step(:'id'::bigint, :'attempt'::integer, :'name');
SQL
}

# record_step ID ATTEMPT NAME RESULT -> t | f (not ours)
record_step() {
    sql -v id="$1" -v attempt="$2" -v name="$3" -v result="$4" <<'SQL'
SELECT pgq.record_step(:'id'::bigint, :'attempt'::integer, :'name', :'result'::jsonb);
SQL
}

# step ID ATTEMPT NAME COMMAND...: prints the step's recorded result; runs COMMAND (which prints the
# result as JSON) only while the step has none, and records what it printed. Status 1: not ours.
step() {
    local id=$1 attempt=$2 name=$3 row found result
    shift 3
    row=$(get_step "$id" "$attempt" "$name") || return 1
    [[ -n $row ]] || return 1
    IFS=$SEP read -r found result <<< "$row"
    if [[ $found == t ]]; then
        printf '%s' "$result"
        return 0
    fi
    result=$("$@") || return 1
    log "job $id: step $name ran"
    [[ $(record_step "$id" "$attempt" "$name" "$result") == t ]] || return 1
    printf '%s' "$result"
}

reserve() { printf '{"reservation": "r-%s"}' "$1"; }

# The order job: returns 0 having completed it, 3 having ended its attempt (it waits, or sleeps),
# 1 when the attempt is not ours any more.
fulfil_order() {
    local id=$1 attempt=$2 order=$3 row status rest answer kids
    step "$id" "$attempt" reserve reserve "$order" > /dev/null || return 1

    row=$(sql -v id="$id" -v attempt="$attempt" -v delay="$COOL_OFF" <<'SQL'
SELECT status FROM pgq.sleep(:'id'::bigint, :'attempt'::integer, 'cool-off', :'delay'::interval);
SQL
) || return 1
    case $row in
        sleeping) log "job $id: sleeping (cool-off)"; return 3 ;;
        awake) ;;
        *) return 1 ;;
    esac

    row=$(sql -v id="$id" -v attempt="$attempt" -v name="approved:$order" -v timeout="$APPROVAL_TIMEOUT" <<'SQL'
SELECT status, payload FROM pgq.await_signal(:'id'::bigint, :'attempt'::integer, :'name', :'timeout'::interval);
SQL
) || return 1
    IFS=$SEP read -r status rest <<< "$row"
    case $status in
        waiting) log "job $id: waiting for approved:$order"; return 3 ;;
        timed_out) log "job $id: no approval in time"
                   answer=$(sql -v id="$id" -v attempt="$attempt" <<'SQL'
SELECT pgq.fail(:'id'::bigint, :'attempt'::integer, 'not approved in time', retryable => false);
SQL
) || return 1
                   [[ -n $answer ]] || return 1
                   return 0 ;;
        arrived) ;;
        *) return 1 ;;
    esac

    # The children, once each (a spawn is a step), then the wait for them.
    kids=$(sql -v id="$id" -v attempt="$attempt" -v queue="$QUEUE" -v order="$order" <<'SQL'
SELECT string_agg(pgq.spawn(:'id'::bigint, :'attempt'::integer, 'pack-' || n, :'queue', 'pack_item',
                            jsonb_build_object('order', :'order'::integer, 'item', n))::text, ',' ORDER BY n)
FROM generate_series(1, 2) AS n;
SQL
) || return 1
    [[ $kids =~ ^[0-9]+,[0-9]+$ ]] || return 1
    row=$(sql -v id="$id" -v attempt="$attempt" -v kids="{$kids}" <<'SQL'
SELECT pgq.await_jobs(:'id'::bigint, :'attempt'::integer, :'kids'::bigint[]);
SQL
) || return 1
    case $row in
        waiting) log "job $id: waiting for its children $kids"; return 3 ;;
        ended) ;;
        *) return 1 ;;
    esac

    invoice() {  # the children's results, and the approval's payload: the invoice
        sql -v id="$id" -v attempt="$attempt" -v kids="{$kids}" -v order="$order" <<'SQL'
SELECT jsonb_build_object('order', :'order'::integer,
                          'approved_by', (SELECT result -> 'payload' ->> 'by' FROM pgq.get_step(:'id'::bigint, :'attempt'::integer, 'signal:approved:' || :'order')),
                          'packed', jsonb_agg(o.result ORDER BY o.job_id))
FROM pgq.job_outcomes(:'id'::bigint, :'attempt'::integer, :'kids'::bigint[]) AS o;
SQL
    }
    row=$(step "$id" "$attempt" invoice invoice) || return 1
    answer=$(sql -v id="$id" -v attempt="$attempt" -v result="$row" <<'SQL'
SELECT pgq.complete(:'id'::bigint, :'attempt'::integer, :'result'::jsonb);
SQL
) || return 1
    [[ $answer == t ]] || return 1
    return 0
}

# A child: packs its item (its result).
pack_item() {
    local id=$1 attempt=$2 item=$3 answer
    answer=$(sql -v id="$id" -v attempt="$attempt" -v item="$item" <<'SQL'
SELECT pgq.complete(:'id'::bigint, :'attempt'::integer, jsonb_build_object('item', :'item'::integer, 'packed', true));
SQL
) || return 1
    [[ $answer == t ]]
}

log "working on queue $QUEUE$($DRAIN && echo ' (drain mode)')"
while true; do
    row=$(sql -v worker="$WORKER" -v queue="$QUEUE" <<'SQL'
SELECT c.id, c.attempt, c.kind, coalesce(c.payload ->> 'order', ''), coalesce(c.payload ->> 'item', '')
FROM pgq.claim(:'worker', ARRAY[:'queue'], 1) AS c;
SQL
) || { log "claim failed"; $DRAIN && exit 1; sleep "$POLL_INTERVAL"; continue; }
    if [[ -z $row ]]; then
        $DRAIN && break
        sleep "$POLL_INTERVAL"
        continue
    fi
    IFS=$SEP read -r id attempt kind order item <<< "$row"
    case $kind in
        fulfil_order) fulfil_order "$id" "$attempt" "$order"; outcome=$? ;;
        pack_item) pack_item "$id" "$attempt" "$item"; outcome=$? ;;
        *) outcome=1; log "job $id: no handler for kind $kind" ;;
    esac
    case $outcome in
        0) log "job $id attempt $attempt: done" ;;
        3) log "job $id attempt $attempt: parked, the worker is free" ;;
        *) log "job $id attempt $attempt: not ours any more (or a call failed): stopped" ;;
    esac
done
log "exiting"
exit 0

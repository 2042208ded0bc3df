-- sql/functions/claim.sql: pgq.claim and its steps.

-- THE CLAIM. One statement picks up to `batch` due pending jobs of the worker's (unpaused)
-- queues in the total order priority DESC, run_at, id and locks them FOR NO KEY UPDATE SKIP LOCKED
-- (rows other claimers hold are skipped, not waited for; a foreign-key KEY SHARE lock does not
-- hide a job); the next marks them running under a lease measured by the database clock, and
-- increments the attempt, the fencing token every later write must quote. Rows that changed after
-- the statement's snapshot are re-checked by PostgreSQL when locked, so a cancelled or already
-- claimed job is never returned; a batch may hold fewer rows than asked.
-- Expired leases are recovered first (a cheap index probe decides whether there are any), so a
-- crashed worker's job is claimable again as soon as its lease ends, with or without a sweep. The
-- probe reads jobs_lease_idx from the lease floor up (pgq._raise_lease_floor): the leases below it
-- ended before claims that found none passed, so the dead entries a held snapshot keeps there (every
-- finished job's) are not read again by every claim.
-- Due schedules of the claimed queues fire next: the queue rows read anyway say whether one is
-- due (queues.next_schedule_at), so their jobs are claimable by this very claim.
-- An attempt's lease never passes its deadline (claimed_at + max_run_time).
-- A worker that names its `kinds` gets only jobs of those kinds (NULL: any kind), read per kind
-- from jobs_kind_ready_idx, so jobs of kinds it cannot run wait untouched for a worker that can.
-- Which queues: the named ones; with queues => NULL, the queues that have a pending job (a skip
-- scan of jobs_ready_idx: one index probe per such queue, so queues without jobs cost nothing,
-- however many exist) or a due schedule (queues_schedule_due_idx), unpaused.
-- Three queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- a fair queue's candidates come from pgq._fair_pick, and a key-limited queue's (key_max_running
-- or pgq.set_key_limit) from pgq._keyed_pick, at most each key's free slots: it holds each key it
-- takes (the key's own rows, pgq.key_locks), not the queue, so claims of different keys run side by
-- side; a rate-limited queue's tokens come from the slices of its rate the claim locks after its
-- picks, as few as hold what they need (pgq._take_tokens), so its claimers spend side by side too.
-- Queues with none of them pay nothing for them.
-- A queue with paused kinds (pgq.pause(queue, kind => ...): queues.paused_kinds) is claimed per kind
-- through jobs_kind_ready_idx, as if the worker had named its kinds less the paused ones (those it
-- named, or else the queue's first 1000 pending kinds in name order, found by a skip scan:
-- pgq._claim_kinds), so a run of paused jobs at the head of the queue is never read, only skipped
-- (pgq._kinds_pick; a fair or key-limited queue's pick gets those kinds). A queue without paused
-- kinds, or whose paused kinds the worker does not claim, is claimed as before: whether any queue
-- of the claim has paused kinds is read with whether one has a schedule due (one aggregate).
-- A plain or capped queue with max_wait (pgq.configure_queue) serves its aged jobs first: those due
-- for longer than max_wait, lowest priority then oldest first, ahead of any job of higher priority
-- (pgq._aged_pick, by a skip scan over the priority levels of jobs_ready_idx, no index of its own),
-- then the usual pick fills its room (pgq._aged_rooms); they are handed out (and returned) first. A queue without it pays nothing: whether one of the claim has it
-- is read with the due schedules and the paused kinds (the same aggregate).
-- A claim never waits for another session's lock: a capped queue's row (a fair queue's tenant
-- row, a key's rows, a rate's slice) that another transaction holds is skipped for this call
-- (SKIP LOCKED), so an idle transaction that claimed from a limited queue holds up no other
-- worker's claims of anything else, and of a limited queue only the keys it took and the tokens
-- it spent (and the rest of the slices it took them from).
-- Before any job is handed out, the failover fence: the claim's first read (of the queues) also
-- compares the fence row's timeline with this server's; when they differ (a promotion), the fences
-- are moved first (pgq._check_timeline). No session state is trusted for it: a setting would be
-- one any caller could forge.
--
-- pgq.claim, first below, reads as those steps: the arguments (pgq._check_claim,
-- called only when one is wrong), which queues and their rooms (pgq._claim_queues: one
-- pgq.claim_room per queue, the row every step passes on), the capped queues' locks and free slots
-- (pgq._claim_rooms), the due schedules (pgq._fire_schedules), the fair and key-limited picks
-- (pgq._fair_pick, pgq._keyed_pick), the rate limits' tokens for the picks (pgq._take_tokens),
-- the plain and capped queues with max_wait (pgq._aged_rooms, pgq._aged_pick), the plain queues
-- with paused kinds, per kind (pgq._kinds_rooms, pgq._kinds_pick),
-- then the pick and the lease (pgq._lease_jobs), and the tokens spent (pgq._spend_tokens). The
-- helpers run inside the claim (as its owner, with its settings: no SET clause of their own) and
-- no role may call them.

CREATE OR REPLACE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                          lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
    RETURNS SETOF pgq.claimed_job
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    -- A generic plan's cost can pass jit_above_cost on stale statistics (after a plain VACUUM,
    -- say), and compiling it then costs ~25 ms per claim: never worth it for a handful of rows.
    SET jit = off
    AS $$
DECLARE
    rooms    pgq.claim_room[];  -- the eligible queues, in name order, with how many jobs each may start
    fair_ids bigint[] := '{}';
    aged_ids bigint[];   -- then: the jobs that waited longer than their queue's max_wait, served first
    leased   integer;    -- then: how many of them were handed out
    keyed_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running, key limits or rate limits
    fair     boolean;    -- whether any of them is fair
    keyed    boolean;    -- whether any of them takes the per-key step (key limits or rate limits)
    rated    boolean;    -- whether any of them has a rate limit (its own or its keys')
    rate_now timestamptz;  -- then: the rate limits' clock, read before the keyed picks
    slices   pgq.rate_slices[];  -- then: the rate-limited queues' slices it holds
    spend_at timestamptz;  -- then: the rate clock the tokens are spent at
    expired  boolean;    -- whether any lease has expired (since the lease floor)
    floor_at timestamptz := pgq._lease_floor();  -- the lease floor (recovery.sql), read once
    due      boolean;    -- whether one of them has a schedule due or paused kinds (the rare steps)
    fenced   boolean;    -- whether the failover fence was moved on this server's timeline
    due_queues text[];   -- then: the eligible queues, whose due schedules fire
    look     boolean := false;  -- whether this claim raised the lease floor: its pick counts what it reads
BEGIN
    IF NOT coalesce(length(claim.worker) BETWEEN 1 AND 256 AND claim.batch BETWEEN 1 AND 1000
                    AND (claim.queues IS NULL OR pgq._are_names(claim.queues))
                    AND (claim.kinds IS NULL OR cardinality(claim.kinds) <= 1000 AND pgq._are_names(claim.kinds)),
                    false) OR claim.lease IS NOT NULL THEN
        PERFORM pgq._check_claim(claim.worker, claim.queues, claim.batch, claim.lease, claim.kinds);
    END IF;

    -- Expired leases are recovered first, so their jobs are claimable by this very claim (with
    -- queues => NULL, the queues of recovered jobs are candidates only once recovered: read again).
    -- The first read also says whether the failover fence was moved on this server's timeline:
    -- when not, it is now (pgq._check_timeline), before any attempt number is handed out.
    FOR pass IN 1..2 LOOP
        SELECT e.* INTO rooms, capped, fair, keyed, rated, expired, due, fenced
        FROM pgq._claim_queues(claim.queues, claim.batch, floor_at) AS e;
        IF NOT fenced THEN
            PERFORM pgq._check_timeline();
        END IF;
        EXIT WHEN pass = 2 OR NOT expired;
        PERFORM pgq._recover_expired(100, least(floor_at, pgq._now()));  -- from where the probe read
        EXIT WHEN claim.queues IS NOT NULL;
    END LOOP;
    -- No lease passed between the floor and this claim's clock: that clock is the new floor, once
    -- the floor is a second old (or ahead of the clock). Only from a snapshot taken after that clock
    -- (READ COMMITTED: each statement's own); an older one (REPEATABLE READ) may not see leases
    -- committed since.
    IF NOT expired AND NOT floor_at <@ tstzrange(pgq._now() - interval '1 second', pgq._now(), '(]')
       AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._raise_lease_floor();
        look := true;  -- (once a second: the claim floors' look, in pgq._lease_jobs)
    END IF;
    IF rooms IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := ARRAY(SELECT r.queue FROM unnest(rooms) AS r);  -- before the capped queues' rooms narrow them
    END IF;
    IF capped THEN
        rooms := pgq._claim_rooms(rooms, claim.batch);
    END IF;

    -- Then the due schedules of these queues fire (at most 10 per claim; a sweep fires the rest),
    -- after the capped queues are locked: the firing only ever skips locked queue rows, so a
    -- claim waits for queue locks in name order alone. Under REPEATABLE READ a claim leaves them
    -- to READ COMMITTED claims and sweeps: its snapshot could make a concurrent firing a
    -- serialization failure of the claim.
    IF due AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._fire_schedules(10, due_queues);
    END IF;

    -- (A fair or key-limited queue with paused kinds: its pick gets the kinds it may claim.)
    IF fair THEN
        fair_ids := ARRAY(SELECT f.id FROM unnest(rooms) AS r
                          CROSS JOIN LATERAL pgq._fair_pick(r.queue, r.room, CASE WHEN due THEN pgq._claim_kinds(r.queue, claim.kinds)
                                                                                  ELSE claim.kinds END) AS f(id)
                          WHERE r.fair AND NOT r.keyed);
    END IF;
    IF keyed THEN
        IF rated THEN
            rate_now := pgq._rate_clock();
        END IF;
        keyed_ids := ARRAY(SELECT f.id FROM unnest(rooms) AS r
                           CROSS JOIN LATERAL pgq._keyed_pick(r.queue, r.room,
                                                              CASE WHEN due THEN pgq._claim_kinds(r.queue, claim.kinds)
                                                                   ELSE claim.kinds END,
                                                              r.fair, rate_now) AS f(id)
                           WHERE r.keyed);
    END IF;

    -- The rate-limited queues' tokens for their picks, held (their slices locked) before the jobs
    -- are handed out, and the rate clock they are spent at, read once every lock is held (the
    -- slices', the keys', the picks'); picks beyond the tokens are left out.
    IF rated AND keyed_ids <> '{}' THEN
        SELECT t.ids, t.slices, t.at INTO keyed_ids, slices, spend_at FROM pgq._take_tokens(keyed_ids, rooms) AS t;
    END IF;

    -- The plain queues with paused kinds: their jobs picked per kind (pgq._kinds_rooms), handed on
    -- with the fair picks; their rooms leave `rooms`, which _lease_jobs reads in index order.
    -- The plain and capped queues with max_wait first: their aged jobs (`aged_ids`) and the rest of
    -- their pick (pgq._aged_rooms), the rest handed on with the fair picks. The aged jobs are
    -- handed out first, the lowest priority then the oldest first, up to the batch (and returned
    -- first); the rest of the batch as always below. A claim without them pays for none of it.
    IF due THEN
        SELECT s.plain, fair_ids || s.ids, s.aged INTO rooms, fair_ids, aged_ids FROM pgq._aged_rooms(rooms, claim.kinds) AS s;
        SELECT s.plain, fair_ids || s.ids INTO rooms, fair_ids FROM pgq._kinds_rooms(rooms, claim.kinds) AS s;
        IF aged_ids <> '{}' THEN
            aged_ids := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (aged_ids)
                              ORDER BY j.priority, j.run_at, j.id LIMIT claim.batch);
            fair_ids := ARRAY(SELECT f.id FROM unnest(fair_ids) AS f(id) WHERE f.id <> ALL (aged_ids));
            RETURN QUERY SELECT * FROM pgq._lease_jobs(claim.worker, '{}', aged_ids, claim.batch, claim.lease, NULL, false) AS l
                         ORDER BY l.priority DESC, l.run_at, l.id;
            GET DIAGNOSTICS leased = ROW_COUNT;
            claim.batch := claim.batch - leased;  -- (0: the pick below takes nothing)
        END IF;
    END IF;

    RETURN QUERY SELECT * FROM pgq._lease_jobs(claim.worker, rooms, fair_ids || keyed_ids, claim.batch, claim.lease,
                                               claim.kinds, look) AS l
                 ORDER BY l.priority DESC, l.run_at, l.id;

    -- The rate limits' tokens, spent for the jobs this claim handed out: its picks (locked by it,
    -- pending until its UPDATE) that are running now.
    IF rated AND keyed_ids <> '{}' THEN
        PERFORM pgq._spend_tokens(keyed_ids, slices, spend_at);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id (jobs of a queue with max_wait that waited longer than it first). The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

-- Completes the caller's finished attempts and claims the next jobs, in one call and one
-- transaction (one commit where a worker would pay two): pgq.complete_many(ids, attempts), then
-- pgq.claim(worker, queues, batch, lease, kinds), with their arguments, their checks (a bad
-- argument of either changes nothing) and their fences. The claim sees the completions: a key or
-- a capped queue's place that one of them held is free for it. One row per claimed job, each
-- carrying `completed` (the ids of the pairs completed, as complete_many returns them); a call
-- that claims nothing returns one row whose job columns are NULL, so that `completed` still
-- arrives. For a worker whose backlog is deep: a job's completion and the claim of the next one
-- cost one round trip.
CREATE OR REPLACE FUNCTION pgq.complete_and_claim(ids bigint[], attempts integer[], worker text,
                                                  queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                                                  lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
    RETURNS TABLE (completed bigint[], id bigint, queue text, kind text, payload jsonb, priority integer,
                   attempt integer, max_attempts integer, run_at timestamptz, created_at timestamptz,
                   lease_until timestamptz, tenant text, progress jsonb, deadline timestamptz, meta jsonb)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    done_ids bigint[];
BEGIN
    done_ids := ARRAY(SELECT d.id FROM pgq.complete_many(complete_and_claim.ids, complete_and_claim.attempts) AS d(id));
    RETURN QUERY
    SELECT done_ids, c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts, c.run_at,
           c.created_at, c.lease_until, c.tenant, c.progress, c.deadline, c.meta
    FROM pgq.claim(complete_and_claim.worker, complete_and_claim.queues, complete_and_claim.batch,
                   complete_and_claim.lease, complete_and_claim.kinds) AS c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT done_ids, NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::integer,
                            NULL::integer, NULL::integer, NULL::timestamptz, NULL::timestamptz,
                            NULL::timestamptz, NULL::text, NULL::jsonb, NULL::timestamptz, NULL::jsonb;
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.complete_and_claim(bigint[], integer[], text, text[], integer, interval, text[]) IS
    'pgq.complete_many then pgq.claim in one transaction: one row per claimed job, each with the ids '
    'completed (one row with NULL job columns when none is claimed).';

-- Whether every element of `names` is a name (pgq._is_name's rule), in one expression (no query,
-- inlined where it is used). Names cannot contain a comma, so one match of the joined names (the
-- pattern, repeated) checks them all, and so does the length (no run of 129 characters without a
-- comma; a joined list of 128 or fewer cannot hold one, and skips that match); the joined names
-- hold exactly one comma fewer than there are names (a name 'a,b' would otherwise pass as two).
-- NULL elements make it false. STABLE like array_to_string: an IMMUTABLE wrapper of a STABLE
-- function is not inlined, and its call cost each claim about 70 us (of about 220 per claim and
-- complete).
CREATE OR REPLACE FUNCTION pgq._are_names(names text[]) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT coalesce(
               array_to_string($1, ',') ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
               AND length(array_to_string($1, ',')) - length(replace(array_to_string($1, ','), ',', ''))
                   = cardinality($1) - 1
               AND (length(array_to_string($1, ',')) <= 128 OR array_to_string($1, ',') !~ '[^,]{129}'),
           false)
$$;

-- The claim's arguments, checked: 22004 / 22023 naming the one that is wrong (a malformed queue or
-- kind name can never match: said instead of claiming nothing forever). pgq.claim calls it only
-- when its one-expression test of them all fails, so a good claim pays for no call.
-- Validates a list of queues (pgq.claim's, pgq.worker_heartbeat's, pgq.queue_kinds'): NULL (all
-- queues) or a non-empty array of names without NULLs; 22023 naming the argument (queues[n] for a
-- bad name).
CREATE OR REPLACE FUNCTION pgq._check_queues(queues text[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_queues.queues IS NULL THEN
        RETURN;
    ELSIF cardinality(_check_queues.queues) = 0 OR array_position(_check_queues.queues, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('queues', 'must be NULL (all queues) or a non-empty array without NULLs');
    ELSIF NOT pgq._are_names(_check_queues.queues) THEN  -- only a bad name pays for the check that names it
        PERFORM pgq._check_name(format('queues[%s]', q.n), q.name)
        FROM unnest(_check_queues.queues) WITH ORDINALITY AS q(name, n);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgq._check_claim(worker text, queues text[], batch integer, lease interval,
                                            kinds text[])
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_claim.worker IS NULL THEN
        PERFORM pgq._bad_argument('worker', 'must not be NULL');
    ELSIF length(_check_claim.worker) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('worker', 'must be 1 to 256 characters long');
    END IF;
    IF _check_claim.batch IS NULL THEN
        PERFORM pgq._bad_argument('batch', 'must not be NULL');
    ELSIF _check_claim.batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('batch', format('must be between 1 and 1000, got %s', _check_claim.batch));
    END IF;
    IF _check_claim.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', _check_claim.lease, interval '1 day');
    END IF;
    PERFORM pgq._check_queues(_check_claim.queues);
    IF _check_claim.kinds IS NOT NULL THEN
        IF cardinality(_check_claim.kinds) NOT BETWEEN 1 AND 1000 OR array_position(_check_claim.kinds, NULL) IS NOT NULL THEN
            PERFORM pgq._bad_argument('kinds', 'must be NULL (any kind) or an array of 1 to 1000 kinds without NULLs');
        ELSIF NOT pgq._are_names(_check_claim.kinds) THEN
            PERFORM pgq._check_name(format('kinds[%s]', k.n), k.name)
            FROM unnest(_check_claim.kinds) WITH ORDINALITY AS k(name, n);
        END IF;
    END IF;
END
$$;

-- Which of the worker's queues (`queues`; NULL: all) a claim takes jobs from, in name order, as
-- its rooms (pgq.claim_room: each with `batch` as its room, whether it is fair, takes the per-key
-- step or has a rate limit), with whether any of them is capped (max_running, key limits or rate
-- limits: pgq._claim_rooms), fair, keyed or rate-limited, whether any lease has expired since
-- `lease_floor` (one index probe from there up, or from the clock when the floor is ahead of it:
-- pgq._raise_lease_floor) and whether one of them
-- has a schedule due (columns of the rows read anyway; bool_or allocates nothing, unlike array_agg).
-- With queues => NULL the candidates are the queues that have a pending job, found by a skip scan
-- of jobs_ready_idx (the next queue name after the last, one index probe each: queues without
-- jobs are never read), and those with a due schedule (queues_schedule_due_idx). rooms is NULL
-- when no queue is eligible. And whether the failover fence row (pgq.fence, one row) names this
-- server's timeline (false on a standby, whose WAL position cannot be read: pgq._check_timeline
-- then says so). `due` says too whether one of them has paused kinds (pgq.claim then reads their
-- kinds: pgq._kinds_rooms) or max_wait (pgq._aged_rooms): the rare steps share one aggregate, since each aggregate costs
-- every claim its set-up. One SELECT, so the planner inlines it into pgq.claim: no call.
CREATE OR REPLACE FUNCTION pgq._claim_queues(queues text[], batch integer, lease_floor timestamptz)
    RETURNS TABLE (rooms pgq.claim_room[], capped boolean, fair boolean, keyed boolean, rated boolean,
                   expired boolean, due boolean, fenced boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT array_agg(ROW(q.name, $2, q.fair, q.key_limited OR q.rate_limited, q.rate_limit > 0)::pgq.claim_room
                     ORDER BY q.name),
           coalesce(bool_or(q.max_running > 0 OR q.key_limited OR q.rate_limited), false),
           coalesce(bool_or(q.fair), false),
           coalesce(bool_or(q.key_limited OR q.rate_limited), false),
           coalesce(bool_or(q.rate_limited), false),
           -- The first expired lease in index order, not EXISTS (with a lower bound it cannot see,
           -- and statistics that say few jobs run, the planner read the whole range into a bitmap
           -- instead of stopping at its first entry); only running jobs have a lease.
           (SELECT j.lease_until FROM pgq.jobs AS j
            WHERE j.lease_until < pgq._now()
              AND j.lease_until >= least($3, pgq._now())
            ORDER BY j.lease_until LIMIT 1) IS NOT NULL,
           coalesce(bool_or(q.next_schedule_at <= pgq._now() OR q.paused_kinds IS NOT NULL OR q.max_wait IS NOT NULL), false),
           coalesce((SELECT f.timeline = pgq._timeline() FROM pgq.fence AS f WHERE NOT pg_is_in_recovery()), false)
    FROM pgq.queues AS q
    WHERE NOT q.paused
      AND q.name = ANY (coalesce($1, ARRAY(
              WITH RECURSIVE pending(name) AS (
                  (SELECT j.queue FROM pgq.jobs AS j
                   WHERE j.state = 'pending' AND j.attempt < j.max_attempts
                   ORDER BY j.queue LIMIT 1)
                  UNION ALL
                  SELECT (SELECT j.queue FROM pgq.jobs AS j
                          WHERE j.queue > p.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                          ORDER BY j.queue LIMIT 1)
                  FROM pending AS p WHERE p.name IS NOT NULL
              )
              SELECT p.name FROM pending AS p WHERE p.name IS NOT NULL
              UNION ALL
              SELECT u.name FROM pgq.queues AS u WHERE u.next_schedule_at <= pgq._now())))
      -- A queue with grants admits only some logins (a named one raises 42501 for the others).
      AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, $1 IS NOT NULL))
$$;

-- For a claim of capped queues (pgq._claim_queues): its rooms, each narrowed to how many jobs
-- the queue may start now; those without room are left out. A queue with max_running is locked
-- before its running jobs are counted by the last statement, whose fresh snapshot sees every
-- earlier claim; one that another transaction holds is skipped (this call claims none of its
-- jobs), never waited for. A queue with a rate limit is not locked: its slices are made ahead
-- (pgq._make_slices) and its room is at most the tokens they hold that this claim may spend, by a
-- reading before any lock (pgq._take_tokens holds them, for the picks). A queue with key limits
-- alone is not locked either (pgq._keyed_pick holds its keys). (Under REPEATABLE READ or
-- SERIALIZABLE the counts would come from an older snapshot and could pass the limits: such a
-- claim of a capped queue is refused.)
CREATE OR REPLACE FUNCTION pgq._claim_rooms(rooms pgq.claim_room[], batch integer) RETURNS pgq.claim_room[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    locked   text[];     -- the queues with max_running this call holds (the others are skipped)
    tokens   jsonb := '{}';  -- rate-limited queue -> the tokens it may spend, by that reading
    at       timestamptz;
    k        integer;    -- the tokens of a slice of its rate,
    m        integer;    -- its stripes
    n        bigint;     -- and the newest token due at `at`
    cand     pgq.rate_slices[];  -- the rows of its oldest slices with tokens
    r        record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgq: a claim of a queue with max_running, key limits or rate limits must run at READ COMMITTED, not %',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
    END IF;
    locked := ARRAY(SELECT q.name FROM pgq.queues AS q
                    WHERE q.max_running > 0 AND NOT q.paused AND q.name = ANY (ARRAY(SELECT e.queue FROM unnest(rooms) AS e))
                    FOR NO KEY UPDATE SKIP LOCKED);
    FOR r IN
        SELECT q.name, q.rate_limit, q.rate_period FROM unnest(rooms) AS e JOIN pgq.queues AS q ON q.name = e.queue
        WHERE e.rated AND q.rate_limit > 0
    LOOP
        at := pgq._rate_clock();
        PERFORM pgq._make_slices(r.name, r.rate_limit, r.rate_period, at);
        k := pgq._slice_size(r.rate_limit, r.rate_period);
        m := pgq._stripes(r.rate_limit, r.rate_period);
        n := pgq._token_number(r.rate_limit, r.rate_period, at);
        cand := pgq._window_rows(r.name, r.rate_limit, k, m, n, _claim_rooms.batch);
        tokens := tokens || jsonb_build_object(r.name, (SELECT coalesce(sum(s.tokens_left), 0)
                                                        FROM pgq._slice_tokens(cand, r.name, r.rate_limit, k, m, n) AS s
                                                        WHERE s.spendable));
    END LOOP;
    RETURN ARRAY(
        SELECT ROW(e.queue, e.room, e.fair, e.keyed, e.rated)::pgq.claim_room
        FROM (SELECT e.queue, e.fair, e.keyed, e.rated,
                     least(CASE WHEN q.max_running = 0 THEN _claim_rooms.batch
                                ELSE least(_claim_rooms.batch, q.max_running - (
                                         SELECT count(*) FROM pgq.jobs AS j
                                         WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                           END,
                           (tokens ->> e.queue)::integer) AS room
              FROM unnest(rooms) AS e
              JOIN pgq.queues AS q ON q.name = e.queue
              WHERE NOT q.paused AND (q.max_running = 0 OR q.name = ANY (locked))) AS e
        WHERE e.room > 0
        ORDER BY e.queue);
END
$$;

-- The kinds a claim of `kinds` (NULL: any) takes from `queue`: `kinds` itself when the queue has no
-- paused kind among them; else those less the paused ones, or without `kinds` the queue's first
-- 1000 pending kinds (pgq._pending_kinds: one index probe each) less the paused ones, in name order
-- (an empty array: none). Bounded whatever the data: a queue with more pending kinds than that has
-- the rest claimed once the first ones run dry. PL/pgSQL: pgq._pending_kinds comes later in the
-- source.
CREATE OR REPLACE FUNCTION pgq._claim_kinds(queue text, kinds text[]) RETURNS text[]
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    paused text[] := (SELECT q.paused_kinds FROM pgq.queues AS q WHERE q.name = _claim_kinds.queue);
BEGIN
    IF paused IS NULL OR NOT coalesce(_claim_kinds.kinds && paused, true) THEN
        RETURN _claim_kinds.kinds;
    ELSIF _claim_kinds.kinds IS NOT NULL THEN
        RETURN ARRAY(SELECT DISTINCT k.kind FROM unnest(_claim_kinds.kinds) AS k(kind)
                     WHERE k.kind <> ALL (paused) ORDER BY k.kind);
    END IF;
    RETURN ARRAY(SELECT k.kind FROM pgq._pending_kinds(_claim_kinds.queue, 1000) AS k(kind)
                 WHERE k.kind <> ALL (paused) ORDER BY k.kind);
END
$$;

-- A plain queue's jobs of `kinds` (pgq._claim_kinds) for a claim: per kind, its first `room`
-- claimable jobs in index order (jobs_kind_ready_idx), locked FOR NO KEY UPDATE SKIP LOCKED, as
-- pgq._lease_jobs picks a worker's kinds; pgq._lease_jobs takes the best of them with the rest.
CREATE OR REPLACE FUNCTION pgq._kinds_pick(queue text, room integer, kinds text[]) RETURNS SETOF bigint
    LANGUAGE sql
    AS $$
    SELECT c.id
    FROM unnest(_kinds_pick.kinds) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM pgq.jobs AS j
        WHERE j.queue = _kinds_pick.queue AND j.kind = k.kind
          AND j.state = 'pending' AND j.attempt < j.max_attempts
          AND j.run_at <= pgq._now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT _kinds_pick.room
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
$$;

-- For a claim of `kinds` one of whose queues may have paused kinds (pgq._claim_queues' due): the rooms
-- without those of plain queues that have paused kinds this claim could take (`plain`), and those
-- queues' jobs picked per kind (`ids`: pgq._kinds_pick, of pgq._claim_kinds' kinds).
CREATE OR REPLACE FUNCTION pgq._kinds_rooms(rooms pgq.claim_room[], kinds text[],
                                            OUT plain pgq.claim_room[], OUT ids bigint[])
    LANGUAGE plpgsql
    AS $$
DECLARE
    r          pgq.claim_room;
    room_kinds text[];
BEGIN
    plain := '{}';
    ids := '{}';
    FOREACH r IN ARRAY _kinds_rooms.rooms LOOP
        room_kinds := pgq._claim_kinds(r.queue, _kinds_rooms.kinds);
        IF r.fair OR r.keyed OR room_kinds IS NOT DISTINCT FROM _kinds_rooms.kinds THEN
            plain := plain || r;
        ELSE
            ids := ids || ARRAY(SELECT p.id FROM pgq._kinds_pick(r.queue, r.room, room_kinds) AS p(id));
        END IF;
    END LOOP;
END
$$;

-- A queue's aged jobs (pending, due since `since` or earlier: they waited longer than its
-- max_wait), of `kinds` (NULL: any), at most `room`, lowest priority first, then oldest first
-- (priority, run_at, id), locked FOR NO KEY UPDATE SKIP LOCKED. Lowest priority first: an aged job
-- is served before any job of higher priority, aged or not (oldest first across levels would let
-- a backlog of aged higher-priority jobs, older than it, hold it back without bound once the
-- claimers fall behind). Found without an index of their own: the first entry of each priority
-- level of jobs_ready_idx (per kind: jobs_kind_ready_idx) is the level's oldest job, so a skip scan
-- over the levels (one index probe per level present; priorities are -1000..1000: at most 2001 per
-- kind) says which levels hold aged jobs; the lowest `room` of those give up to `room` candidates
-- each, read in index order, and the first `room` candidates are locked. Bounded whatever the
-- data: at most 2001 probes per kind and room * room index entries.
CREATE OR REPLACE FUNCTION pgq._aged_pick(queue text, room integer, since timestamptz, kinds text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    cands bigint[];
BEGIN
    IF _aged_pick.kinds IS NULL THEN
        cands := ARRAY(
            WITH RECURSIVE levels(priority, run_at, id) AS (
                (SELECT j.priority, j.run_at, j.id FROM pgq.jobs AS j
                 WHERE j.queue = _aged_pick.queue AND j.state = 'pending' AND j.attempt < j.max_attempts
                 ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
                UNION ALL
                SELECT n.priority, n.run_at, n.id
                FROM levels AS l
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.id FROM pgq.jobs AS j
                    WHERE j.queue = _aged_pick.queue AND j.priority < l.priority
                      AND j.state = 'pending' AND j.attempt < j.max_attempts
                    ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) AS n
            )
            SELECT c.id
            FROM (SELECT l.priority FROM levels AS l WHERE l.run_at <= _aged_pick.since
                  ORDER BY l.priority LIMIT _aged_pick.room) AS l
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j
                WHERE j.queue = _aged_pick.queue AND j.priority = l.priority
                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= _aged_pick.since
                ORDER BY j.priority DESC, j.run_at, j.id LIMIT _aged_pick.room) AS c
            ORDER BY c.priority, c.run_at, c.id LIMIT _aged_pick.room);
    ELSE
        cands := ARRAY(
            WITH RECURSIVE levels(kind, priority, run_at, id) AS (
                SELECT k.kind, f.priority, f.run_at, f.id
                FROM (SELECT DISTINCT w.kind FROM unnest(_aged_pick.kinds) AS w(kind)) AS k
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.id FROM pgq.jobs AS j
                    WHERE j.queue = _aged_pick.queue AND j.kind = k.kind
                      AND j.state = 'pending' AND j.attempt < j.max_attempts
                    ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) AS f
                UNION ALL
                SELECT l.kind, n.priority, n.run_at, n.id
                FROM levels AS l
                CROSS JOIN LATERAL (
                    SELECT j.priority, j.run_at, j.id FROM pgq.jobs AS j
                    WHERE j.queue = _aged_pick.queue AND j.kind = l.kind AND j.priority < l.priority
                      AND j.state = 'pending' AND j.attempt < j.max_attempts
                    ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) AS n
            )
            SELECT c.id
            FROM (SELECT l.kind, l.priority FROM levels AS l WHERE l.run_at <= _aged_pick.since
                  ORDER BY l.priority, l.run_at, l.id LIMIT _aged_pick.room) AS l
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j
                WHERE j.queue = _aged_pick.queue AND j.kind = l.kind AND j.priority = l.priority
                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= _aged_pick.since
                ORDER BY j.priority DESC, j.run_at, j.id LIMIT _aged_pick.room) AS c
            ORDER BY c.priority, c.run_at, c.id LIMIT _aged_pick.room);
    END IF;
    IF cands = '{}' THEN
        RETURN;
    END IF;
    -- Locked last, by primary key: a candidate another claim took meanwhile is re-checked and left.
    RETURN QUERY
    SELECT j.id FROM pgq.jobs AS j
    WHERE j.id = ANY (cands) AND j.state = 'pending' AND j.attempt < j.max_attempts
    ORDER BY j.priority, j.run_at, j.id
    FOR NO KEY UPDATE SKIP LOCKED;
END
$$;

-- For a claim of `kinds` one of whose queues may have max_wait set (pgq._claim_queues' due): the
-- rooms without those of plain and capped queues with max_wait (`plain`), and those queues' picks
-- (`ids`): per queue first its aged jobs (pgq._aged_pick: `aged`, also in `ids`), then the best of
-- the rest (of the kinds pgq._claim_kinds says: paused ones left out) up to its room, in index order.
-- A fair, key-limited or rate-limited queue keeps its own pick (configure_queue refuses max_wait
-- on it; pgq.set_key_limit on a queue with max_wait makes its claims keyed: aging stops there).
CREATE OR REPLACE FUNCTION pgq._aged_rooms(rooms pgq.claim_room[], kinds text[],
                                           OUT plain pgq.claim_room[], OUT ids bigint[], OUT aged bigint[])
    LANGUAGE plpgsql
    AS $$
DECLARE
    r          pgq.claim_room;
    wait       interval;
    room_kinds text[];
    these      bigint[];
BEGIN
    plain := '{}';
    ids := '{}';
    aged := '{}';
    FOREACH r IN ARRAY _aged_rooms.rooms LOOP
        wait := (SELECT q.max_wait FROM pgq.queues AS q WHERE q.name = r.queue);
        IF wait IS NULL OR r.fair OR r.keyed THEN
            plain := plain || r;
            CONTINUE;
        END IF;
        room_kinds := pgq._claim_kinds(r.queue, _aged_rooms.kinds);
        these := ARRAY(SELECT a.id FROM pgq._aged_pick(r.queue, r.room, pgq._now() - wait, room_kinds) AS a(id));
        aged := aged || these;
        ids := ids || these;
        IF cardinality(these) < r.room THEN
            ids := ids || ARRAY(
                SELECT c.id FROM pgq.jobs AS c
                WHERE c.id = ANY (ARRAY(
                    SELECT j.id FROM pgq.jobs AS j
                    WHERE j.queue = r.queue AND room_kinds IS NULL
                      AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                      AND j.id <> ALL (these)
                    ORDER BY j.priority DESC, j.run_at, j.id
                    LIMIT r.room - cardinality(these)
                    FOR NO KEY UPDATE SKIP LOCKED))
                   OR c.id = ANY (ARRAY(
                    SELECT p.id FROM pgq._kinds_pick(r.queue, r.room, room_kinds) AS p(id)
                    WHERE room_kinds IS NOT NULL AND p.id <> ALL (these)))
                ORDER BY c.priority DESC, c.run_at, c.id
                LIMIT r.room - cardinality(these));
        END IF;
    END LOOP;
END
$$;

-- Whether a job has expired: its start_by has passed before its first claim, or its expires_at has
-- passed (enqueue's start_by and max_lifetime). One expression, inlined where it is used.
CREATE OR REPLACE FUNCTION pgq._expired(attempt integer, start_by timestamptz, expires_at timestamptz)
    RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce(least(CASE WHEN $1 = 0 THEN $2 END, $3) <= pgq._now(), false) $$;
-- THE CLAIM FLOORS (migration 0034: pgq.claim_floors). While a snapshot is held, vacuum removes
-- nothing: every job claimed since leaves its pending version's entry at the head of jobs_ready_idx
-- (jobs_kind_ready_idx), dead to every claim but not removable, and a pick that reads the order
-- from its start walks them all, more with every job claimed (24,750 entries a scan 4.6 minutes
-- into a held snapshot, bench/README.md). So a pick that read 5,000 entries more than it picked
-- (PostgreSQL's own count, pg_stat_get_xact_tuples_returned of the index, read around the pick:
-- once a second, by the claim that raises the lease floor, and by every claim while some process
-- has floors, pgq.claim_floors_set) records, for the process that ran it (pg_backend_pid(): its own row, which no other process reads
-- or writes, so no claim ever waits for it), the key of the last job it took from each queue (and
-- kind). For a second after, that process's picks read each such queue's priority levels above the
-- floor's from their start (a job of a higher priority is never behind a floor) and the floor's
-- level from just past its key, a range the index finds without walking. A floor read that comes
-- back short reads the whole order at once, as without floors (and ends them). After the second,
-- the next pick reads the whole order again and records new floors, or none when it read few.
-- What it costs the order: a job that becomes due below a floor at the floor's level (a producer's
-- transaction older than the jobs it passed, a run_at in the past, a released dependant) while
-- that queue holds more due jobs than its claims take is picked within that second, or when a pick
-- reads short. Without a held snapshot (or a long transaction) no pick reads that far and nothing
-- changes: pgq.claim_floors_set stays 0, and a claim pays that one sequence read for the floors.

-- The entries of the ready index a pick of `kinds` reads (jobs_kind_ready_idx when the worker names
-- its kinds, else jobs_ready_idx) that this transaction has read so far: read before a pick, with
-- pgq._walked_far after it.
CREATE OR REPLACE FUNCTION pgq._ready_entries_read(kinds text[]) RETURNS bigint
    LANGUAGE sql
    AS $$
    SELECT pg_stat_get_xact_tuples_returned(CASE WHEN $1 IS NULL THEN 'pgq.jobs_ready_idx'::regclass
                                                 ELSE 'pgq.jobs_kind_ready_idx'::regclass END)
$$;

-- Whether a pick of `kinds` that took `picked` jobs read 5,000 entries of the ready index more than
-- it took, since pgq._ready_entries_read said `seen`: the floors are recorded then.
CREATE OR REPLACE FUNCTION pgq._walked_far(seen bigint, kinds text[], picked integer) RETURNS boolean
    LANGUAGE sql
    AS $$ SELECT pgq._ready_entries_read($2) - $1 - $3 >= 5000 $$;

-- Records the calling process's floors: per queue of `rooms` (not fair, not key-limited) and kind
-- (when `kinds` is given), the key of the last of `picks` in the claim's order.
CREATE OR REPLACE FUNCTION pgq._set_claim_floors(rooms pgq.claim_room[], picks bigint[], kinds text[])
    RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO pgq.claim_floors AS f (pid, set_at, keys, priorities, run_ats, ids)
    SELECT pg_backend_pid(), pgq._now(), array_agg(l.key), array_agg(l.priority), array_agg(l.run_at), array_agg(l.id)
    FROM (
        SELECT DISTINCT ON (j.queue, k.kind) j.queue || chr(31) || k.kind AS key, j.priority, j.run_at, j.id
        FROM pgq.jobs AS j
        CROSS JOIN LATERAL (SELECT CASE WHEN _set_claim_floors.kinds IS NULL THEN '' ELSE j.kind END AS kind) AS k
        WHERE j.id = ANY (_set_claim_floors.picks)
          AND j.queue IN (SELECT r.queue FROM unnest(_set_claim_floors.rooms) AS r WHERE NOT r.fair AND NOT r.keyed)
        ORDER BY j.queue, k.kind, j.priority, j.run_at DESC, j.id DESC
    ) AS l
    HAVING count(*) > 0
    ON CONFLICT (pid) DO UPDATE
    SET set_at = excluded.set_at, keys = excluded.keys, priorities = excluded.priorities,
        run_ats = excluded.run_ats, ids = excluded.ids
    RETURNING setval('pgq.claim_floors_set', pgq._micros(f.set_at))
$$;

-- One queue's (and kind's) due jobs in the claim's order, up to `room`, locked FOR NO KEY UPDATE
-- SKIP LOCKED: from the start of the order when `priority` is NULL; else from a floor: the levels
-- above `priority` from their start, then that level from just past (run_at, id).
CREATE OR REPLACE FUNCTION pgq._floor_rows(queue text, kind text, room integer, priority integer,
                                           run_at timestamptz, id bigint)
    RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
BEGIN
    IF _floor_rows.kind IS NULL THEN
        IF _floor_rows.priority IS NULL THEN
            RETURN ARRAY(SELECT j.id FROM pgq.jobs AS j
                         WHERE j.queue = _floor_rows.queue
                           AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                         ORDER BY j.priority DESC, j.run_at, j.id
                         LIMIT _floor_rows.room FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
        ids := ARRAY(SELECT j.id FROM pgq.jobs AS j
                     WHERE j.queue = _floor_rows.queue AND j.priority > _floor_rows.priority
                       AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                     ORDER BY j.priority DESC, j.run_at, j.id
                     LIMIT _floor_rows.room FOR NO KEY UPDATE SKIP LOCKED);
        IF cardinality(ids) < _floor_rows.room THEN
            ids := ids || ARRAY(SELECT j.id FROM pgq.jobs AS j
                                WHERE j.queue = _floor_rows.queue AND j.priority = _floor_rows.priority
                                  AND (j.run_at, j.id) > (_floor_rows.run_at, _floor_rows.id)
                                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                                ORDER BY j.run_at, j.id
                                LIMIT _floor_rows.room - cardinality(ids) FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
        RETURN ids;
    END IF;
    IF _floor_rows.priority IS NULL THEN
        RETURN ARRAY(SELECT j.id FROM pgq.jobs AS j
                     WHERE j.queue = _floor_rows.queue AND j.kind = _floor_rows.kind
                       AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                     ORDER BY j.priority DESC, j.run_at, j.id
                     LIMIT _floor_rows.room FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    ids := ARRAY(SELECT j.id FROM pgq.jobs AS j
                 WHERE j.queue = _floor_rows.queue AND j.kind = _floor_rows.kind AND j.priority > _floor_rows.priority
                   AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT _floor_rows.room FOR NO KEY UPDATE SKIP LOCKED);
    IF cardinality(ids) < _floor_rows.room THEN
        ids := ids || ARRAY(SELECT j.id FROM pgq.jobs AS j
                            WHERE j.queue = _floor_rows.queue AND j.kind = _floor_rows.kind
                              AND j.priority = _floor_rows.priority
                              AND (j.run_at, j.id) > (_floor_rows.run_at, _floor_rows.id)
                              AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.run_at <= pgq._now()
                            ORDER BY j.run_at, j.id
                            LIMIT _floor_rows.room - cardinality(ids) FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    RETURN ids;
END
$$;

-- pgq._lease_jobs' pick while claim floors are in use (or once a second): per queue (and kind) of
-- `rooms`, pgq._floor_rows, then, with `picked`, the first `batch` in the claim's order (what the
-- one statement of pgq._lease_jobs picks). From this process's floors when it recorded them less
-- than a second ago; a floor read that comes back short reads the whole order instead and ends
-- them. Else from the start of the order, counting the entries of the ready index it reads
-- (jobs_kind_ready_idx when the worker names its kinds): when that is 5,000 more than it picked,
-- the floors are recorded.
CREATE OR REPLACE FUNCTION pgq._floor_pick(rooms pgq.claim_room[], picked bigint[], batch integer, kinds text[])
    RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    floors pgq.claim_floors;
    e      record;
    n      integer;   -- the floor's place in `floors`
    part   bigint[];
    ids    bigint[] := '{}';
    short  boolean := false;
    seen   bigint;    -- the entries of the ready index this process read before (without floors)
BEGIN
    SELECT f.* INTO floors FROM pgq.claim_floors AS f
    WHERE f.pid = pg_backend_pid() AND f.set_at <@ tstzrange(pgq._now() - interval '1 second', pgq._now(), '[]');
    IF NOT FOUND THEN
        seen := pgq._ready_entries_read(_floor_pick.kinds);
    END IF;
    FOR e IN SELECT r.queue, r.room, w.kind
             FROM unnest(_floor_pick.rooms) AS r
             CROSS JOIN (SELECT DISTINCT w.kind FROM unnest(coalesce(_floor_pick.kinds, ARRAY[NULL::text])) AS w(kind)) AS w
             WHERE NOT r.fair AND NOT r.keyed AND r.room > 0
    LOOP
        n := array_position(floors.keys, e.queue || chr(31) || coalesce(e.kind, ''));
        part := pgq._floor_rows(e.queue, e.kind, e.room, floors.priorities[n], floors.run_ats[n], floors.ids[n]);
        IF n IS NOT NULL AND cardinality(part) < e.room THEN
            short := true;  -- (the jobs this claim just locked come back again)
            part := pgq._floor_rows(e.queue, e.kind, e.room, NULL, NULL, NULL);
        END IF;
        ids := ids || part;
    END LOOP;
    ids := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (ids || _floor_pick.picked)
                 ORDER BY j.priority DESC, j.run_at, j.id LIMIT _floor_pick.batch);
    IF short THEN
        DELETE FROM pgq.claim_floors AS f WHERE f.pid = pg_backend_pid();
    ELSIF seen IS NOT NULL
          AND pgq._walked_far(seen, _floor_pick.kinds, cardinality(ids)) THEN
        PERFORM pgq._set_claim_floors(_floor_pick.rooms, ids, _floor_pick.kinds);
    END IF;
    RETURN ids;
END
$$;


-- The pick, then the lease: for each eligible queue (its room in `rooms`, in name order, with the
-- room each has, and whether it is fair or takes the per-key step), its first claimable jobs in index
-- order, per kind when the worker named its kinds; with the fair and key-limited queues' picks
-- (`picked`, locked by pgq._fair_pick and pgq._keyed_pick) and the queues with max_wait's
-- (pgq._aged_rooms), the best `batch` of those across queues are locked (the pick), then become
-- running under a lease, attempt + 1, claimed_by `worker`, bound to the login; a claimed event each
-- (queues with audit). Returns them in no order (pgq.claim sorts them).
-- A pick that has expired (enqueue's start_by passed before its first claim, or its expires_at:
-- pgq._expired) is never handed out: it leaves the claimable jobs, waiting, its attempt untouched,
-- for the sweep to end (pgq._expire_jobs; an end here would set off its consequences inside the
-- claim). The lease tests nothing for that but whether a pick has a start_by or an expires_at at
-- all (issue 39: a job that uses none of durable execution pays nothing for it); only when one has
-- does a second pass set the expired ones aside and lease the rest. The picks stay locked by this
-- transaction throughout, and pgq._now() is the same in every statement (the start of the
-- caller's), so the passes see the rows and the clock the pick saw.
CREATE OR REPLACE FUNCTION pgq._lease_jobs(worker text, rooms pgq.claim_room[], picked bigint[], batch integer,
                                           lease interval, kinds text[], look boolean)
    RETURNS SETOF pgq.claimed_job
    LANGUAGE plpgsql
    AS $$
DECLARE
    picks  bigint[];  -- the jobs picked and locked
    leased integer;   -- how many the pass handed out
    seen   bigint;    -- (look) the entries of the ready index this process read before the pick
BEGIN
    -- The pick. While some process has claim floors (pgq.claim_floors_set, a sequence, is 0
    -- without a held snapshot: a claim pays that one read for them), pgq._floor_pick (above): the
    -- same picks, from this process's floors when they are fresh, counting what it reads when they
    -- are not. Else the one statement below; once a second (`look`: the claim that raised the lease
    -- floor) counting what it reads, to record floors when it read 5,000 entries more than it picked.
    -- (NULL, the sequence never set: the one statement.)
    IF pg_sequence_last_value('pgq.claim_floors_set') > 0 THEN
        picks := pgq._floor_pick(_lease_jobs.rooms, _lease_jobs.picked, _lease_jobs.batch, _lease_jobs.kinds);
    ELSE
        IF _lease_jobs.look THEN
            seen := pgq._ready_entries_read(_lease_jobs.kinds);
        END IF;
        -- ("WITH picked AS" names this statement in plans: tests/plankit.py, the lab.)
        picks := ARRAY(WITH picked AS (
                -- For each eligible queue, its first claimable jobs in index order (up to its room);
                -- with the fair queues' picks, the best `batch` of those across queues.
                SELECT c.id
                FROM (
                    SELECT c.id, c.priority, c.run_at
                    FROM unnest(_lease_jobs.rooms) AS e
                    CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at
                        FROM pgq.jobs AS j
                        WHERE j.queue = e.queue
                          AND j.state = 'pending' AND j.attempt < j.max_attempts
                          AND j.run_at <= pgq._now()
                        ORDER BY j.priority DESC, j.run_at, j.id
                        LIMIT e.room
                        FOR NO KEY UPDATE SKIP LOCKED
                    ) AS c
                    WHERE NOT e.fair AND NOT e.keyed AND _lease_jobs.kinds IS NULL
                    UNION ALL
                    -- The same per (queue, kind) when the worker named its kinds (each kind once; no
                    -- rows for NULL). Inside this one statement: a query of its own would cost a claim
                    -- more than the per-kind picks do.
                    SELECT c.id, c.priority, c.run_at
                    FROM unnest(_lease_jobs.rooms) AS e
                    CROSS JOIN (SELECT DISTINCT w.kind FROM unnest(_lease_jobs.kinds) AS w(kind)) AS k
                    CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at
                        FROM pgq.jobs AS j
                        WHERE j.queue = e.queue AND j.kind = k.kind
                          AND j.state = 'pending' AND j.attempt < j.max_attempts
                          AND j.run_at <= pgq._now()
                        ORDER BY j.priority DESC, j.run_at, j.id
                        LIMIT e.room
                        FOR NO KEY UPDATE SKIP LOCKED
                    ) AS c
                    WHERE NOT e.fair AND NOT e.keyed
                    UNION ALL
                    -- The fair and the key-limited queues' picks (pgq._fair_pick, pgq._keyed_pick), and the
                    -- rest of the picks of the queues with max_wait (pgq._aged_rooms).
                    SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (_lease_jobs.picked)
                ) AS c
                ORDER BY c.priority DESC, c.run_at, c.id
                LIMIT _lease_jobs.batch
            ) SELECT p.id FROM picked AS p);
        IF _lease_jobs.look THEN  -- (nested: an expression's functions are set up when it is reached)
            IF pgq._walked_far(seen, _lease_jobs.kinds, cardinality(picks)) THEN
                PERFORM pgq._set_claim_floors(_lease_jobs.rooms, picks, _lease_jobs.kinds);
            END IF;
        END IF;
    END IF;

    FOR pass IN 1..2 LOOP
        RETURN QUERY
        WITH claimed AS (
            UPDATE pgq.jobs AS j
            SET state = 'running',
                -- The next number, past any a fence move skipped (attempt_skip is 0 but after a promotion).
                attempt = j.attempt + 1 + j.attempt_skip,
                max_attempts = j.max_attempts + j.attempt_skip,
                attempt_offset = j.attempt_offset + j.attempt_skip,
                attempt_skip = 0,
                lease_until = least(pgq._now() + coalesce(_lease_jobs.lease, q.lease),
                                    pgq._now() + coalesce(j.max_run_time, q.max_run_time), j.expires_at),
                deadline = least(pgq._now() + coalesce(j.max_run_time, q.max_run_time), j.expires_at),
                claimed_by = _lease_jobs.worker,
                claimed_at = pgq._now(),
                session_role = session_user,
                last_event = 'claimed'
            FROM pgq.queues AS q
            -- The picked ids as an array: the generic plan reads them by primary key. The first
            -- pass takes the picks without a lifetime, the second those left unexpired. (Tested
            -- column by column, which the planner estimates by the columns' NULL fractions: as
            -- coalesce(start_by, expires_at) IS NULL it guessed one row and read pgq.queues once
            -- per job instead of once per queue, +1% of a claim of 64's work.)
            WHERE j.id = ANY (picks) AND q.name = j.queue
              AND (j.start_by IS NULL AND j.expires_at IS NULL OR pass = 2)
            RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
                      j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, j.meta,
                      q.audit
        ), events AS (
            INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
            SELECT c.id, c.attempt, _lease_jobs.worker, 'claimed', 'pending', 'running'
            FROM claimed AS c WHERE c.audit
        )
        SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
               c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline, c.meta
        FROM claimed AS c;
        GET DIAGNOSTICS leased = ROW_COUNT;
        EXIT WHEN pass = 2 OR leased = cardinality(picks);
        -- The picks left have a start_by or an expires_at: those whose time has passed are set
        -- aside, and the second pass leases the others.
        UPDATE pgq.jobs AS j
        SET state = 'waiting', lease_until = NULL,
            deadline = least(pgq._now() + coalesce(j.max_run_time, q.max_run_time), j.expires_at),
            claimed_by = _lease_jobs.worker, claimed_at = pgq._now(), session_role = session_user,
            last_event = 'expired'
        FROM pgq.queues AS q
        WHERE j.id = ANY (picks) AND q.name = j.queue AND j.state = 'pending'
          AND pgq._expired(j.attempt, j.start_by, j.expires_at);
        picks := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (picks) AND j.state = 'pending');
    END LOOP;
END
$$;

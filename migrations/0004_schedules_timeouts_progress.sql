-- pgq migration 0004: schedules, execution timeouts and progress checkpoints.
--
-- Schedules: pgq.schedules holds periodic jobs (cron or every); pgq.schedule / unschedule /
-- schedules manage and list them; due occurrences are enqueued by pgq.sweep and by pgq.claim
-- (of the queues they claim, which queues.next_schedule_at tells them), at most once per (schedule, fire time)
-- (pgq._fire_schedules). Jobs keep the name of their schedule (jobs.schedule).
-- Timeouts: queues.max_run_time (configure_queue) and jobs.max_run_time (enqueue, enqueue_many)
-- bound an attempt: claim and renew never lease past jobs.deadline, and the recovery ends an
-- attempt whose lease reached it (event timed_out).
-- cron: pgq.cron_next (and its internal pgq._cron_* helpers) computes a cron schedule's next run.
-- Progress: pgq.progress stores a checkpoint on the job (jobs.progress), which pgq.claim returns.
-- pgq.claimed_job gains progress and deadline. enqueue, enqueue_many and configure_queue gain an
-- argument, so they are dropped and created again (with their grants).
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

-- Columns and types --------------------------------------------------------------------------------

ALTER TABLE pgq.queues ADD COLUMN max_run_time interval;
ALTER TABLE pgq.queues ADD COLUMN next_schedule_at timestamptz;
ALTER TABLE pgq.queues ADD CONSTRAINT queues_max_run_time_check
    CHECK (max_run_time > '0' AND max_run_time <= '365 days');
COMMENT ON COLUMN pgq.queues.max_run_time IS
    'How long an attempt may run from its claim (jobs.max_run_time overrides it); NULL: no limit.';
COMMENT ON COLUMN pgq.queues.next_schedule_at IS
    'The earliest next_run_at of the queue''s enabled schedules (NULL: none), kept by pgq.schedule, '
    'pgq.unschedule and the firing: a claim reads it with the queue''s settings to know whether a '
    'schedule is due, at no extra cost.';

-- Nullable columns without a default: a catalog change, no rewrite of pgq.jobs.
ALTER TABLE pgq.jobs ADD COLUMN max_run_time interval;
ALTER TABLE pgq.jobs ADD COLUMN deadline timestamptz;
ALTER TABLE pgq.jobs ADD COLUMN progress jsonb;
ALTER TABLE pgq.jobs ADD COLUMN schedule text;
COMMENT ON COLUMN pgq.jobs.max_run_time IS
    'How long an attempt of this job may run from its claim; NULL: the queue''s max_run_time.';
COMMENT ON COLUMN pgq.jobs.deadline IS
    'The latest attempt''s deadline (claimed_at + max_run_time), set by each claim; NULL: no limit. '
    'Its lease never passes it; the recovery ends the attempt as timed_out once it has.';
COMMENT ON COLUMN pgq.jobs.progress IS
    'The checkpoint the job''s attempts record with pgq.progress; kept across retries.';
COMMENT ON COLUMN pgq.jobs.schedule IS
    'The schedule (pgq.schedules.name) that enqueued this job; NULL for jobs enqueued directly.';

ALTER TYPE pgq.claimed_job ADD ATTRIBUTE progress jsonb, ADD ATTRIBUTE deadline timestamptz;
COMMENT ON TYPE pgq.claimed_job IS
    'What pgq.claim hands a worker: the job, its fencing token (attempt), the checkpoint an '
    'earlier attempt recorded (progress) and the attempt''s deadline (NULL: no limit).';

-- Periodic schedules: each due occurrence becomes one job (pgq._fire_schedules).
CREATE TABLE pgq.schedules (
    name             text        PRIMARY KEY,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    cron             text,
    every            interval,
    payload          jsonb       NOT NULL DEFAULT '{}',
    timezone         text        NOT NULL DEFAULT 'UTC',
    priority         integer     NOT NULL DEFAULT 0,
    max_attempts     integer,
    tenant           text,
    skip_if_running  boolean     NOT NULL DEFAULT false,
    enabled          boolean     NOT NULL DEFAULT true,
    next_run_at      timestamptz NOT NULL,
    last_run_at      timestamptz,
    last_job_id      bigint,
    last_skipped_at  timestamptz,
    skipped          bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_cron_or_every_check CHECK ((cron IS NULL) <> (every IS NULL))
);
COMMENT ON TABLE pgq.schedules IS
    'Periodic jobs (pgq.schedule): each occurrence due by next_run_at is enqueued once by a claim '
    'or sweep, which moves next_run_at past now.';
COMMENT ON COLUMN pgq.schedules.last_run_at IS
    'The fire time of the latest occurrence enqueued (the run_at of job last_job_id).';
COMMENT ON COLUMN pgq.schedules.skipped IS
    'Occurrences skipped by skip_if_running (the latest at last_skipped_at).';

-- The sweep's probe and the firing read the enabled schedules by next_run_at; queues.next_schedule_at
-- is kept from the earliest one per queue.
CREATE INDEX schedules_due_idx ON pgq.schedules (next_run_at) WHERE enabled;
CREATE INDEX schedules_queue_idx ON pgq.schedules (queue, next_run_at) WHERE enabled;

-- Internal helpers ------------------------------------------------------------------------------

-- Recovers running jobs whose lease has expired: back to pending at once (the attempt they used
-- is counted), or to failed when that was the last attempt. An attempt whose lease reached its
-- deadline (claim and renew never lease past it) has timed out instead: it ends as a failure
-- (event timed_out, last_error 'timed out after <max_run_time>'), retried after the queue's
-- backoff while attempts remain, failed otherwise. The candidates are locked with their
-- expiry re-checked on the newest row version (FOR NO KEY UPDATE re-evaluates the WHERE clause of
-- a row changed after the statement's snapshot); the UPDATE re-checks, on the row it holds, that
-- the same attempt is still running, so a job completed or re-claimed meanwhile is never touched.
-- The UPDATE's re-check deliberately names no lease_until condition: one would let the planner
-- drive the UPDATE from jobs_lease_idx instead of the locked ids, and with statistics that say
-- few jobs are running it did, reading every expired lease once per recovered job (1.5 s for a
-- sweep(1000) over 2,850 expired leases, growing with their square).
CREATE OR REPLACE FUNCTION pgq._recover_expired(max_jobs integer)
    RETURNS TABLE (queue text, recovered bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT j.id, j.attempt
        FROM pgq.jobs AS j
        WHERE j.state = 'running' AND j.lease_until < pgq._now()
        ORDER BY j.lease_until
        LIMIT _recover_expired.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), recovered AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'pending' END::pgq.job_state,
            lease_until = NULL,
            finished_at = CASE WHEN j.attempt >= j.max_attempts THEN pgq._now() END,
            run_at = CASE WHEN j.lease_until >= j.deadline AND j.attempt < j.max_attempts
                          THEN pgq._now() + pgq._backoff(j.attempt, q.backoff_base, q.backoff_cap)
                          ELSE j.run_at END,
            last_event = CASE WHEN j.lease_until >= j.deadline THEN 'timed_out' ELSE 'lease_expired' END,
            last_error = CASE WHEN j.lease_until >= j.deadline
                              THEN format('timed out after %s', j.deadline - j.claimed_at)
                              ELSE format('lease expired at %s (attempt %s, worker %s)',
                                          j.lease_until, j.attempt, j.claimed_by) END
        FROM expired AS e, pgq.queues AS q
        WHERE j.id = e.id AND j.state = 'running' AND j.attempt = e.attempt AND q.name = j.queue
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.state, j.last_event, j.last_error, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT r.id, r.attempt, r.claimed_by, r.last_event, 'running', r.state,
               CASE WHEN r.last_event = 'timed_out' THEN r.last_error ELSE 'recovered' END
        FROM recovered AS r
        WHERE r.audit
    )
    SELECT r.queue, count(*) FROM recovered AS r GROUP BY r.queue;
END
$$;

-- Functions: cron expressions ---------------------------------------------------------------------
--
-- pgq.cron_next: the next firing of a cron expression, computed in SQL (issue 15, "Schedules").
--
-- pgq.cron_next(cron, after, timezone) is the first instant strictly after `after` whose local
-- wall-clock time in `timezone` matches `cron`. It is called on every firing of a schedule, so it
-- never walks minute by minute: each field is parsed once per call into a bit mask (bit v set when
-- v is allowed), and the search jumps field by field in local time (the next allowed month, then
-- day, then hour, then minute, carrying over into the field above when one runs out), then turns
-- the local time into an instant. A few dozen plain expressions per call, whatever the expression.
--
-- Grammar (the issue's): 5 fields separated by white space,
--   minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC,
--   day-of-week 0-7 or SUN-SAT (0 and 7 are both Sunday); names are case-insensitive.
-- Each field is `*`, a number, `a-b`, `*/n`, `a-b/n`, `a/n` or a comma list of those; or the whole
-- expression is a macro: @yearly = @annually (0 0 1 1 *), @monthly (0 0 1 * *), @weekly
-- (0 0 * * 0), @daily = @midnight (0 0 * * *), @hourly (0 * * * *).
-- Decisions where the issue is silent (as croniter, the tests' reference, has them unless said):
--   * `a/n` runs from a to the field's last value; for day-of-week the last value is 6
--     (Saturday): 7 is only a second name for Sunday, so `1/3` is MON,THU and `*/2` is SUN,TUE,
--     THU,SAT. In a range, SUN as the END means 7, so MON-SUN is the whole week (SUN-SUN is
--     Sunday).
--   * A step larger than its range is allowed and selects the range's first value (`*/90` in the
--     minute field is minute 0). A step of 0 is an error.
--   * A range does not wrap around: `22-2` is an error (reversed range, the issue's rule; croniter
--     wraps it). A one-value range `5-5` is 5 (croniter reads it as `*`).
--   * Day fields: when both are restricted (anything but a bare `*`; `*/2` is restricted) a day
--     matches if EITHER matches; otherwise a day must match both (a bare `*` matches every day).
--     So a list holding `*` (`*,1`) or a range covering every day (`1-31`, `0-7`) is restricted
--     and, matching every day, makes every day match (croniter reads `*,1` and `0-7` as `*`).
--   * An expression that can never match (`0 0 31 2 *`, `0 0 30 2 *`, `0 0 31 4,6,9,11 *`: a
--     day-of-month no allowed month has, with day-of-week `*`) raises 22023 at once, the way
--     croniter refuses it, instead of searching some bounded horizon and answering NULL: a
--     schedule that can never fire is a mistake its author wants to hear about when creating it.
--     Feb 29 alone is a valid schedule: the search jumps to the next leap year (at most 8 years).
--   * `timezone` is any zone PostgreSQL's AT TIME ZONE accepts (IANA names such as
--     'Europe/Berlin', see pg_timezone_names; also abbreviations and POSIX specs, with
--     PostgreSQL's meaning). Unknown: 22023 naming `timezone`.
--   * `after` must be finite (22023); NULL arguments raise 22004 naming them. (A next firing
--     past the end of the timestamp range, year 294276, fails as PostgreSQL does: 22008.)
-- Daylight saving (the issue's rule, which is not croniter's): a local time that does not exist
-- (skipped by a spring-forward transition) does not fire at all; a local time that happens twice
-- (fall-back) fires once, at its first occurrence. So `0 * * * *` in Europe/Berlin fires at 01:00
-- CET and then at 03:00 CEST on the spring day, and at 02:00 CEST then 03:00 CET on the autumn
-- day (the second 02:00, CET, is not a new firing).
--
-- Errors are pgq's (pgq._bad_argument): 22023 with a message naming `cron` and the bad field
-- (`minute`, `hour`, `day-of-month`, `month`, `day-of-week`), or `timezone`, or `after`.
-- The helpers pgq._cron_* are internal: no pgq role may call them (they run as the owner, inside
-- pgq.cron_next, which pins the search_path for them).

-- The smallest v >= x whose bit is set in mask, or NULL when there is none. One expression, so the
-- planner inlines it into the PL/pgSQL that calls it: the lowest set bit of mask >> x is isolated
-- (y & -y) and its position read off its logarithm, exact for powers of two below 2^63.
CREATE FUNCTION pgq._cron_next_bit(mask bigint, x integer) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN x BETWEEN 0 AND 62 AND (mask >> x) <> 0
                THEN x + round(ln(((mask >> x) & -(mask >> x))::float8) / ln(2::float8))::integer
           END
$$;

-- Raises 22023 naming `cron` and one of its fields.
CREATE FUNCTION pgq._cron_bad_field(field text, spec text, problem text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._bad_argument('cron',
        format('has a bad %s field %s: %s', field, left(quote_literal(spec), 80), problem),
        'Five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or JAN-DEC) '
        'day-of-week (0-7 or SUN-SAT, 0 and 7 are Sunday); each *, a number, a-b, */n, a-b/n, a/n '
        'or a comma list of those, e.g. ''*/15 9-17 * * MON-FRI''. Or a macro such as @daily.');
END
$$;

-- One value of a cron field: a number within lo..hi, or a name (names[1] is the value lo).
-- In day-of-week, SUN ending a range is 7, so that MON-SUN is the whole week.
CREATE FUNCTION pgq._cron_value(field text, spec text, token text, lo integer, hi integer,
                                names text[], range_end boolean)
    RETURNS integer
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    v integer;
BEGIN
    IF token <> '' AND translate(token, '0123456789', '') = '' THEN
        IF length(token) > 4 OR token::integer NOT BETWEEN lo AND hi THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('%s is out of range %s-%s', left(token, 20), lo, hi));
        END IF;
        RETURN token::integer;
    END IF;
    v := array_position(names, upper(token));
    IF v IS NULL THEN
        PERFORM pgq._cron_bad_field(field, spec,
            CASE WHEN names IS NULL THEN format('%s is not a number', left(quote_literal(token), 20))
                 ELSE format('%s is not a number or a name (%s)', left(quote_literal(token), 20),
                             array_to_string(names, ' '))
            END);
    END IF;
    v := v - 1 + lo;
    IF range_end AND field = 'day-of-week' AND v = 0 THEN
        v := 7;
    END IF;
    RETURN v;
END
$$;

-- The values one field allows, as a bit mask. lo..hi are the values it may name; `*` and the
-- open end of `a/n` stop at 6 in day-of-week (7 names Sunday again); 7 is folded into 0.
CREATE FUNCTION pgq._cron_field(field text, spec text, lo integer, hi integer, names text[])
    RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    last  integer := CASE WHEN field = 'day-of-week' THEN 6 ELSE hi END;
    mask  bigint := 0;
    item  text;
    body  text;
    steps text;
    a     integer;
    b     integer;
    step  integer;
BEGIN
    IF spec = '*' THEN
        RETURN ((1::bigint << (last + 1)) - 1) & ~((1::bigint << lo) - 1);
    ELSIF translate(spec, '0123456789', '') = '' AND length(spec) BETWEEN 1 AND 2
          AND spec::integer BETWEEN lo AND hi THEN           -- one number: the common case
        RETURN CASE WHEN field = 'day-of-week' AND spec::integer = 7 THEN 1
                    ELSE 1::bigint << spec::integer END;
    END IF;
    FOREACH item IN ARRAY string_to_array(spec, ',') LOOP
        -- item is body[/step], body is *, a or a-b (plain string functions: a regular expression
        -- with captures costs ~40 us here, more than all the rest of a call).
        body := split_part(item, '/', 1);
        steps := CASE WHEN strpos(item, '/') > 0 THEN split_part(item, '/', 2) END;
        IF body = '' OR item LIKE '%/%/%' OR body LIKE '%-%-%' OR steps = ''
           OR translate(steps, '0123456789', '') <> '' OR (body LIKE '*_%') THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('%s is not *, a number, a-b, */n, a-b/n or a/n', left(quote_literal(item), 40)));
        END IF;
        IF body = '*' THEN
            a := lo;
            b := last;
        ELSE
            a := pgq._cron_value(field, spec, split_part(body, '-', 1), lo, hi, names, false);
            b := CASE WHEN strpos(body, '-') > 0
                      THEN pgq._cron_value(field, spec, split_part(body, '-', 2), lo, hi, names, true)
                      WHEN steps IS NOT NULL THEN greatest(a, last)
                      ELSE a
                 END;
            IF b = 7 AND a = 0 AND upper(split_part(body, '-', 2)) = 'SUN' THEN
                b := 0;                                 -- SUN-SUN is Sunday, not the week
            END IF;
        END IF;
        step := CASE WHEN steps IS NULL THEN 1
                     WHEN length(steps) > 4 THEN 9999  -- larger than any range: the first value only
                     ELSE steps::integer
                END;
        IF step = 0 THEN
            PERFORM pgq._cron_bad_field(field, spec, format('the step in %s is 0', quote_literal(item)));
        END IF;
        IF a > b THEN
            PERFORM pgq._cron_bad_field(field, spec,
                format('the range %s is reversed (a range does not wrap around: write two, as in 22-23,0-2)',
                       quote_literal(item)));
        END IF;
        FOR v IN a..b BY step LOOP
            mask := mask | (1::bigint << v);
        END LOOP;
    END LOOP;
    IF field = 'day-of-week' AND mask & 128 <> 0 THEN
        mask := (mask | 1) & ~128::bigint;
    END IF;
    RETURN mask;
END
$$;

-- A cron expression as the masks of its fields:
-- {minute, hour, day-of-month, month, day-of-week, day-of-month restricted (0/1), day-of-week
-- restricted (0/1)}. Raises 22023 naming `cron` when it is malformed or can never match.
CREATE FUNCTION pgq._cron_parse(cron text) RETURNS bigint[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    expr   text := btrim(cron, E' \t\r\n');
    fields text[];
    f      bigint[];
BEGIN
    IF left(expr, 1) = '@' THEN
        expr := CASE lower(expr)
                    WHEN '@yearly' THEN '0 0 1 1 *'
                    WHEN '@annually' THEN '0 0 1 1 *'
                    WHEN '@monthly' THEN '0 0 1 * *'
                    WHEN '@weekly' THEN '0 0 * * 0'
                    WHEN '@daily' THEN '0 0 * * *'
                    WHEN '@midnight' THEN '0 0 * * *'
                    WHEN '@hourly' THEN '0 * * * *'
                END;
        IF expr IS NULL THEN
            PERFORM pgq._bad_argument('cron',
                format('is not a known macro: %s', left(quote_literal(cron), 80)),
                'The macros are @yearly (or @annually), @monthly, @weekly, @daily (or @midnight) '
                'and @hourly; or write the 5 fields.');
        END IF;
    END IF;
    fields := CASE WHEN expr = '' THEN '{}'
                   WHEN strpos(expr, '  ') = 0 AND translate(expr, E'\t\r\n', '') = expr
                   THEN string_to_array(expr, ' ')  -- the common case, 5x cheaper than the regexp
                   ELSE regexp_split_to_array(expr, '\s+')
              END;
    IF cardinality(fields) <> 5 THEN
        PERFORM pgq._bad_argument('cron',
            format('must have 5 fields (minute hour day-of-month month day-of-week), got %s: %s',
                   cardinality(fields), left(quote_literal(cron), 80)),
            'For example ''*/15 9-17 * * MON-FRI'' or a macro such as @daily. Seconds and years '
            'are not supported.');
    END IF;
    -- (`*` is spelled out here: a call of _cron_field costs a few microseconds.)
    f := ARRAY[CASE WHEN fields[1] = '*' THEN 1152921504606846975  -- bits 0-59
                    ELSE pgq._cron_field('minute', fields[1], 0, 59, NULL) END,
               CASE WHEN fields[2] = '*' THEN 16777215               -- bits 0-23
                    ELSE pgq._cron_field('hour', fields[2], 0, 23, NULL) END,
               CASE WHEN fields[3] = '*' THEN 4294967294             -- bits 1-31
                    ELSE pgq._cron_field('day-of-month', fields[3], 1, 31, NULL) END,
               CASE WHEN fields[4] = '*' THEN 8190                   -- bits 1-12
                    ELSE pgq._cron_field('month', fields[4], 1, 12,
                                         '{JAN,FEB,MAR,APR,MAY,JUN,JUL,AUG,SEP,OCT,NOV,DEC}') END,
               CASE WHEN fields[5] = '*' THEN 127                    -- bits 0-6
                    ELSE pgq._cron_field('day-of-week', fields[5], 0, 7,
                                         '{SUN,MON,TUE,WED,THU,FRI,SAT}') END,
               (fields[3] <> '*')::integer,
               (fields[5] <> '*')::integer];
    -- With day-of-week `*` a day must match day-of-month: some allowed month must have its
    -- smallest day (31-day months are bits 1 3 5 7 8 10 12 = 5546, 30-day ones 4 6 9 11 = 2640).
    IF f[7] = 0 AND pgq._cron_next_bit(f[3], 1) > (CASE WHEN f[4] & 5546 <> 0 THEN 31
                                                        WHEN f[4] & 2640 <> 0 THEN 30
                                                        ELSE 29 END) THEN
        PERFORM pgq._bad_argument('cron',
            format('never matches: no month its month field %s allows has a day its day-of-month '
                   'field %s allows', left(quote_literal(fields[4]), 40), left(quote_literal(fields[3]), 40)),
            'February has 29 days in leap years only, and April, June, September and November 30.');
    END IF;
    RETURN f;
END
$$;

-- The first local time at or after start (a whole minute) that the parsed fields f match.
CREATE FUNCTION pgq._cron_local(f bigint[], start timestamp) RETURNS timestamp
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
DECLARE
    y     integer := date_part('year', start);  -- date_part (float8): extract's numeric is slower
    mo    integer := date_part('month', start);
    d     integer := date_part('day', start);
    h     integer := date_part('hour', start);
    mi    integer := date_part('minute', start);
    n     integer;
    first date;
    w     integer;
BEGIN
    -- Every pass moves forward; with the never-matching expressions refused by _cron_parse, the
    -- longest search (Feb 29 from March 2096: 2104) takes a few dozen passes.
    FOR pass IN 1..2000 LOOP
        n := pgq._cron_next_bit(f[4], mo);
        IF n IS NULL THEN                       -- no allowed month left this year
            y := y + 1; mo := 1; d := 1; h := 0; mi := 0;
            CONTINUE;
        ELSIF n > mo THEN
            mo := n; d := 1; h := 0; mi := 0;
        END IF;
        first := make_date(y, mo, 1);
        IF f[6] = 0 AND f[7] = 0 THEN           -- both day fields `*`: every day
            n := d;
        ELSIF f[7] = 0 THEN                     -- day-of-month alone
            n := pgq._cron_next_bit(f[3], d);
        ELSE                                    -- day-of-week (mask doubled to wrap the week),
            w := date_part('dow', first + (d - 1));   -- or-ed with day-of-month if restricted
            n := d + pgq._cron_next_bit(f[5] | (f[5] << 7), w) - w;
            IF f[6] = 1 THEN
                n := least(n, pgq._cron_next_bit(f[3], d));
            END IF;
        END IF;
        IF n IS NULL OR n > ((first + interval '1 month')::date - first) THEN
            mo := mo + 1; d := 1; h := 0; mi := 0;  -- mo 13 finds no month: next year
            CONTINUE;
        ELSIF n > d THEN
            d := n; h := 0; mi := 0;
        END IF;
        n := pgq._cron_next_bit(f[2], h);
        IF n IS NULL THEN
            d := d + 1; h := 0; mi := 0;        -- past the month's end finds no day: next month
            CONTINUE;
        ELSIF n > h THEN
            h := n; mi := 0;
        END IF;
        n := pgq._cron_next_bit(f[1], mi);
        IF n IS NULL THEN
            h := h + 1; mi := 0;                -- hour 24 finds no hour: next day
            CONTINUE;
        END IF;
        RETURN make_timestamp(y, mo, d, h, n, 0);
    END LOOP;
    RAISE EXCEPTION 'pgq: cron_next found no match (a bug: please report it)' USING ERRCODE = 'XX000';
END
$$;

-- The first instant whose local time in tz is l, or NULL when l does not exist there (a DST gap).
-- PostgreSQL reads an ambiguous local time as its LATER instant (the offset after a fall-back)
-- and a nonexistent one with the offset before the gap; the earlier instant of an ambiguous time
-- is read with the offset in force a day before. Each candidate counts only if it maps back to l.
CREATE FUNCTION pgq._cron_instant(l timestamp, tz text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT least(CASE WHEN (((l - interval '1 day') AT TIME ZONE tz) + interval '1 day') AT TIME ZONE tz = l
                      THEN ((l - interval '1 day') AT TIME ZONE tz) + interval '1 day' END,
                 CASE WHEN (l AT TIME ZONE tz) AT TIME ZONE tz = l THEN l AT TIME ZONE tz END)
$$;

CREATE FUNCTION pgq.cron_next(cron text, after timestamptz, timezone text DEFAULT 'UTC')
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    f      bigint[];
    l      timestamp;     -- a local candidate
    at     timestamptz;   -- its first occurrence (NULL: it does not exist)
    width  integer;       -- the DST transition's width, in minutes
    lo     integer;
    hi     integer;
    mid    integer;
BEGIN
    IF cron_next.cron IS NULL THEN
        PERFORM pgq._bad_argument('cron', 'must not be NULL');
    ELSIF cron_next.after IS NULL THEN
        PERFORM pgq._bad_argument('after', 'must not be NULL', 'Pass now() for the next firing from now.');
    ELSIF NOT isfinite(cron_next.after) THEN
        PERFORM pgq._bad_argument('after', format('must be a finite timestamp, got %s', cron_next.after));
    ELSIF cron_next.timezone IS NULL THEN
        PERFORM pgq._bad_argument('timezone', 'must not be NULL', 'Omit it for UTC.');
    END IF;
    f := pgq._cron_parse(cron_next.cron);
    BEGIN
        l := cron_next.after AT TIME ZONE cron_next.timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM pgq._bad_argument('timezone',
            format('is not a time zone PostgreSQL knows: %s', left(quote_literal(cron_next.timezone), 80)),
            'Use an IANA name such as ''Europe/Berlin'' or ''America/New_York'' (see '
            'pg_timezone_names), or ''UTC''.');
    END;
    l := date_trunc('minute', l) + interval '1 minute';
    FOR pass IN 1..100 LOOP
        l := pgq._cron_local(f, l);
        at := pgq._cron_instant(l, cron_next.timezone);
        IF at > cron_next.after THEN
            RETURN at;
        END IF;
        -- l does not exist (a spring-forward gap: at IS NULL) or it already happened (its first
        -- occurrence is not after `after`, which lies in the second pass of a fall-back overlap).
        -- Either way the first whole local minute past l that exists and whose first occurrence
        -- is after `after` (where the gap or overlap ends) is at most the transition's width past
        -- l: bisect for it, then search on from there.
        width := ceil(abs(extract(epoch FROM
                     CASE WHEN at IS NULL
                          THEN ((l AT TIME ZONE cron_next.timezone) AT TIME ZONE cron_next.timezone) - l
                          ELSE (l AT TIME ZONE cron_next.timezone) - at
                     END)) / 60);
        lo := 1;
        hi := greatest(width, 1);
        WHILE lo < hi LOOP
            mid := (lo + hi) / 2;
            IF pgq._cron_instant(l + make_interval(mins => mid), cron_next.timezone) > cron_next.after THEN
                hi := mid;
            ELSE
                lo := mid + 1;
            END IF;
        END LOOP;
        l := l + make_interval(mins => hi);
    END LOOP;
    RAISE EXCEPTION 'pgq: cron_next found no match (a bug: please report it)' USING ERRCODE = 'XX000';
END
$$;
COMMENT ON FUNCTION pgq.cron_next(text, timestamptz, text) IS
    'The first instant strictly after `after` whose local time in `timezone` matches the 5-field '
    'cron expression (or macro); a nonexistent local time is skipped, a repeated one fires once.';

-- Schedules' helpers ---------------------------------------------------------------------------

-- The first fire time of a schedule strictly after `after`: the instants 'epoch' + k * every,
-- computed in microseconds since the epoch (no calendar, no time zone), or pgq.cron_next.
CREATE FUNCTION pgq._next_fire(cron text, every interval, timezone text, after timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    step numeric;
BEGIN
    IF _next_fire.every IS NULL THEN
        RETURN pgq.cron_next(_next_fire.cron, _next_fire.after, _next_fire.timezone);
    END IF;
    step := round(extract(epoch FROM _next_fire.every) * 1000000);
    RETURN 'epoch'::timestamptz
           + ((floor(round(extract(epoch FROM _next_fire.after) * 1000000) / step) + 1) * step)::float8
             * interval '1 microsecond';
END
$$;

-- Sets queues.next_schedule_at of the given queues from their enabled schedules (the earliest
-- next_run_at), writing only rows whose value changes. The queue rows are locked first, in name
-- order (as capped claims lock them); with skip_locked, a row another transaction holds is left
-- as it is instead of waited for: the firing, which holds schedule and job rows meanwhile, never
-- waits here, so it can take part in no deadlock. A value left behind is at worst early: the next
-- claim of that queue finds nothing due and corrects it.
CREATE FUNCTION pgq._refresh_schedule_due(queues text[], skip_locked boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    locked text[];
BEGIN
    IF skip_locked THEN
        locked := ARRAY(SELECT u.name FROM pgq.queues AS u WHERE u.name = ANY (_refresh_schedule_due.queues)
                        ORDER BY u.name FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        locked := ARRAY(SELECT u.name FROM pgq.queues AS u WHERE u.name = ANY (_refresh_schedule_due.queues)
                        ORDER BY u.name FOR NO KEY UPDATE);
    END IF;
    -- A new statement, so its snapshot sees what the previous holders of these rows committed.
    UPDATE pgq.queues AS q
    SET next_schedule_at = d.at
    FROM (SELECT n.name, (SELECT min(x.next_run_at) FROM pgq.schedules AS x
                          WHERE x.queue = n.name AND x.enabled) AS at
          FROM unnest(locked) AS n(name)) AS d
    WHERE q.name = d.name AND q.next_schedule_at IS DISTINCT FROM d.at;
END
$$;

-- Fires up to max_schedules due schedules (of `queues`, or of every queue when NULL); returns how
-- many jobs it enqueued. Each due schedule
-- is locked (FOR NO KEY UPDATE SKIP LOCKED: a schedule another session is firing is skipped, not
-- waited for, and a row changed after this statement's snapshot is re-checked on its newest
-- version, so a schedule just fired elsewhere is no longer due). Its latest due occurrence (the
-- missed ones before it collapse into it) becomes one job whose run_at is the fire time, in the
-- same transaction that moves next_run_at past now: at most one job per (schedule, fire time).
-- With skip_if_running, an occurrence is skipped (counted in skipped) while the schedule's last
-- job is pending or running. Then the queues' next_schedule_at is brought up to date: of the
-- queues whose schedules it handled, and of those whose value says due (a value computed by a
-- concurrent firing from an older snapshot is corrected here, by the next claim or sweep).
CREATE FUNCTION pgq._fire_schedules(max_schedules integer, queues text[] DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    s          pgq.schedules;
    at_now     timestamptz := pgq._now();
    fire       timestamptz;  -- the latest due occurrence
    hi         timestamptz;  -- no occurrence in (hi, at_now]
    t          timestamptz;
    q          pgq.queues;
    job_tenant text;
    new_id     bigint;
    fired      integer := 0;
    touched    text[] := '{}';
BEGIN
    FOR s IN
        SELECT * FROM pgq.schedules AS x
        WHERE x.enabled AND x.next_run_at <= at_now
          AND (_fire_schedules.queues IS NULL OR x.queue = ANY (_fire_schedules.queues))
        ORDER BY x.next_run_at
        LIMIT _fire_schedules.max_schedules
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        touched := touched || s.queue;
        -- next_run_at is an occurrence, and due: find the latest one at or before now.
        fire := s.next_run_at;
        IF s.every IS NOT NULL THEN
            -- (every is subtracted as seconds: an interval with days would follow the session's
            -- daylight saving time.)
            fire := greatest(fire, pgq._next_fire(NULL, s.every, s.timezone,
                                                  at_now - make_interval(secs => extract(epoch FROM s.every))));
        ELSE
            -- Bisection over (fire, hi]: each step halves the gap or steps to the next
            -- occurrence, so a week of missed minutes costs a few dozen cron_next calls.
            hi := at_now;
            LOOP
                t := pgq.cron_next(s.cron, fire, s.timezone);
                EXIT WHEN t > hi;
                fire := t;
                t := pgq.cron_next(s.cron, to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2),
                                   s.timezone);
                IF t <= hi THEN
                    fire := t;
                ELSE
                    hi := to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2);
                END IF;
            END LOOP;
        END IF;

        IF s.skip_if_running AND EXISTS (SELECT FROM pgq.jobs AS j
                                         WHERE j.id = s.last_job_id AND j.state IN ('pending', 'running')) THEN
            UPDATE pgq.schedules AS x
            SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
                last_skipped_at = fire, skipped = x.skipped + 1
            WHERE x.name = s.name;
            CONTINUE;
        END IF;

        q := pgq._queue(s.queue);
        job_tenant := s.tenant;
        IF q.fair THEN
            job_tenant := pgq._fair_tenant(q.name, job_tenant);
        END IF;
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant, schedule)
        VALUES (s.queue, s.kind, s.payload, s.priority, fire, coalesce(s.max_attempts, q.max_attempts),
                job_tenant, s.name)
        RETURNING j.id INTO new_id;
        UPDATE pgq.schedules AS x
        SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
            last_run_at = fire, last_job_id = new_id
        WHERE x.name = s.name;
        IF q.notify THEN
            PERFORM pg_notify('pgq', s.queue);
        END IF;
        fired := fired + 1;
    END LOOP;
    PERFORM pgq._refresh_schedule_due(ARRAY(
        SELECT DISTINCT t.name FROM unnest(touched) AS t(name)
        UNION
        SELECT u.name FROM pgq.queues AS u
        WHERE u.next_schedule_at <= at_now
          AND (_fire_schedules.queues IS NULL OR u.name = ANY (_fire_schedules.queues))), true);
    RETURN fired;
END
$$;

-- enqueue and enqueue_many gain max_run_time ------------------------------------------------------

DROP FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text);
DROP FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text);

CREATE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    q          pgq.queues;
    new_id     bigint;
    job_tenant text := enqueue.tenant;
BEGIN
    -- Every argument checked in one plain expression (no query, no nested call); only a call that
    -- fails it runs the checks that name the bad argument and raise. (The nested checks cost about
    -- a quarter of an enqueue.)
    IF NOT coalesce(pgq._is_name(enqueue.queue)
                    AND pgq._is_name(enqueue.kind)
                    AND isfinite(enqueue.run_at)
                    AND enqueue.priority BETWEEN -1000 AND 1000
                    AND coalesce(enqueue.max_attempts BETWEEN 1 AND 10000, true)
                    AND coalesce(length(enqueue.tenant) BETWEEN 1 AND 256, true)
                    AND jsonb_typeof(enqueue.payload) = 'object'
                    AND pg_column_size(enqueue.payload) <= 1048576
                    AND coalesce(length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days', true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        IF length(enqueue.unique_key) NOT BETWEEN 1 AND 1024 THEN
            PERFORM pgq._bad_argument('unique_key', 'must be 1 to 1024 characters long');
        END IF;
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
    END IF;
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue.queue;
    IF NOT FOUND THEN
        q := pgq._queue(enqueue.queue);  -- first use: created with the defaults
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it.';

CREATE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant);
    IF enqueue_many.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', enqueue_many.max_run_time, interval '365 days');
    END IF;
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pg_column_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    q := pgq._queue(enqueue_many.queue);
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
    -- the ids in payload order.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT i.id FROM inserted AS i ORDER BY i.id;

    IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order.';

-- Workers -----------------------------------------------------------------------------------------

-- THE CLAIM. One statement picks up to `batch` due pending jobs of the worker's (unpaused)
-- queues in the total order priority DESC, run_at, id, locks them FOR NO KEY UPDATE SKIP LOCKED
-- (rows other claimers hold are skipped, not waited for; a foreign-key KEY SHARE lock does not
-- hide a job), marks them running under a lease measured by the database clock, and increments
-- the attempt, the fencing token every later write must quote. Rows that changed after the
-- statement's snapshot are re-checked by PostgreSQL when locked, so a cancelled or already
-- claimed job is never returned; a batch may hold fewer rows than asked.
-- Expired leases are recovered first (a cheap index probe decides whether there are any), so a
-- crashed worker's job is claimable again as soon as its lease ends, with or without a sweep.
-- Due schedules of the claimed queues fire next: the queue rows read anyway say whether one is
-- due (queues.next_schedule_at), so their jobs are claimable by this very claim.
-- An attempt's lease never passes its deadline (claimed_at + max_run_time).
-- Two queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- and a fair queue's candidates come from pgq._fair_pick. Queues with neither pay nothing for them.
CREATE OR REPLACE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                          lease interval DEFAULT NULL)
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
    names    text[];     -- the eligible queues, in name order
    rooms    integer[];  -- how many jobs each may start now
    fairs    boolean[];  -- whether each is in fair mode
    fair_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running
    expired  boolean;    -- whether any lease has expired
    due      boolean;    -- whether one of them has a schedule due
    due_queues text[];   -- then: the eligible queues, whose due schedules fire
BEGIN
    IF claim.worker IS NULL THEN
        PERFORM pgq._bad_argument('worker', 'must not be NULL');
    ELSIF length(claim.worker) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('worker', 'must be 1 to 256 characters long');
    END IF;
    IF claim.batch IS NULL THEN
        PERFORM pgq._bad_argument('batch', 'must not be NULL');
    ELSIF claim.batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('batch', format('must be between 1 and 1000, got %s', claim.batch));
    END IF;
    IF claim.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', claim.lease, interval '1 day');
    END IF;
    IF claim.queues IS NOT NULL AND (cardinality(claim.queues) = 0 OR array_position(claim.queues, NULL) IS NOT NULL) THEN
        PERFORM pgq._bad_argument('queues', 'must be NULL (all queues) or a non-empty array without NULLs');
    END IF;
    -- A malformed name can never match a queue: say so instead of claiming nothing forever.
    -- Names cannot contain a comma, so one match of the joined names (pgq._is_name's pattern,
    -- repeated) checks them all in a plain expression (no query), and so does the length (no
    -- run of 129 characters without a comma; a joined list of 128 or fewer cannot hold one, and
    -- skips that match). Only a bad name pays for the per-name check that names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
           AND (length(array_to_string(claim.queues, ',')) <= 128
                OR array_to_string(claim.queues, ',') !~ '[^,]{129}'), false) THEN
        PERFORM pgq._check_name(format('queues[%s]', q.n), q.name)
        FROM unnest(claim.queues) WITH ORDINALITY AS q(name, n);
    END IF;

    -- One statement reads the eligible queues (and whether one of them has a schedule due: a
    -- column of the rows read anyway, and bool_or, which allocates nothing, unlike array_agg) and
    -- probes for expired leases (one index probe).
    SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
           coalesce(bool_or(q.max_running > 0), false),
           EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
           coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
    INTO names, fairs, capped, expired, due
    FROM pgq.queues AS q
    WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues));

    -- Expired leases are recovered first, so their jobs are claimable by this very claim.
    IF expired THEN
        PERFORM pgq._recover_expired(100);
    END IF;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked in name order (so claimers never deadlock) before their running
        -- jobs are counted by the next statement, whose fresh snapshot sees every earlier claim.
        -- (Under REPEATABLE READ or SERIALIZABLE that count would come from an older snapshot and
        -- could pass the cap: such a claim of a capped queue is refused.)
        PERFORM FROM pgq.queues AS q
        WHERE q.max_running > 0 AND NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
        ORDER BY q.name
        FOR NO KEY UPDATE;
        IF FOUND AND current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;

        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name)
        INTO names, rooms, fairs
        FROM (
            SELECT q.name, q.fair,
                   CASE WHEN q.max_running = 0 THEN claim.batch
                        ELSE least(claim.batch, q.max_running - (
                                 SELECT count(*) FROM pgq.jobs AS j
                                 WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                   END AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
        ) AS e
        WHERE e.room > 0;
    END IF;

    -- Then the due schedules of these queues fire (at most 10 per claim; a sweep fires the rest),
    -- after the capped queues are locked: the firing only ever skips locked queue rows, so a
    -- claim waits for queue locks in name order alone. Under REPEATABLE READ a claim leaves them
    -- to READ COMMITTED claims and sweeps: its snapshot could make a concurrent firing a
    -- serialization failure of the claim.
    IF due AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._fire_schedules(10, due_queues);
    END IF;

    IF true = ANY (fairs) THEN
        fair_ids := ARRAY(SELECT f.id
                          FROM unnest(names, rooms, fairs) AS e(name, room, fair)
                          CROSS JOIN LATERAL pgq._fair_pick(e.name, e.room) AS f(id)
                          WHERE e.fair);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- For each eligible queue, its first claimable jobs in index order (up to its room);
        -- with the fair queues' picks, the best `batch` of those across queues.
        SELECT c.id
        FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs) AS e(queue, room, fair)
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
            WHERE NOT e.fair
            UNION ALL
            SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (fair_ids)
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT claim.batch
    ), claimed AS (
        UPDATE pgq.jobs AS j
        SET state = 'running',
            attempt = j.attempt + 1,
            lease_until = least(pgq._now() + coalesce(claim.lease, q.lease),
                                pgq._now() + coalesce(j.max_run_time, q.max_run_time)),
            deadline = pgq._now() + coalesce(j.max_run_time, q.max_run_time),
            claimed_by = claim.worker,
            claimed_at = pgq._now(),
            last_event = 'claimed'
        FROM pgq.queues AS q
        -- The picked ids as an array: the generic plan then reads them by primary key. Joined
        -- to the CTE instead, it hashed the CTE and read the whole table (every row ever
        -- enqueued and not yet pruned) on every claim.
        WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p)) AND q.name = j.queue
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval) IS
    'Claims up to batch due jobs for worker, in order priority DESC, run_at, id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

CREATE OR REPLACE FUNCTION pgq.renew(id bigint, attempt integer, lease interval DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_lease timestamptz;
BEGIN
    PERFORM pgq._check_fence(renew.id, renew.attempt);
    IF renew.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', renew.lease, interval '1 day');
    END IF;
    -- Never past the attempt's deadline; at the deadline there is no lease left to give.
    UPDATE pgq.jobs AS j
    SET lease_until = least(pgq._now() + coalesce(renew.lease,
                                                  (SELECT q.lease FROM pgq.queues AS q WHERE q.name = j.queue)),
                            j.deadline)
    WHERE j.id = renew.id AND j.attempt = renew.attempt AND j.state = 'running'
      AND (j.deadline IS NULL OR j.deadline > pgq._now())
    RETURNING j.lease_until INTO new_lease;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM pgq.jobs AS j
                                 WHERE j.id = renew.id AND j.attempt = renew.attempt
                                   AND j.state = 'running' AND j.deadline <= pgq._now()) THEN
        PERFORM pgq._reject(renew.id, renew.attempt, 'renew');
    END IF;
    RETURN new_lease;
END
$$;
COMMENT ON FUNCTION pgq.renew(bigint, integer, interval) IS
    'Extends the lease of the caller''s attempt from the database clock, never past its deadline; '
    'NULL when not yours or at the deadline.';

-- Records a checkpoint of the caller's attempt: a JSON object (at most 1 MiB) that replaces the
-- previous one and survives retries (pgq.claim hands it to the next attempt). Fenced like
-- pgq.complete; writes no event (a job may record progress often).
CREATE FUNCTION pgq.progress(id bigint, attempt integer, progress jsonb)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._check_fence(progress.id, progress.attempt);
    PERFORM pgq._check_payload('progress', progress.progress);
    UPDATE pgq.jobs AS j
    SET progress = progress.progress
    WHERE j.id = progress.id AND j.attempt = progress.attempt AND j.state = 'running';
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(progress.id, progress.attempt, 'progress');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.progress(bigint, integer, jsonb) IS
    'Stores the caller''s attempt''s checkpoint on the job (kept across retries); false when not yours.';

CREATE OR REPLACE FUNCTION pgq.sweep(max_jobs integer DEFAULT 1000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
DECLARE
    total integer := 0;
    r record;
BEGIN
    IF sweep.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF sweep.max_jobs NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 100000, got %s', sweep.max_jobs));
    END IF;
    FOR r IN SELECT x.queue, x.recovered FROM pgq._recover_expired(sweep.max_jobs) AS x LOOP
        total := total + r.recovered;
        IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = r.queue) THEN
            PERFORM pg_notify('pgq', r.queue);
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now()) THEN
        PERFORM pgq._fire_schedules(sweep.max_jobs);
    END IF;
    RETURN total;
END
$$;
COMMENT ON FUNCTION pgq.sweep(integer) IS
    'Recovers up to max_jobs running jobs whose lease expired or whose attempt timed out (returns '
    'how many), and fires up to max_jobs due schedules.';

-- configure_queue gains max_run_time -----------------------------------------------------------------

DROP FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer);

CREATE FUNCTION pgq.configure_queue(queue text, lease interval DEFAULT NULL,
                                    max_attempts integer DEFAULT NULL,
                                    backoff_base interval DEFAULT NULL,
                                    backoff_cap interval DEFAULT NULL,
                                    retention interval DEFAULT NULL,
                                    notify boolean DEFAULT NULL, audit boolean DEFAULT NULL,
                                    fair boolean DEFAULT NULL, max_running integer DEFAULT NULL,
                                    max_run_time interval DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q pgq.queues := pgq._queue(configure_queue.queue);
BEGIN
    IF configure_queue.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', configure_queue.lease, interval '1 day');
    END IF;
    IF configure_queue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', configure_queue.max_attempts));
    END IF;
    IF configure_queue.backoff_base IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_base', configure_queue.backoff_base, interval '365 days');
    END IF;
    IF configure_queue.backoff_cap IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_cap', configure_queue.backoff_cap, interval '365 days');
    END IF;
    IF coalesce(configure_queue.backoff_cap, q.backoff_cap)
       < coalesce(configure_queue.backoff_base, q.backoff_base) THEN
        PERFORM pgq._bad_argument('backoff_cap', 'must not be less than backoff_base');
    END IF;
    IF configure_queue.retention < interval '0' OR configure_queue.retention > interval '3650 days' THEN
        PERFORM pgq._bad_argument('retention', 'must be between 0 and 3650 days');
    END IF;
    IF configure_queue.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no cap) and 100000, got %s', configure_queue.max_running));
    END IF;
    IF configure_queue.max_run_time < interval '0' OR configure_queue.max_run_time > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_run_time',
            format('must be between 0 (no limit) and 365 days, got %s', configure_queue.max_run_time));
    END IF;
    IF configure_queue.fair AND NOT q.fair THEN
        -- Jobs already in the queue join fair mode: those without a tenant get the tenant '',
        -- and every tenant gets its row. (Switch a queue to fair mode before producers use it:
        -- an enqueue that read the queue's settings before this commits stores no tenant, and
        -- fair claims do not see such a job until it is given one.)
        UPDATE pgq.jobs AS j SET tenant = ''
        WHERE j.queue = configure_queue.queue AND j.tenant IS NULL AND j.state <> 'done';
        INSERT INTO pgq.tenants AS t (queue, tenant)
        SELECT DISTINCT j.queue, j.tenant FROM pgq.jobs AS j
        WHERE j.queue = configure_queue.queue AND j.tenant IS NOT NULL AND j.state <> 'done'
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE pgq.queues AS s
    SET lease = coalesce(configure_queue.lease, s.lease),
        max_attempts = coalesce(configure_queue.max_attempts, s.max_attempts),
        backoff_base = coalesce(configure_queue.backoff_base, s.backoff_base),
        backoff_cap = coalesce(configure_queue.backoff_cap, s.backoff_cap),
        retention = coalesce(configure_queue.retention, s.retention),
        notify = coalesce(configure_queue.notify, s.notify),
        audit = coalesce(configure_queue.audit, s.audit),
        fair = coalesce(configure_queue.fair, s.fair),
        max_running = coalesce(configure_queue.max_running, s.max_running),
        max_run_time = CASE WHEN configure_queue.max_run_time IS NULL THEN s.max_run_time
                            WHEN configure_queue.max_run_time = interval '0' THEN NULL
                            ELSE configure_queue.max_run_time END
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval) IS
    'Changes a queue''s settings (NULL leaves one unchanged; max_run_time ''0'' removes the limit) '
    'and returns them; creates the queue if new.';

-- Functions: schedules ----------------------------------------------------------------------------

-- Creates or replaces the schedule `name`: exactly one of cron (pgq.cron_next's grammar, read in
-- `timezone`) or every (the instants 'epoch' + k * every: '1 hour' fires on the hour). Its first
-- occurrence is the first one after now (after its last run, when replaced). Returns its row.
CREATE FUNCTION pgq.schedule(name text, queue text, kind text, cron text DEFAULT NULL,
                             every interval DEFAULT NULL, payload jsonb DEFAULT '{}',
                             timezone text DEFAULT 'UTC', priority integer DEFAULT 0,
                             max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                             skip_if_running boolean DEFAULT false, enabled boolean DEFAULT true)
    RETURNS pgq.schedules
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    result_row pgq.schedules;
    old_queue  text;  -- the queue of the schedule this call replaces, if any
BEGIN
    PERFORM pgq._check_name('name', schedule.name);
    PERFORM pgq._check_enqueue(schedule.queue, schedule.kind, pgq._now(), schedule.priority,
                               schedule.max_attempts, schedule.tenant);
    PERFORM pgq._check_payload('payload', schedule.payload);
    IF schedule.cron IS NULL AND schedule.every IS NULL THEN
        PERFORM pgq._bad_argument('cron', 'or every must be given',
            'Pass exactly one: cron => ''0 * * * *'' or every => ''1 hour''.');
    ELSIF schedule.cron IS NOT NULL AND schedule.every IS NOT NULL THEN
        PERFORM pgq._bad_argument('every', 'must be NULL when cron is given',
            'Pass exactly one of cron and every.');
    ELSIF schedule.every IS NOT NULL
          AND (extract(year FROM schedule.every) <> 0 OR extract(month FROM schedule.every) <> 0) THEN
        PERFORM pgq._bad_argument('every', format('must not count months or years, got %s', schedule.every),
            'Months differ in length: use cron (''0 0 1 * *'' is the first of every month).');
    ELSIF schedule.every < interval '1 second' OR schedule.every > interval '3650 days' THEN
        PERFORM pgq._bad_argument('every',
            format('must be between 1 second and 3650 days, got %s', schedule.every));
    END IF;
    IF schedule.timezone IS NULL THEN
        PERFORM pgq._bad_argument('timezone', 'must not be NULL', 'Omit it for UTC.');
    END IF;
    BEGIN
        PERFORM pgq._now() AT TIME ZONE schedule.timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM pgq._bad_argument('timezone',
            format('is not a known time zone: %s', left(quote_literal(schedule.timezone), 80)),
            'Use a name from pg_timezone_names, such as ''Europe/Paris'' or ''UTC''.');
    END;
    IF schedule.skip_if_running IS NULL THEN
        PERFORM pgq._bad_argument('skip_if_running', 'must not be NULL');
    END IF;
    IF schedule.enabled IS NULL THEN
        PERFORM pgq._bad_argument('enabled', 'must not be NULL');
    END IF;
    -- A malformed cron expression raises here (pgq.cron_next), before anything is written.
    PERFORM pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now());

    PERFORM pgq._queue(schedule.queue);
    SELECT x.queue INTO old_queue FROM pgq.schedules AS x WHERE x.name = schedule.name;
    -- A replaced schedule's next run comes after its last one, whatever this statement's clock.
    INSERT INTO pgq.schedules AS x (name, queue, kind, cron, every, payload, timezone, priority,
                                    max_attempts, tenant, skip_if_running, enabled, next_run_at)
    VALUES (schedule.name, schedule.queue, schedule.kind, schedule.cron, schedule.every,
            schedule.payload, schedule.timezone, schedule.priority, schedule.max_attempts,
            schedule.tenant, schedule.skip_if_running, schedule.enabled,
            pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now()))
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
    SET queue = excluded.queue, kind = excluded.kind, cron = excluded.cron, every = excluded.every,
        payload = excluded.payload, timezone = excluded.timezone, priority = excluded.priority,
        max_attempts = excluded.max_attempts, tenant = excluded.tenant,
        skip_if_running = excluded.skip_if_running, enabled = excluded.enabled,
        next_run_at = pgq._next_fire(excluded.cron, excluded.every, excluded.timezone,
                                     greatest(pgq._now(), x.last_run_at, x.last_skipped_at))
    RETURNING * INTO result_row;
    PERFORM pgq._refresh_schedule_due(ARRAY[schedule.queue, old_queue], false);
    RETURN result_row;
END
$$;
COMMENT ON FUNCTION pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean) IS
    'Creates or replaces a periodic schedule (cron or every) and returns its row with next_run_at.';

CREATE FUNCTION pgq.unschedule(name text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    gone_queue text;
BEGIN
    IF unschedule.name IS NULL THEN
        PERFORM pgq._bad_argument('name', 'must not be NULL');
    END IF;
    DELETE FROM pgq.schedules AS x WHERE x.name = unschedule.name RETURNING x.queue INTO gone_queue;
    IF gone_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pgq._refresh_schedule_due(ARRAY[gone_queue], false);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.unschedule(text) IS
    'Deletes the schedule (its jobs stay); false when there was none of that name.';

CREATE FUNCTION pgq.schedules()
    RETURNS SETOF pgq.schedules
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT * FROM pgq.schedules AS x ORDER BY x.name
$$;
COMMENT ON FUNCTION pgq.schedules() IS
    'Every schedule, by name, with next_run_at, last_run_at, last_job_id and skipped.';

-- Grants ------------------------------------------------------------------------------------------

REVOKE ALL ON pgq.schedules FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION
    pgq._next_fire(text, interval, text, timestamptz),
    pgq._refresh_schedule_due(text[], boolean),
    pgq._fire_schedules(integer, text[]),
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval),
    pgq.progress(bigint, integer, jsonb),
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval),
    pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean),
    pgq.unschedule(text),
    pgq.schedules()
    FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval)
    TO pgq_producer;
GRANT EXECUTE ON FUNCTION pgq.progress(bigint, integer, jsonb) TO pgq_worker;
GRANT EXECUTE ON FUNCTION
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval),
    pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean),
    pgq.unschedule(text)
    TO pgq_admin;
GRANT EXECUTE ON FUNCTION pgq.schedules() TO pgq_monitor;

REVOKE EXECUTE ON FUNCTION
    pgq._cron_next_bit(bigint, integer),
    pgq._cron_bad_field(text, text, text),
    pgq._cron_value(text, text, text, integer, integer, text[], boolean),
    pgq._cron_field(text, text, integer, integer, text[]),
    pgq._cron_parse(text),
    pgq._cron_local(bigint[], timestamp),
    pgq._cron_instant(timestamp, text),
    pgq.cron_next(text, timestamptz, text)
    FROM PUBLIC;

-- A pure function: every pgq role may compute a schedule's next firing.
GRANT EXECUTE ON FUNCTION pgq.cron_next(text, timestamptz, text)
    TO pgq_producer, pgq_worker, pgq_admin, pgq_monitor;

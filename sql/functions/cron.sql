-- sql/functions/cron.sql: cron expressions: pgq.cron_next and its parser.

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
CREATE OR REPLACE FUNCTION pgq._cron_next_bit(mask bigint, x integer) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN x BETWEEN 0 AND 62 AND (mask >> x) <> 0
                THEN x + round(ln(((mask >> x) & -(mask >> x))::float8) / ln(2::float8))::integer
           END
$$;

-- Raises 22023 naming `cron` and one of its fields.
CREATE OR REPLACE FUNCTION pgq._cron_bad_field(field text, spec text, problem text) RETURNS void
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
CREATE OR REPLACE FUNCTION pgq._cron_value(field text, spec text, token text, lo integer, hi integer,
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
CREATE OR REPLACE FUNCTION pgq._cron_field(field text, spec text, lo integer, hi integer, names text[])
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
CREATE OR REPLACE FUNCTION pgq._cron_parse(cron text) RETURNS bigint[]
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
CREATE OR REPLACE FUNCTION pgq._cron_local(f bigint[], start timestamp) RETURNS timestamp
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
CREATE OR REPLACE FUNCTION pgq._cron_instant(l timestamp, tz text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT least(CASE WHEN (((l - interval '1 day') AT TIME ZONE tz) + interval '1 day') AT TIME ZONE tz = l
                      THEN ((l - interval '1 day') AT TIME ZONE tz) + interval '1 day' END,
                 CASE WHEN (l AT TIME ZONE tz) AT TIME ZONE tz = l THEN l AT TIME ZONE tz END)
$$;

CREATE OR REPLACE FUNCTION pgq.cron_next(cron text, after timestamptz, timezone text DEFAULT 'UTC')
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

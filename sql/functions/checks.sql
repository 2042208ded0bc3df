-- sql/functions/checks.sql: the argument checks every function shares: 22004 / 22023 naming the
-- argument.

-- What an interval argument or setting may be: a span of days and time, of one sign. An interval
-- that counts months ('3000000 mon -89999999 days' compares as 1 day, since a comparison counts a
-- month as 30 days, but adds 1.3 million days to a timestamp) or mixes the signs of its days and
-- its time ('1 day -23:59:59', 1 second by comparison, is -59:59 on a 23-hour day) does not do to
-- a timestamp what its comparison with a cap says; one without both does, give or take the hour a
-- daylight saving change adds to or takes from a day. One expression: inlined where it is used.
CREATE OR REPLACE FUNCTION pgq._is_span(interval) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT extract(year FROM $1) = 0 AND extract(month FROM $1) = 0
           AND extract(day FROM $1) * (extract(epoch FROM $1) - 86400 * extract(day FROM $1)) >= 0
$$;
COMMENT ON FUNCTION pgq._is_span(interval) IS
    'Whether an interval counts no months or years and its days and time have the same sign.';

-- Raises invalid_parameter_value (or null_value_not_allowed) naming the argument.
CREATE OR REPLACE FUNCTION pgq._bad_argument(argument text, problem text, hint text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    code text := CASE WHEN problem = 'must not be NULL' THEN '22004' ELSE '22023' END;
BEGIN
    IF hint IS NULL THEN
        RAISE EXCEPTION 'pgq: argument "%" %', argument, problem USING ERRCODE = code;
    END IF;
    RAISE EXCEPTION 'pgq: argument "%" %', argument, problem USING ERRCODE = code, HINT = hint;
END
$$;
COMMENT ON FUNCTION pgq._bad_argument(text, text, text) IS
    'Raises 22023 (or 22004 for NULL) with a message naming the argument.';

-- What a queue or kind name is: 1 to 128 characters from [A-Za-z0-9_.:/-], not starting with a
-- punctuation mark other than "_". NULL for NULL. A one-expression SQL function, so the planner
-- inlines it where it is used (no call on the hot path). The length is checked apart from the
-- pattern: a bounded repetition ({0,127}) made every match about 13 us instead of 1 us.
CREATE OR REPLACE FUNCTION pgq._is_name(text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT length($1) <= 128 AND $1 ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$' $$;

-- Validates a queue or kind name (pgq._is_name), naming the argument when it is not one.
CREATE OR REPLACE FUNCTION pgq._check_name(argument text, value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL');
    ELSIF NOT pgq._is_name(value) THEN
        PERFORM pgq._bad_argument(argument,
            format('is not a valid name: %s', left(quote_literal(value), 80)),
            'Names are 1 to 128 characters from A-Z a-z 0-9 _ . : / - and start with a letter, '
            'a digit or _.');
    END IF;
END
$$;

-- Validates an interval argument: a span (pgq._is_span), > 0 and at most max_value.
CREATE OR REPLACE FUNCTION pgq._check_interval(argument text, value interval, max_value interval)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL');
    END IF;
    PERFORM pgq._check_span(argument, value);
    IF value <= interval '0' OR value > max_value THEN
        PERFORM pgq._bad_argument(argument,
            format('must be greater than 0 and at most %s, got %s', max_value, value));
    END IF;
END
$$;

-- Refuses an interval that is not a span (pgq._is_span), naming the argument: 22023.
CREATE OR REPLACE FUNCTION pgq._check_span(argument text, value interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF extract(year FROM value) <> 0 OR extract(month FROM value) <> 0 THEN
        PERFORM pgq._bad_argument(argument, format('must not count months or years, got %s', value),
            'Months differ in length: give days (''30 days''), hours, minutes or seconds.');
    ELSIF NOT pgq._is_span(value) THEN
        PERFORM pgq._bad_argument(argument,
            format('must not mix a positive and a negative part, got %s', value),
            'Give one span, such as ''23:00:01'' instead of ''1 day -00:59:59''.');
    END IF;
END
$$;

-- The real size of a jsonb value in bytes: pg_column_size measures a compressed datum (a value
-- read from a table column, say) as stored, so 50 MB of repeat('x', ...) measured 0.6 MB. Only a
-- compressed value is decompressed to be measured (jsonb || '{}' returns the detoasted object);
-- any other is measured as it is, at no extra cost. One expression: inlined where it is used
-- (STABLE like pg_column_size: an IMMUTABLE wrapper of a STABLE function is not inlined, and its
-- call cost an enqueue 20 to 50 us).
CREATE OR REPLACE FUNCTION pgq._jsonb_size(jsonb) RETURNS integer
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN pg_column_compression($1) IS NULL THEN pg_column_size($1)
                ELSE pg_column_size($1 || '{}'::jsonb) END
$$;

-- Validates a payload: a JSON object of at most 1 MiB (its jsonb size, uncompressed).
CREATE OR REPLACE FUNCTION pgq._check_payload(argument text, value jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL', 'Pass ''{}'' for an empty payload.');
    ELSIF jsonb_typeof(value) <> 'object' THEN
        PERFORM pgq._bad_argument(argument,
            format('must be a JSON object, got %s', jsonb_typeof(value)),
            'Wrap the value: jsonb_build_object(''value'', ...).');
    ELSIF pgq._jsonb_size(value) > 1048576 THEN
        PERFORM pgq._bad_argument(argument,
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(value)),
            'Store large data in a table of your own and put its key in the payload.');
    END IF;
END
$$;

-- Validates the (id, attempt) pair an owner operation quotes. A NULL is a bug in the caller, not
-- lost ownership: it raises 22004 instead of answering "not yours" (a NULL attempt would otherwise
-- reach pgq._reject and fail on job_events.attempt NOT NULL with an unrelated 23502).
CREATE OR REPLACE FUNCTION pgq._check_fence(id bigint, attempt integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_fence.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    ELSIF _check_fence.attempt IS NULL THEN
        PERFORM pgq._bad_argument('attempt', 'must not be NULL', 'Quote the attempt pgq.claim returned.');
    END IF;
END
$$;

-- Validates a unique_key: 1 to 1024 bytes. Bytes, not characters: the key is in an index entry
-- with the queue's name (at most 128 bytes), and a B-tree entry holds at most 2704 bytes, so 1,024
-- four-byte characters (4,096 bytes) failed the insert with 54000 instead of a clear refusal.
CREATE OR REPLACE FUNCTION pgq._check_unique_key(unique_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF octet_length(unique_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM pgq._bad_argument('unique_key',
            format('must be 1 to 1024 bytes long (UTF-8), got %s bytes', octet_length(unique_key)),
            'Hash a longer key, e.g. md5(key).');
    END IF;
END
$$;

-- Validates a tag list: enqueue's tags (NULL or empty: none) or a tags filter (`filter`: NULL is
-- no filter, an empty one is refused), 22023 naming `argument` (tags) and the element.
CREATE OR REPLACE FUNCTION pgq._check_tags(argument text, tags text[], filter boolean DEFAULT false)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    bad record;
BEGIN
    IF tags IS NULL THEN
        RETURN;
    END IF;
    IF array_ndims(tags) > 1 THEN
        PERFORM pgq._bad_argument(argument, format('must be a one-dimensional array, got %s dimensions',
                                                   array_ndims(tags)));
    ELSIF cardinality(tags) = 0 AND filter THEN
        PERFORM pgq._bad_argument(argument, 'must name at least one tag', 'Pass NULL for no tags filter.');
    ELSIF cardinality(tags) > 16 THEN
        PERFORM pgq._bad_argument(argument, format('must hold at most 16 tags, got %s', cardinality(tags)));
    END IF;
    SELECT t.tag, t.n INTO bad FROM unnest(tags) WITH ORDINALITY AS t(tag, n)
    WHERE t.tag IS NULL OR length(t.tag) NOT BETWEEN 1 AND 64
    ORDER BY t.n LIMIT 1;
    IF FOUND AND bad.tag IS NULL THEN
        PERFORM pgq._bad_argument(argument, format('must not hold NULL (%s[%s])', argument, bad.n));
    ELSIF FOUND THEN
        PERFORM pgq._bad_argument(argument, format('must hold tags of 1 to 64 characters, %s[%s] has %s',
                                                   argument, bad.n, length(bad.tag)));
    END IF;
END
$$;

-- Validates a concurrency key (a job's, or pgq.set_key_limit's): NULL or 1 to 256 characters.
CREATE OR REPLACE FUNCTION pgq._check_concurrency_key(argument text, value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF length(_check_concurrency_key.value) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument(_check_concurrency_key.argument, 'must be 1 to 256 characters long');
    END IF;
END
$$;

-- 0032: the archive's tags (issue 40). The functions are the function source's
-- (sql/functions/observe.sql: pgq.list_jobs, whose tags filter now reads the archive too); this
-- versions what it reads:
--
-- * archive_tags_idx: the archived jobs holding tags, by tag (GIN), as jobs_tags_idx is for
--   pgq.jobs. A partitioned index: each day partition has its own, today's and those the sweep
--   creates later included. Jobs without tags have no entry (a queue without tags pays nothing for it
--   when the sweep moves its jobs).
--
-- The index is built on each existing day partition under a SHARE lock on it (the sweep's moves
-- into that day and its drop wait for it; the lock_timeout below bounds how long this waits for
-- them); reads of the archive go on. The function source of the previous version, in place until
-- the new one is applied (they commit apart), does not read it.
SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS archive_tags_idx ON pgq.archive USING gin (tags) WHERE tags IS NOT NULL;
COMMENT ON INDEX pgq.archive_tags_idx IS
    'The archived jobs holding tags, by tag: pgq.list_jobs'' tags filter in the archive.';

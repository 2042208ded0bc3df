-- 0025: tags and uniqueness for a period (issue 41). The functions are the function source's
-- (sql/functions/enqueue.sql says how a tag list is checked and how unique_for answers with a job
-- of the key that finished done within it; admin.sql and observe.sql how the tags filter reads);
-- this versions what they read:
--
-- * pgq.jobs gains tags (text[]): enqueue's tags, NULL for a job without any. NULL: no table
--   rewrite.
-- * Two partial indexes on pgq.jobs, each over the jobs that use one of these only, so that a
--   queue using neither pays nothing on its writes: the tagged jobs (GIN on tags: the tags filter
--   of pgq.list_jobs, retry_jobs, cancel_jobs and delete_jobs, `tags @> filter`), and the done jobs
--   with a unique_key by (queue, unique_key, finished_at) (enqueue's unique_for: one probe for the
--   newest done job of a key). CREATE INDEX holds SHARE on pgq.jobs while it reads the table (about
--   a second per million rows): workers' writes wait that long. To build them without that wait
--   first, add the column and run the CREATE INDEX CONCURRENTLY IF NOT EXISTS statements of
--   docs/upgrading.md; this migration then finds both (IF NOT EXISTS).
--
-- pgq.jobs is locked against its readers for the ALTER only (ACCESS EXCLUSIVE, an instant, after
-- the transactions that use it; a session that keeps one open makes the migration give up after its
-- lock_timeout, changing nothing: run it again).
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.jobs ADD COLUMN IF NOT EXISTS tags text[];
COMMENT ON COLUMN pgq.jobs.tags IS
    'Enqueue''s tags (1 to 64 characters each, at most 16, no NULL); NULL: none. The tags filter of '
    'pgq.list_jobs, retry_jobs, cancel_jobs and delete_jobs finds the jobs holding all of its tags.';

CREATE INDEX IF NOT EXISTS jobs_tags_idx ON pgq.jobs USING gin (tags) WHERE tags IS NOT NULL;
COMMENT ON INDEX pgq.jobs_tags_idx IS
    'The tagged jobs by tag (tags @> filter): the tags filter of the list and bulk calls. A job '
    'without tags has no entry.';
CREATE INDEX IF NOT EXISTS jobs_unique_done_idx ON pgq.jobs (queue, unique_key, finished_at)
    WHERE unique_key IS NOT NULL AND state = 'done';
COMMENT ON INDEX pgq.jobs_unique_done_idx IS
    'The done jobs with a unique_key, by queue, key and end: enqueue''s unique_for reads the newest '
    'of a key here (one probe).';

-- 0024: a completion records its own end (issue 38: the worker's speed). The trigger jobs_ended ran
-- pgq._job_ended once per row that a completion moved to done: a PL/pgSQL call, its INSERT and its
-- probe per job, about a fifth of the server's work for a job completed by pgq.complete_many.
-- pgq.complete and pgq.complete_many now record the ends they make themselves, a statement for a
-- whole batch (sql/functions/ended.sql, pgq._completions_ended), and the trigger leaves those rows
-- to them.
--
-- Only to them: the trigger must go on recording the completions of the previous release's
-- functions, which leave their ends to it. They run until the function source is installed, after
-- the migrations, in a transaction of its own, and a call that read its body just before that
-- commit may run its UPDATE just after it, with the new catalog. So the WHEN asks the row: this
-- release's completions write their own transaction's id into the new column ends_recorded_by in
-- the UPDATE that ends the job; the previous release's do not (NULL, or the id of an earlier
-- transaction that completed the job before a retry). No caller can write a job's row, and no
-- session setting is read: the trigger leaves an end alone only when the statement that made it
-- is one of this release's completions, in this transaction.
--
-- ADD COLUMN without a default changes no row (the catalog only): ACCESS EXCLUSIVE on pgq.jobs for
-- an instant, after the transactions that hold it (lock_timeout below). The trigger is replaced in
-- place (CREATE OR REPLACE TRIGGER). pgq.turns gets no 'count' mark from this release's
-- pgq.complete_many (the trigger never sees its ends), only from the previous release's.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.jobs ADD COLUMN IF NOT EXISTS ends_recorded_by xid8;
COMMENT ON COLUMN pgq.jobs.ends_recorded_by IS
    'The transaction whose pgq.complete or pgq.complete_many ended the job and recorded the end '
    'itself (the trigger jobs_ended leaves that end alone); NULL when no completion of this kind has.';

CREATE OR REPLACE TRIGGER jobs_ended
    AFTER UPDATE OF state ON pgq.jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state
          AND (NEW.last_event <> 'completed' OR NEW.ends_recorded_by IS NULL
               OR NEW.ends_recorded_by <> pg_current_xact_id()))
    EXECUTE FUNCTION pgq._job_ended();

COMMENT ON TABLE pgq.turns IS
    'Rows pgq''s calls take turns on or leave for their own triggers, in place of advisory locks '
    '(which any login may take): ''fold'' (pgq._fold_finished); ''reject <job> <login>'' while a '
    'rejected call records itself (pgq._reject); ''count <xid> <depth>'' while the previous '
    'release''s pgq.complete_many (a call in flight when this release''s functions were installed) '
    'ends batch members it counts itself. The last two are deleted by the call that inserts them.';

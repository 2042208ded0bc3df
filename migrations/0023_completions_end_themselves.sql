-- 0023: a completion records its own end (issue 38: the worker's speed). The trigger jobs_ended ran
-- pgq._job_ended once per row that a completion moved to done: a PL/pgSQL call, its INSERT and its
-- probe per job, about a fifth of the server's work for a job completed by pgq.complete_many.
-- pgq.complete and pgq.complete_many now record the ends they make themselves, a statement for a
-- whole batch (sql/functions/ended.sql, pgq._completions_ended), and the trigger leaves those rows
-- (last_event 'completed') to them.
--
-- Only to them: the trigger must go on recording the completions of the previous release's
-- functions, which leave their ends to it. They run until the function source is installed, after
-- the migrations, in a transaction of its own, and a call that read its body just before that
-- commit may plan its UPDATE just after it, with the new catalog. So the WHEN asks the statement
-- itself: this release's pgq.complete and pgq.complete_many set pgq.completion_records_ends to
-- 'on' before their UPDATE (whatever the caller set), the previous release's do not. It also asks
-- pgq.version() (an IMMUTABLE SQL function, folded into a constant once per statement: nothing
-- per row), so that until this release's source is installed (version '23' or later) no caller can
-- name the setting to have the trigger leave an end it must record. No completion is left
-- unrecorded, or recorded twice, whichever functions run while the migration and the source are
-- installed.
--
-- The trigger is replaced in place (CREATE OR REPLACE TRIGGER: SHARE ROW EXCLUSIVE on pgq.jobs for
-- an instant, after the transactions that write it; not against its readers). pgq.turns gets no
-- 'count' mark from this release's pgq.complete_many (the trigger never sees its ends), only from
-- the previous release's: its comment says so.
SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE TRIGGER jobs_ended
    AFTER UPDATE OF state ON pgq.jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state
          AND (NEW.last_event <> 'completed' OR pgq.version()::integer < 23
               OR current_setting('pgq.completion_records_ends', true) IS DISTINCT FROM 'on'))
    EXECUTE FUNCTION pgq._job_ended();

COMMENT ON TABLE pgq.turns IS
    'Rows pgq''s calls take turns on or leave for their own triggers, in place of advisory locks '
    '(which any login may take): ''fold'' (pgq._fold_finished); ''reject <job> <login>'' while a '
    'rejected call records itself (pgq._reject); ''count <xid> <depth>'' while the previous '
    'release''s pgq.complete_many (a call in flight when this release''s functions were installed) '
    'ends batch members it counts itself. The last two are deleted by the call that inserts them.';

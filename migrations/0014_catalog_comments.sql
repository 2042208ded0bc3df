-- 0014: the first migration of the function source. From here on a migration holds only what is
-- versioned (tables, types, columns, indexes, constraints, data, and the DROP of a function whose
-- return type or parameter names change); every function is written once, in sql/functions/, and
-- every apply installs all of them after the migrations (pgq_thin.sqlsource). The function source
-- of this release defines pgq.version() as '14'.
--
-- What this one versions: the reasons for pgq's indexes and two of its tables, which the
-- hand-written schema.sql carried as comments and the generated one reads from the catalog.
-- COMMENT takes no lock that waits for the workers (SHARE UPDATE EXCLUSIVE on an index: not in
-- conflict with their reads and writes); the lock_timeout bounds any wait all the same.
SET LOCAL lock_timeout = '5s';

COMMENT ON INDEX pgq.tenants_vtime_idx IS
    'A fair queue''s claim walks its tenants by virtual time (pgq._fair_pick), reading only as many '
    'as it serves, however many tenants have due jobs.';
COMMENT ON INDEX pgq.queues_schedule_due_idx IS
    'A claim of every queue finds the queues with a due schedule here, not by reading every queue.';
COMMENT ON INDEX pgq.jobs_ready_idx IS
    'The claim walks this index in the total order priority DESC, run_at, id, one queue at a time. '
    'The predicate is repeated word for word in the claim so the planner can use it.';
COMMENT ON INDEX pgq.jobs_tenant_ready_idx IS
    'Fair mode walks each tenant''s claimable jobs in the total order. Only jobs with a tenant pay '
    'for this index; a fair queue stores '''' for a job enqueued without one.';
COMMENT ON INDEX pgq.jobs_lease_idx IS
    'Expired-lease recovery (sweep, and the probe in claim) reads running jobs by lease_until. The '
    'predicate selects exactly the running jobs (jobs_lease_check) but is not spelled '
    'state = ''running'': the owner operations'' fence (id AND attempt AND state = ''running'') would '
    'then imply it, and a partial index whose predicate a query implies may be read whole. With '
    'statistics that say few jobs are running, the planner did exactly that: every complete, renew '
    'or fail read all running jobs instead of one primary-key entry.';
COMMENT ON INDEX pgq.jobs_unique_key_idx IS
    'Deduplication: one live job per (queue, unique_key), race-free. outcome_unknown counts as live: '
    'its effect may have happened, which is exactly when a duplicate would hurt; so does waiting '
    '(enqueued with depends_on, it will run).';
COMMENT ON INDEX pgq.schedules_due_idx IS
    'The sweep''s probe and the firing read the enabled schedules by next_run_at.';
COMMENT ON INDEX pgq.schedules_queue_idx IS
    'queues.next_schedule_at is kept from the earliest enabled schedule of each queue, read here.';
COMMENT ON INDEX pgq.jobs_kind_ready_idx IS
    'A claim that names its kinds walks each (queue, kind)''s claimable jobs in the total order: jobs '
    'of other kinds ahead of them are never read. Only pending jobs are in it (an enqueue, a retry or '
    'a snooze writes an entry; a claim and a completion do not).';
COMMENT ON INDEX pgq.jobs_list_idx IS
    'pgq.list_jobs pages newest first by id within each queue and state. Running jobs are not in it '
    '(a claim writes no entry here; list_jobs reads the few running jobs through jobs_lease_idx). The '
    'key is -id, not id: ordered by -id, a page can only come from this index, where ordered by id '
    'the generic plan could walk jobs_pkey backwards and filter, reading every newer job of other '
    'queues and states (all the finished history) to find a page of a rare one.';
COMMENT ON INDEX pgq.queues_restricted_idx IS
    'pgq.list_jobs finds the queues with grants (few, if any) without reading the others.';
COMMENT ON INDEX pgq.jobs_finished_idx IS
    'Pruning finds finished rows by age.';
COMMENT ON INDEX pgq.key_rates_tat_idx IS
    'The keys without a token now (tat furthest ahead), read by each claim of a key-rate-limited queue.';
COMMENT ON INDEX pgq.job_dependencies_job_idx IS
    'A waiting job that ends (pgq.cancel, or cancelled with its dependency) deletes its own links.';

COMMENT ON TABLE pgq.finished_deltas IS
    'One row per transition into a terminal state, written by the trigger jobs_count_finished and '
    'folded into pgq.finished_counts (and deleted) by pgq._fold_finished. It has no key (an index '
    'would cost every completion); REPLICA IDENTITY FULL lets the fold delete its rows where a '
    'publication FOR ALL TABLES includes it.';
COMMENT ON TABLE pgq.job_dependencies IS
    'The open dependencies of waiting jobs: job_id waits for depends_on (pgq.enqueue''s depends_on); '
    'a row goes when either job ends. No foreign key: it would put a trigger on every delete of '
    'pgq.jobs.';

"""Bad arguments: each gets its documented SQLSTATE (22004 NULL, 22023 invalid value, P0002 unknown
id for an admin call, 55000 wrong state) with a message naming the argument, and nothing is
written. Owner operations answer "not yours" for ids and attempts that do not match, never raise.
Generated inputs (Hypothesis) cover names, payloads, numbers and intervals."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from sqlfixtures import dsn, module_dsn, row_counts, running_job  # noqa: F401  (one database per module, emptied per test)
from sqlhelpers import job, one

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
HYPOTHESIS = settings(max_examples=50, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])

BAD_NAMES = ["", "a'b", "a;b", "--a", "-a", ".a", "/a", "a b", " a", "a\nb", "a\tb", "ä", "名前",
             "a" * 129, "Robert'); DROP TABLE pgq.jobs;--", 'a"b', "a\\b", "a%s", "$1", "😀"]
GOOD_NAMES = ["a", "_", "0", "a" * 128, "a--b", "emails.send", "tenant:42/reports-v2", "A_b.c:d/e-f"]

# (label, SQL, params, SQLSTATE, the argument the message must name). $JOB is replaced with the
# id of a running job (attempt 1) that every test sets up first.
CASES: list[tuple[str, str, Any, str, str]] = [
    # enqueue
    ("enqueue queue NULL", "SELECT pgq.enqueue(NULL, 'k')", None, "22004", "queue"),
    ("enqueue kind NULL", "SELECT pgq.enqueue('q', NULL)", None, "22004", "kind"),
    ("enqueue payload NULL", "SELECT pgq.enqueue('q', 'k', NULL)", None, "22004", "payload"),
    ("enqueue payload array", "SELECT pgq.enqueue('q', 'k', '[1, 2]')", None, "22023", "payload"),
    ("enqueue payload string", "SELECT pgq.enqueue('q', 'k', '\"s\"')", None, "22023", "payload"),
    ("enqueue payload number", "SELECT pgq.enqueue('q', 'k', '1')", None, "22023", "payload"),
    ("enqueue payload json null", "SELECT pgq.enqueue('q', 'k', 'null')", None, "22023", "payload"),
    ("enqueue payload over 1 MiB",
     "SELECT pgq.enqueue('q', 'k', jsonb_build_object('x', repeat('a', 1048576)))", None, "22023", "payload"),
    ("enqueue run_at NULL", "SELECT pgq.enqueue('q', 'k', run_at => NULL)", None, "22004", "run_at"),
    ("enqueue run_at infinity", "SELECT pgq.enqueue('q', 'k', run_at => 'infinity')", None, "22023", "run_at"),
    ("enqueue run_at -infinity", "SELECT pgq.enqueue('q', 'k', run_at => '-infinity')", None, "22023", "run_at"),
    ("enqueue priority NULL", "SELECT pgq.enqueue('q', 'k', priority => NULL)", None, "22004", "priority"),
    ("enqueue priority 1001", "SELECT pgq.enqueue('q', 'k', priority => 1001)", None, "22023", "priority"),
    ("enqueue priority -1001", "SELECT pgq.enqueue('q', 'k', priority => -1001)", None, "22023", "priority"),
    ("enqueue priority max int", "SELECT pgq.enqueue('q', 'k', priority => 2147483647)", None, "22023", "priority"),
    ("enqueue max_attempts 0", "SELECT pgq.enqueue('q', 'k', max_attempts => 0)", None, "22023", "max_attempts"),
    ("enqueue max_attempts -1", "SELECT pgq.enqueue('q', 'k', max_attempts => -1)", None, "22023", "max_attempts"),
    ("enqueue max_attempts 10001", "SELECT pgq.enqueue('q', 'k', max_attempts => 10001)", None, "22023", "max_attempts"),
    ("enqueue unique_key empty", "SELECT pgq.enqueue('q', 'k', unique_key => '')", None, "22023", "unique_key"),
    ("enqueue unique_key too long", "SELECT pgq.enqueue('q', 'k', unique_key => repeat('u', 1025))", None, "22023", "unique_key"),
    ("enqueue tenant empty", "SELECT pgq.enqueue('q', 'k', tenant => '')", None, "22023", "tenant"),
    ("enqueue tenant too long", "SELECT pgq.enqueue('q', 'k', tenant => repeat('t', 257))", None, "22023", "tenant"),
    # enqueue_many
    ("enqueue_many payloads NULL", "SELECT pgq.enqueue_many('q', 'k', NULL)", None, "22004", "payloads"),
    ("enqueue_many NULL element", "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', NULL]::jsonb[])", None, "22004", "payloads[2]"),
    ("enqueue_many non-object element",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', '{}', '[]']::jsonb[])", None, "22023", "payloads[3]"),
    ("enqueue_many oversized element",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY[jsonb_build_object('x', repeat('a', 1048576))])", None, "22023", "payloads[1]"),
    ("enqueue_many queue NULL", "SELECT pgq.enqueue_many(NULL, 'k', ARRAY['{}']::jsonb[])", None, "22004", "queue"),
    ("enqueue_many kind bad", "SELECT pgq.enqueue_many('q', 'a;b', ARRAY['{}']::jsonb[])", None, "22023", "kind"),
    ("enqueue_many run_at infinity",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], run_at => 'infinity')", None, "22023", "run_at"),
    ("enqueue_many priority NULL",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], priority => NULL)", None, "22004", "priority"),
    ("enqueue_many max_attempts 0",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], max_attempts => 0)", None, "22023", "max_attempts"),
    ("enqueue_many tenant empty",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], tenant => '')", None, "22023", "tenant"),
    # claim
    ("claim worker NULL", "SELECT * FROM pgq.claim(NULL)", None, "22004", "worker"),
    ("claim worker empty", "SELECT * FROM pgq.claim('')", None, "22023", "worker"),
    ("claim worker too long", "SELECT * FROM pgq.claim(repeat('w', 257))", None, "22023", "worker"),
    ("claim batch NULL", "SELECT * FROM pgq.claim('w', batch => NULL)", None, "22004", "batch"),
    ("claim batch 0", "SELECT * FROM pgq.claim('w', batch => 0)", None, "22023", "batch"),
    ("claim batch 1001", "SELECT * FROM pgq.claim('w', batch => 1001)", None, "22023", "batch"),
    ("claim batch negative", "SELECT * FROM pgq.claim('w', batch => -1)", None, "22023", "batch"),
    ("claim lease zero", "SELECT * FROM pgq.claim('w', lease => '0')", None, "22023", "lease"),
    ("claim lease negative", "SELECT * FROM pgq.claim('w', lease => '-1 second')", None, "22023", "lease"),
    ("claim lease over a day", "SELECT * FROM pgq.claim('w', lease => '1 day 1 second')", None, "22023", "lease"),
    ("claim lease huge", "SELECT * FROM pgq.claim('w', lease => '100000 years')", None, "22023", "lease"),
    ("claim queues empty", "SELECT * FROM pgq.claim('w', '{}')", None, "22023", "queues"),
    ("claim queues with NULL", "SELECT * FROM pgq.claim('w', ARRAY['q', NULL])", None, "22023", "queues"),
    ("claim queues bad name", "SELECT * FROM pgq.claim('w', ARRAY['q', 'x;--'])", None, "22023", "queues[2]"),
    # renew
    ("renew id NULL", "SELECT pgq.renew(NULL, 1)", None, "22004", "id"),
    ("renew attempt NULL", "SELECT pgq.renew($JOB, NULL)", None, "22004", "attempt"),
    ("renew lease zero", "SELECT pgq.renew($JOB, 1, '0')", None, "22023", "lease"),
    ("renew lease negative", "SELECT pgq.renew($JOB, 1, '-1 hour')", None, "22023", "lease"),
    ("renew lease over a day", "SELECT pgq.renew($JOB, 1, '2 days')", None, "22023", "lease"),
    # complete, complete_many
    ("complete id NULL", "SELECT pgq.complete(NULL, 1)", None, "22004", "id"),
    ("complete attempt NULL", "SELECT pgq.complete($JOB, NULL)", None, "22004", "attempt"),
    ("complete_many ids NULL", "SELECT pgq.complete_many(NULL, '{1}')", None, "22004", "ids"),
    ("complete_many attempts NULL", "SELECT pgq.complete_many(ARRAY[$JOB]::bigint[], NULL)", None, "22004", "attempts"),
    ("complete_many mismatched", "SELECT pgq.complete_many(ARRAY[$JOB]::bigint[], '{1, 1}')", None, "22023", "attempts"),
    ("complete_many more ids", "SELECT pgq.complete_many(ARRAY[$JOB, 1]::bigint[], '{1}')", None, "22023", "attempts"),
    ("complete_many NULL id", "SELECT pgq.complete_many(ARRAY[$JOB, NULL]::bigint[], '{1, 1}')", None, "22023", "ids"),
    ("complete_many NULL attempt", "SELECT pgq.complete_many(ARRAY[$JOB]::bigint[], '{NULL}')", None, "22023", "ids"),
    # complete_and_claim: complete_many's checks, then claim's
    ("complete_and_claim ids NULL", "SELECT * FROM pgq.complete_and_claim(NULL, '{1}', 'w')", None, "22004", "ids"),
    ("complete_and_claim mismatched", "SELECT * FROM pgq.complete_and_claim(ARRAY[$JOB]::bigint[], '{1, 1}', 'w')", None, "22023", "attempts"),
    ("complete_and_claim worker NULL", "SELECT * FROM pgq.complete_and_claim('{}', '{}', NULL)", None, "22004", "worker"),
    ("complete_and_claim batch zero", "SELECT * FROM pgq.complete_and_claim('{}', '{}', 'w', batch => 0)", None, "22023", "batch"),
    ("complete_and_claim queues bad name", "SELECT * FROM pgq.complete_and_claim('{}', '{}', 'w', ARRAY['x;--'])", None, "22023", "queues[1]"),
    # fail
    ("fail id NULL", "SELECT pgq.fail(NULL, 1, 'e')", None, "22004", "id"),
    ("fail attempt NULL", "SELECT pgq.fail($JOB, NULL, 'e')", None, "22004", "attempt"),
    ("fail error NULL", "SELECT pgq.fail($JOB, 1, NULL)", None, "22004", "error"),
    ("fail retryable NULL", "SELECT pgq.fail($JOB, 1, 'e', retryable => NULL)", None, "22004", "retryable"),
    ("fail retry_in zero", "SELECT pgq.fail($JOB, 1, 'e', '0')", None, "22023", "retry_in"),
    ("fail retry_in negative", "SELECT pgq.fail($JOB, 1, 'e', '-1 minute')", None, "22023", "retry_in"),
    ("fail retry_in over a year", "SELECT pgq.fail($JOB, 1, 'e', '366 days')", None, "22023", "retry_in"),
    ("fail retry_in huge", "SELECT pgq.fail($JOB, 1, 'e', '178000000 years')", None, "22023", "retry_in"),
    # release, snooze, mark_unknown
    ("release id NULL", "SELECT pgq.release(NULL, 1)", None, "22004", "id"),
    ("release attempt NULL", "SELECT pgq.release($JOB, NULL)", None, "22004", "attempt"),
    ("snooze id NULL", "SELECT pgq.snooze(NULL, 1, '1 minute')", None, "22004", "id"),
    ("snooze attempt NULL", "SELECT pgq.snooze($JOB, NULL, '1 minute')", None, "22004", "attempt"),
    ("snooze delay NULL", "SELECT pgq.snooze($JOB, 1, NULL)", None, "22004", "delay"),
    ("snooze delay zero", "SELECT pgq.snooze($JOB, 1, '0')", None, "22023", "delay"),
    ("snooze delay negative", "SELECT pgq.snooze($JOB, 1, '-5 minutes')", None, "22023", "delay"),
    ("snooze delay over a year", "SELECT pgq.snooze($JOB, 1, '366 days')", None, "22023", "delay"),
    ("mark_unknown id NULL", "SELECT pgq.mark_unknown(NULL, 1, 'n')", None, "22004", "id"),
    ("mark_unknown attempt NULL", "SELECT pgq.mark_unknown($JOB, NULL, 'n')", None, "22004", "attempt"),
    ("mark_unknown note NULL", "SELECT pgq.mark_unknown($JOB, 1, NULL)", None, "22004", "note"),
    # sweep
    ("sweep max_jobs NULL", "SELECT pgq.sweep(NULL)", None, "22004", "max_jobs"),
    ("sweep max_jobs 0", "SELECT pgq.sweep(0)", None, "22023", "max_jobs"),
    ("sweep max_jobs too many", "SELECT pgq.sweep(100001)", None, "22023", "max_jobs"),
    ("settle_dependencies max_jobs NULL", "SELECT pgq.settle_dependencies(NULL)", None, "22004", "max_jobs"),
    ("settle_dependencies max_jobs 0", "SELECT pgq.settle_dependencies(0)", None, "22023", "max_jobs"),
    # admin
    ("update_job id NULL", "SELECT pgq.update_job(NULL, '{}')", None, "22004", "id"),
    ("update_job nothing to change", "SELECT pgq.update_job($JOB)", None, "22023", "payload"),
    ("update_job payload array", "SELECT pgq.update_job($JOB, '[1]')", None, "22023", "payload"),
    ("update_job payload json null", "SELECT pgq.update_job($JOB, 'null')", None, "22023", "payload"),
    ("update_job priority 1001", "SELECT pgq.update_job($JOB, priority => 1001)", None, "22023", "priority"),
    ("update_job run_at infinity", "SELECT pgq.update_job($JOB, run_at => 'infinity')", None, "22023", "run_at"),
    ("update_job meta array", "SELECT pgq.update_job($JOB, meta => '[]')", None, "22023", "meta"),
    ("update_job unknown id", "SELECT pgq.update_job(424242, '{}')", None, "P0002", "424242"),
    ("delete_jobs queue NULL", "SELECT pgq.delete_jobs(NULL, 'done')", None, "22004", "queue"),
    ("delete_jobs queue bad", "SELECT pgq.delete_jobs('a b', 'done')", None, "22023", "queue"),
    ("delete_jobs state NULL", "SELECT pgq.delete_jobs('q', NULL)", None, "22004", "state"),
    ("delete_jobs state running", "SELECT pgq.delete_jobs('q', 'running')", None, "22023", "state"),
    ("delete_jobs state outcome_unknown", "SELECT pgq.delete_jobs('q', 'outcome_unknown')", None, "22023", "state"),
    ("delete_jobs kind bad", "SELECT pgq.delete_jobs('q', 'done', '-k')", None, "22023", "kind"),
    ("delete_jobs limit_rows 0", "SELECT pgq.delete_jobs('q', 'done', limit_rows => 0)", None, "22023", "limit_rows"),
    ("delete_jobs limit_rows NULL", "SELECT pgq.delete_jobs('q', 'done', limit_rows => NULL)", None, "22004",
     "limit_rows"),
    # Issue 41: tags (enqueue's, and the tags filters) and unique_for.
    ("enqueue tags empty tag", "SELECT pgq.enqueue('q', 'k', tags => '{a,\"\"}')", None, "22023", "tags"),
    ("enqueue tags too long", "SELECT pgq.enqueue('q', 'k', tags => ARRAY[repeat('t', 65)])", None, "22023", "tags"),
    ("enqueue tags too many", "SELECT pgq.enqueue('q', 'k', tags => ARRAY(SELECT 't' || g FROM generate_series(1, 17) g))",
     None, "22023", "tags"),
    ("enqueue tags NULL element", "SELECT pgq.enqueue('q', 'k', tags => ARRAY['a', NULL])", None, "22023", "tags"),
    ("enqueue tags two dimensions", "SELECT pgq.enqueue('q', 'k', tags => '{{a},{b}}')", None, "22023", "tags"),
    ("enqueue_many tags NULL element", "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}'::jsonb], tags => ARRAY[NULL::text])",
     None, "22023", "tags"),
    ("list_jobs tags empty filter", "SELECT pgq.list_jobs(tags => '{}')", None, "22023", "tags"),
    ("list_jobs tags empty tag", "SELECT pgq.list_jobs(tags => '{\"\"}')", None, "22023", "tags"),
    ("retry_jobs tags NULL element", "SELECT pgq.retry_jobs('q', 'failed', tags => ARRAY[NULL::text])", None, "22023",
     "tags"),
    ("cancel_jobs tags too long", "SELECT pgq.cancel_jobs('q', 'pending', tags => ARRAY[repeat('t', 65)])", None,
     "22023", "tags"),
    ("delete_jobs tags empty filter", "SELECT pgq.delete_jobs('q', 'done', tags => '{}')", None, "22023", "tags"),
    ("enqueue unique_for without key", "SELECT pgq.enqueue('q', 'k', unique_for => '1 hour')", None, "22023",
     "unique_for"),
    ("enqueue unique_for 0", "SELECT pgq.enqueue('q', 'k', unique_key => 'u', unique_for => '0')", None, "22023",
     "unique_for"),
    ("enqueue unique_for negative", "SELECT pgq.enqueue('q', 'k', unique_key => 'u', unique_for => '-1 hour')", None,
     "22023", "unique_for"),
    ("enqueue unique_for months", "SELECT pgq.enqueue('q', 'k', unique_key => 'u', unique_for => '1 month')", None,
     "22023", "unique_for"),
    ("enqueue_many unique_for without keys", "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}'::jsonb], unique_for => '1 hour')",
     None, "22023", "unique_for"),
    ("cancel id NULL", "SELECT pgq.cancel(NULL)", None, "22004", "id"),
    ("cancel unknown id", "SELECT pgq.cancel(424242)", None, "P0002", "424242"),
    ("cancel negative id", "SELECT pgq.cancel(-1)", None, "P0002", "-1"),
    ("retry id NULL", "SELECT pgq.retry(NULL)", None, "22004", "id"),
    ("retry unknown id", "SELECT pgq.retry(424242)", None, "P0002", "424242"),
    ("retry running job", "SELECT pgq.retry($JOB)", None, "55000", "running"),
    ("resolve id NULL", "SELECT pgq.resolve(NULL, 'done')", None, "22004", "id"),
    ("resolve state NULL", "SELECT pgq.resolve($JOB, NULL)", None, "22004", "state"),
    ("resolve state running", "SELECT pgq.resolve($JOB, 'running')", None, "22023", "state"),
    ("resolve state bogus", "SELECT pgq.resolve($JOB, 'x''; DROP TABLE pgq.jobs; --')", None, "22023", "state"),
    ("resolve unknown id", "SELECT pgq.resolve(424242, 'done')", None, "P0002", "424242"),
    ("resolve running job", "SELECT pgq.resolve($JOB, 'done')", None, "55000", "running"),
    ("prune older_than negative", "SELECT pgq.prune('-1 day')", None, "22023", "older_than"),
    ("prune older_than huge", "SELECT pgq.prune('300000 years')", None, "22023", "older_than"),
    ("prune max_jobs NULL", "SELECT pgq.prune(NULL, NULL)", None, "22004", "max_jobs"),
    ("prune max_jobs 0", "SELECT pgq.prune(max_jobs => 0)", None, "22023", "max_jobs"),
    ("prune max_jobs too many", "SELECT pgq.prune(max_jobs => 1000001)", None, "22023", "max_jobs"),
    ("pause NULL", "SELECT pgq.pause(NULL)", None, "22004", "queue"),
    ("pause bad name", "SELECT pgq.pause('a;b')", None, "22023", "queue"),
    ("resume NULL", "SELECT pgq.resume(NULL)", None, "22004", "queue"),
    ("resume bad name", "SELECT pgq.resume('-x')", None, "22023", "queue"),
    ("pause bad kind", "SELECT pgq.pause('q', kind => 'a;b')", None, "22023", "kind"),
    ("resume bad kind", "SELECT pgq.resume('q', kind => '')", None, "22023", "kind"),
    ("configure_queue NULL", "SELECT pgq.configure_queue(NULL)", None, "22004", "queue"),
    ("configure_queue bad name", "SELECT pgq.configure_queue('a''b')", None, "22023", "queue"),
    ("configure_queue lease zero", "SELECT pgq.configure_queue('new', lease => '0')", None, "22023", "lease"),
    ("configure_queue lease 2 days", "SELECT pgq.configure_queue('q', lease => '2 days')", None, "22023", "lease"),
    ("configure_queue max_attempts 0", "SELECT pgq.configure_queue('new', max_attempts => 0)", None, "22023", "max_attempts"),
    ("configure_queue max_attempts 10001", "SELECT pgq.configure_queue('q', max_attempts => 10001)", None, "22023", "max_attempts"),
    ("configure_queue backoff_base zero", "SELECT pgq.configure_queue('q', backoff_base => '0')", None, "22023", "backoff_base"),
    ("configure_queue backoff_base huge", "SELECT pgq.configure_queue('q', backoff_base => '366 days')", None, "22023", "backoff_base"),
    ("configure_queue backoff_cap negative", "SELECT pgq.configure_queue('q', backoff_cap => '-1 hour')", None, "22023", "backoff_cap"),
    ("configure_queue cap below base", "SELECT pgq.configure_queue('q', backoff_base => '1 hour', backoff_cap => '1 minute')", None, "22023", "backoff_cap"),
    ("configure_queue retention negative", "SELECT pgq.configure_queue('q', retention => '-1 day')", None, "22023", "retention"),
    ("configure_queue retention huge", "SELECT pgq.configure_queue('new', retention => '3651 days')", None, "22023", "retention"),
    # priority aging (issue 41)
    ("configure_queue max_wait negative", "SELECT pgq.configure_queue('new', max_wait => '-1 second')", None, "22023",
     "max_wait"),
    ("configure_queue max_wait huge", "SELECT pgq.configure_queue('q', max_wait => '366 days')", None, "22023", "max_wait"),
    ("configure_queue max_wait fair", "SELECT pgq.configure_queue('new', fair => true, max_wait => '1 minute')", None,
     "22023", "max_wait"),
    # sequences (issue 41)
    ("configure_queue key_sequence unknown", "SELECT pgq.configure_queue('new', key_sequence => 'stop')", None, "22023",
     "key_sequence"),
    ("configure_queue key_sequence fair", "SELECT pgq.configure_queue('q', fair => true, key_sequence => 'halt')", None,
     "22023", "key_sequence"),
    ("configure_queue key_sequence key_max_running 2",
     "SELECT pgq.configure_queue('q', key_max_running => 2, key_sequence => 'continue')", None, "22023", "key_sequence"),
    ("configure_queue key_sequence max_wait", "SELECT pgq.configure_queue('new', key_sequence => 'halt', max_wait => '1 minute')",
     None, "22023", "max_wait"),
    # workflows (issue 26)
    ("enqueue dependency_mode NULL", "SELECT pgq.enqueue('q', 'k', dependency_mode => NULL)", None, "22004",
     "dependency_mode"),
    ("enqueue dependency_mode any", "SELECT pgq.enqueue('q', 'k', dependency_mode => 'any')", None, "22023",
     "dependency_mode"),
    ("enqueue notify_finished NULL", "SELECT pgq.enqueue('q', 'k', notify_finished => NULL)", None, "22004",
     "notify_finished"),
    ("enqueue unknown batch", "SELECT pgq.enqueue('q', 'k', batch => 424242)", None, "22023", "batch"),
    ("enqueue_many dependency_mode bad",
     "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], dependency_mode => 'first')", None, "22023",
     "dependency_mode"),
    ("enqueue_many unknown batch", "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], batch => 424242)",
     None, "22023", "batch"),
    ("batch_open callback_queue NULL", "SELECT pgq.batch_open(NULL, 'k')", None, "22004", "callback_queue"),
    ("batch_open callback_queue bad", "SELECT pgq.batch_open('a b', 'k')", None, "22023", "callback_queue"),
    ("batch_open callback_kind bad", "SELECT pgq.batch_open('q', '')", None, "22023", "callback_kind"),
    ("batch_open callback_payload array", "SELECT pgq.batch_open('q', 'k', '[1]')", None, "22023",
     "callback_payload"),
    ("batch_open run_when bad", "SELECT pgq.batch_open('q', 'k', run_when => 'all')", None, "22023", "run_when"),
    ("batch_close NULL", "SELECT pgq.batch_close(NULL)", None, "22004", "id"),
    ("batch_close unknown", "SELECT pgq.batch_close(424242)", None, "P0002", "424242"),
    ("batch_status NULL", "SELECT * FROM pgq.batch_status(NULL)", None, "22004", "id"),
    ("batch_status unknown", "SELECT * FROM pgq.batch_status(424242)", None, "P0002", "424242"),
    ("cancel_batch unknown", "SELECT pgq.cancel_batch(424242)", None, "P0002", "424242"),
    ("job_result NULL", "SELECT * FROM pgq.job_result(NULL)", None, "22004", "id"),
    ("job_result unknown", "SELECT * FROM pgq.job_result(424242)", None, "P0002", "424242"),
    ("job_links limit_rows 0", "SELECT * FROM pgq.job_links($JOB, 0)", None, "22023", "limit_rows"),
    ("job_links unknown", "SELECT * FROM pgq.job_links(424242)", None, "P0002", "424242"),
    ("dependency_results attempt NULL", "SELECT * FROM pgq.dependency_results($JOB, NULL)", None, "22004",
     "attempt"),
    ("dependency_results limit_rows 1001", "SELECT * FROM pgq.dependency_results($JOB, 1, 1001)", None, "22023",
     "limit_rows"),
    ("dependency_results not the owner's attempt", "SELECT * FROM pgq.dependency_results($JOB, 2)", None, "55000",
     "attempt 2"),
]
CASES += [(f"enqueue queue {n!r}", "SELECT pgq.enqueue(%s, 'k')", (n,), "22023", "queue") for n in BAD_NAMES]
CASES += [(f"enqueue kind {n!r}", "SELECT pgq.enqueue('q', %s)", (n,), "22023", "kind") for n in BAD_NAMES]


def everything(conn: psycopg.Connection) -> tuple:
    return tuple(conn.execute(f"SELECT * FROM pgq.{t} ORDER BY 1").fetchall()
                 for t in ("jobs", "queues", "job_events"))


@pytest.fixture
def running(conn: psycopg.Connection) -> int:
    job_id, attempt = running_job(conn)
    assert attempt == 1
    return job_id


def test_every_case_covers_a_distinct_call():
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label,sql,params,sqlstate,argument", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_raises_its_documented_sqlstate_names_the_argument_and_writes_nothing(
        conn, running, label, sql, params, sqlstate, argument):
    before = everything(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql.replace("$JOB", str(running)), params)
    err = info.value
    assert err.sqlstate == sqlstate, f"{label}: {err.sqlstate} {err}"
    message = err.diag.message_primary or ""
    assert message.startswith("pgq: "), message
    if sqlstate in ("22004", "22023"):
        assert f'argument "{argument}"' in message, message
    else:
        assert argument in message, message
    assert everything(conn) == before


def test_an_enqueue_rejected_inside_a_transaction_leaves_the_transactions_other_work(connect):
    c = connect(autocommit=False)
    kept = one(c, "SELECT pgq.enqueue('q', 'k')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        with c.transaction():  # a savepoint
            c.execute("SELECT pgq.enqueue('q', 'k', priority => 5000)")
    c.commit()
    assert [r[0] for r in c.execute("SELECT id FROM pgq.jobs")] == [kept]


# Names ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_queue_and_kind_names_are_accepted(conn, name):
    job_id = one(conn, "SELECT pgq.enqueue(%s, %s)", (name, name))
    row = job(conn, job_id)
    assert (row["queue"], row["kind"]) == (name, name)
    conn.execute("SELECT pgq.pause(%s)", (name,))
    conn.execute("SELECT pgq.configure_queue(%s, lease => '1 minute')", (name,))


names = st.one_of(
    st.text(min_size=0, max_size=140).filter(lambda s: "\x00" not in s),
    st.text(alphabet="aZ09_.:/-';\"\\ -\n\t", max_size=20),
    st.from_regex(NAME_RE, fullmatch=True),
    st.sampled_from(BAD_NAMES),
)


@HYPOTHESIS
@given(name=names, which=st.sampled_from(["queue", "kind"]))
def test_generated_names_are_accepted_exactly_when_they_match_the_documented_pattern(conn, name, which):
    before = row_counts(conn)
    sql = "SELECT pgq.enqueue(%s, 'k')" if which == "queue" else "SELECT pgq.enqueue('q', %s)"
    if NAME_RE.fullmatch(name):
        job_id = one(conn, sql, (name,))
        assert job(conn, job_id)[which] == name
    else:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, (name,))
        assert info.value.sqlstate == "22023"
        assert f'argument "{which}"' in (info.value.diag.message_primary or "")
        assert row_counts(conn) == before


@HYPOTHESIS
@given(name=names)
def test_generated_queue_names_in_claim_pause_and_configure_are_checked_the_same_way(conn, name):
    before = row_counts(conn)
    # configure_queue creates a well-formed queue; pause then finds it (it creates none).
    for sql in ("SELECT * FROM pgq.claim('w', ARRAY[%s])", "SELECT pgq.configure_queue(%s, max_attempts => 3)",
                "SELECT pgq.pause(%s)"):
        try:
            conn.execute(sql, (name,))
        except psycopg.Error as e:
            assert not NAME_RE.fullmatch(name), (sql, name, e)
            assert e.sqlstate == "22023" and "queue" in (e.diag.message_primary or "")
            assert row_counts(conn) == before
        else:
            assert NAME_RE.fullmatch(name), (sql, name)


@HYPOTHESIS
@given(queues=st.lists(names, min_size=1, max_size=4))
def test_a_claim_of_several_queues_is_refused_exactly_when_one_name_is_not_a_name(conn, queues):
    # The claim checks the joined names in one expression and only then name by name: both must
    # agree with the pattern, for short lists and for lists longer than 128 characters.
    before = row_counts(conn)
    bad = [i for i, q in enumerate(queues, start=1) if not NAME_RE.fullmatch(q)]
    try:
        conn.execute("SELECT * FROM pgq.claim('w', %s::text[])", (queues,))
    except psycopg.Error as e:
        assert bad, (queues, e)
        assert e.sqlstate == "22023" and f'argument "queues[{bad[0]}]"' in (e.diag.message_primary or "")
        assert row_counts(conn) == before
    else:
        assert not bad, queues


def test_a_claim_of_long_queue_names_is_checked_name_by_name(conn):
    good = ["a" * 128, "b" * 128, "c"]
    assert conn.execute("SELECT * FROM pgq.claim('w', %s::text[])", (good,)).fetchall() == []
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT * FROM pgq.claim('w', %s::text[])", (["a" * 128, "b" * 129],))
    assert info.value.sqlstate == "22023"
    assert 'argument "queues[2]"' in (info.value.diag.message_primary or "")


# Payloads ------------------------------------------------------------------------------------------

json_text = st.text(max_size=30).filter(lambda s: "\x00" not in s)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False) | json_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(json_text, children, max_size=4),
    max_leaves=12,
)


@HYPOTHESIS
@given(payload=json_values)
def test_generated_payloads_are_accepted_exactly_when_they_are_json_objects(conn, payload):
    before = row_counts(conn)
    if isinstance(payload, dict):
        job_id = one(conn, "SELECT pgq.enqueue('q', 'k', %s)", (Jsonb(payload),))
        assert one(conn, "SELECT payload = %s FROM pgq.jobs WHERE id = %s", (Jsonb(payload), job_id))
        ids = conn.execute("SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY[%s, '{}']::jsonb[])",
                           (Jsonb(payload),)).fetchall()
        assert len(ids) == 2
    else:
        for sql, argument in (("SELECT pgq.enqueue('q', 'k', %s)", "payload"),
                              ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', %s]::jsonb[])", "payloads[2]")):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql, (Jsonb(payload),))
            assert info.value.sqlstate == "22023"
            assert f'argument "{argument}"' in (info.value.diag.message_primary or "")
        assert row_counts(conn) == before


def test_a_payload_just_under_the_size_limit_is_accepted_and_just_over_is_rejected(conn):
    # pg_column_size of jsonb {"x": "<n a's>"} is n + 20 bytes for this shape.
    size = one(conn, "SELECT pg_column_size(jsonb_build_object('x', repeat('a', 1000)))")
    overhead = size - 1000
    one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('x', repeat('a', %s)))", (1048576 - overhead,))
    before = row_counts(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT pgq.enqueue('q', 'k', jsonb_build_object('x', repeat('a', %s)))",
                     (1048576 - overhead + 1,))
    assert row_counts(conn) == before


# Numbers -------------------------------------------------------------------------------------------

int32 = st.integers(-(2**31), 2**31 - 1)
edges = st.sampled_from([-(2**31), -1001, -1000, -1, 0, 1, 1000, 1001, 1002, 10000, 10001, 100000,
                         100001, 2**31 - 1])
numbers = st.one_of(int32, edges)

# (call taking one integer, argument name, lowest valid, highest valid)
NUMBER_ARGS = [
    ("SELECT pgq.enqueue('q', 'k', priority => %s::int)", "priority", -1000, 1000),
    ("SELECT pgq.enqueue('q', 'k', max_attempts => %s::int)", "max_attempts", 1, 10000),
    ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], priority => %s::int)", "priority", -1000, 1000),
    ("SELECT * FROM pgq.claim('w', ARRAY['nothing-here'], batch => %s::int)", "batch", 1, 1000),
    ("SELECT pgq.sweep(%s::int)", "max_jobs", 1, 100000),
    ("SELECT pgq.settle_dependencies(%s::int)", "max_jobs", 1, 100000),
    ("SELECT pgq.prune(max_jobs => %s::int)", "max_jobs", 1, 1000000),
    ("SELECT pgq.configure_queue('q', max_attempts => %s::int)", "max_attempts", 1, 10000),
]


@HYPOTHESIS
@given(value=numbers, case=st.sampled_from(NUMBER_ARGS))
def test_generated_numbers_are_accepted_exactly_within_their_documented_range(conn, value, case):
    sql, argument, low, high = case
    before = row_counts(conn)
    if low <= value <= high:
        conn.execute(sql, (value,))
    else:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, (value,))
        assert info.value.sqlstate == "22023", info.value
        assert f'argument "{argument}"' in (info.value.diag.message_primary or "")
        assert row_counts(conn) == before


# Intervals -----------------------------------------------------------------------------------------

intervals = st.one_of(
    st.timedeltas(min_value=timedelta(days=-10**6), max_value=timedelta(days=10**6)),
    st.sampled_from([timedelta(0), timedelta(microseconds=1), timedelta(microseconds=-1),
                     timedelta(days=1), timedelta(days=1, microseconds=1), timedelta(days=365),
                     timedelta(days=365, microseconds=1), timedelta(days=999_999_999)]),
)

# (call taking one interval and the running job's id, argument name, longest valid)
INTERVAL_ARGS = [
    ("SELECT * FROM pgq.claim('w', ARRAY['nothing-here'], lease => %s)", "lease", timedelta(days=1)),
    ("SELECT pgq.renew({job}, 1, %s)", "lease", timedelta(days=1)),
    ("SELECT pgq.snooze({job}, 1, %s)", "delay", timedelta(days=365)),
    ("SELECT pgq.fail({job}, 1, 'e', %s)", "retry_in", timedelta(days=365)),
    ("SELECT pgq.configure_queue('q', lease => %s)", "lease", timedelta(days=1)),
    ("SELECT pgq.configure_queue('q', backoff_base => %s, backoff_cap => '365 days')", "backoff_base",
     timedelta(days=365)),
]


class _Undo(Exception):
    """Raised to roll back a transaction whose effect the test has seen succeed."""


@HYPOTHESIS
@given(value=intervals, case=st.sampled_from(INTERVAL_ARGS))
def test_generated_intervals_are_accepted_exactly_when_positive_and_bounded(conn, running, value, case):
    sql, argument, longest = case
    sql = sql.format(job=running)
    before = everything(conn)
    if timedelta(0) < value <= longest:
        # In a transaction rolled back afterwards, so the running job stays as it was.
        with pytest.raises(_Undo):
            with conn.transaction():
                conn.execute(sql, (value,))
                raise _Undo
    else:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, (value,))
        assert info.value.sqlstate == "22023", info.value
        assert f'argument "{argument}"' in (info.value.diag.message_primary or "")
    assert everything(conn) == before


# Owner operations with arbitrary ids and attempts ----------------------------------------------------

@HYPOTHESIS
@given(job_id=st.integers(-(2**63), 2**63 - 1), attempt=int32)
def test_owner_operations_with_generated_ids_and_attempts_never_raise_and_change_nothing(
        conn, running, job_id, attempt):
    if (job_id, attempt) == (running, 1):
        return
    before = job(conn, running)
    assert one(conn, "SELECT pgq.renew(%s::bigint, %s::int)", (job_id, attempt)) is None
    assert one(conn, "SELECT pgq.complete(%s::bigint, %s::int)", (job_id, attempt)) is False
    assert one(conn, "SELECT pgq.fail(%s::bigint, %s::int, 'e')", (job_id, attempt)) is None
    assert one(conn, "SELECT pgq.release(%s::bigint, %s::int)", (job_id, attempt)) is False
    assert one(conn, "SELECT pgq.snooze(%s::bigint, %s::int, '1 minute')", (job_id, attempt)) is None
    assert one(conn, "SELECT pgq.mark_unknown(%s::bigint, %s::int, 'n')", (job_id, attempt)) is False
    assert conn.execute("SELECT * FROM pgq.complete_many(ARRAY[%s::bigint], ARRAY[%s::int])",
                        (job_id, attempt)).fetchall() == []
    assert job(conn, running) == before

"""TESTING.md 17: many concurrent producers, at most one NOTIFY per queue per transaction."""

from __future__ import annotations

import threading
from collections import Counter

import psycopg

from sqlhelpers import notifications_until_marker


def test_concurrent_producers_send_at_most_one_notify_per_queue_per_transaction(dsn: str) -> None:
    producers, transactions, jobs_per_queue = 6, 15, 4
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq")
        errors: list[BaseException] = []

        def produce() -> None:
            try:
                with psycopg.connect(dsn) as conn:
                    for _ in range(transactions):
                        with conn.transaction():
                            for queue in ("mail", "sms"):
                                for _ in range(jobs_per_queue):
                                    conn.execute("SELECT pgq.enqueue(%s, 'k')", (queue,))
                            conn.execute("SELECT pgq.enqueue_many('mail', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        threads = [threading.Thread(target=produce) for _ in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        # Everything the producers committed arrives before a marker sent after them (commit
        # order), however long delivery takes on a busy machine.
        with psycopg.connect(dsn, autocommit=True) as sender:
            received = Counter(notifications_until_marker(listener, sender))
    # 11 enqueues to mail and 4 to sms in each transaction: one wake-up per queue per transaction.
    assert received == {"mail": producers * transactions, "sms": producers * transactions}

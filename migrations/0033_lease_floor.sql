-- 0033: the lease floor (issue 40). The functions are the function source's
-- (sql/functions/claim.sql: the claim's expired-lease probe, which reads jobs_lease_idx from the
-- floor up; recovery.sql: pgq._raise_lease_floor); this versions what they read:
--
-- * pgq.lease_floor: a time (microseconds since the epoch) below which no running job's lease
--   ended, as far as the claims that set it could see: a claim whose probe found no lease passed
--   between the floor and its own clock raises the floor to that clock (at most once a second).
--   Without it the probe read jobs_lease_idx from its lowest entry, and while a snapshot is held
--   (vacuum can then remove nothing) every finished job's dead entry sorts there: the probe grew
--   with the snapshot's age (46,068 entries a scan 4.6 minutes into a held snapshot).
-- * pgq.lease_floor_checked: when (microseconds since the epoch) a claim last recovered the
--   leases below the floor too, which it does once a minute: a lease that was already past the
--   floor when it became visible (a claim that committed after its own lease had passed) is
--   recovered by then, or by the next sweep (which reads every expired lease).
--
-- Sequences, not a table: setval takes no row lock (nothing waits for it, nothing can hold it) and
-- leaves no dead tuple; it is not undone by a rollback, which is harmless here (a floor set from a
-- probe stays true whatever became of the claim that made it). Both start at 0: the first claims
-- read every expired lease, as before. No role has a privilege on them.
SET LOCAL lock_timeout = '5s';

CREATE SEQUENCE IF NOT EXISTS pgq.lease_floor AS bigint MINVALUE 0 START WITH 0;
COMMENT ON SEQUENCE pgq.lease_floor IS
    'Microseconds since the epoch below which no running job''s lease ended, as far as the claims '
    'that raised it saw (pgq.claim''s expired-lease probe reads jobs_lease_idx from here).';
CREATE SEQUENCE IF NOT EXISTS pgq.lease_floor_checked AS bigint MINVALUE 0 START WITH 0;
COMMENT ON SEQUENCE pgq.lease_floor_checked IS
    'Microseconds since the epoch when a claim last recovered the expired leases below the floor '
    '(once a minute).';

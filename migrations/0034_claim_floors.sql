-- 0034: the claim floors (issue 40). The functions are the function source's
-- (sql/functions/claim.sql: pgq._lease_jobs and pgq._floor_pick); this versions what they read:
--
-- * pgq.claim_floors: one row per server process (pid) whose claims had to walk far, kept by that
--   process's own claims and read by no other. While a snapshot is held (vacuum can then remove
--   nothing), every job claimed since leaves a dead entry at the head of jobs_ready_idx and
--   jobs_kind_ready_idx, and each claim's pick read them all again: 24,750 entries a scan 4.6
--   minutes into a held snapshot. A pick that read 5,000 entries more than it picked records, per
--   queue (and kind) it picked from, the key of the last job it took; for a second, that process's
--   picks read each such queue's priority levels above the floor's from their start and the floor's
--   level from just past its key (a floor read that comes back short reads the whole order and
--   deletes the row); the pick after that second reads the whole order again and records new
--   floors, or none when it read little (the row stays, unused, until that process records again).
--
-- * pgq.claim_floors_set: when (microseconds since the epoch) a process last recorded floors, or
--   0. While it is 0 a claim reads neither its floors nor what its pick reads, but once a second
--   (the claim that raises the lease floor counts what its pick read); the claim that raises the
--   lease floor sets it back to 0 once no process recorded floors for two seconds. So without a
--   held snapshot a claim pays one sequence read for the floors (setval takes no row lock).
--
-- UNLOGGED: a hint, rebuilt by the next claims, that needs no WAL and is empty after a crash. No
-- role has a privilege on it; only pgq's claim writes it, and only the calling process's own row
-- (nothing another login does can hold it, fill it or make a claim wait for it).
SET LOCAL lock_timeout = '5s';

CREATE UNLOGGED TABLE IF NOT EXISTS pgq.claim_floors (
    pid        integer PRIMARY KEY,
    set_at     timestamptz NOT NULL,
    keys       text[] NOT NULL,
    priorities integer[] NOT NULL,
    run_ats    timestamptz[] NOT NULL,
    ids        bigint[] NOT NULL
);
COMMENT ON TABLE pgq.claim_floors IS
    'Per server process whose claims walked far (a held snapshot''s dead entries): where its picks '
    'start reading, per queue and kind, for a second. Written and read by that process''s claims only.';
COMMENT ON COLUMN pgq.claim_floors.keys IS
    'queue || chr(31) || kind (empty: a pick of any kind), one per floor.';
CREATE SEQUENCE IF NOT EXISTS pgq.claim_floors_set AS bigint MINVALUE 0 START WITH 0;
COMMENT ON SEQUENCE pgq.claim_floors_set IS
    'Microseconds since the epoch when a process last recorded claim floors (pgq.claim_floors).';

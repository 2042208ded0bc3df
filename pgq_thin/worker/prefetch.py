"""The prefetch policy: how many claimed jobs may wait for a slot, and so how many jobs a claim
asks for. Pure arithmetic over what it is told (the handlers' run times); both runtimes use it."""

from __future__ import annotations

__all__ = ["AUTO_PREFETCH_MAX", "AUTO_PREFETCH_WAIT", "PrefetchPolicy", "check_prefetch"]

#: prefetch="auto": claimed jobs may wait for a slot as long as, by the handlers' measured run
#: time, the last of them is expected to start within AUTO_PREFETCH_WAIT seconds; never more than
#: AUTO_PREFETCH_MAX of them.
AUTO_PREFETCH_WAIT = 0.1
AUTO_PREFETCH_MAX = 100


def check_prefetch(prefetch: int | str) -> int | str:
    if prefetch == "auto":
        return prefetch
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0 or prefetch > 1000:
        raise ValueError(f"prefetch must be \"auto\" or an integer from 0 to 1000, got {prefetch!r}")
    return prefetch


class PrefetchPolicy:
    """``"auto"``: as many waiting jobs as ``concurrency`` slots get through in AUTO_PREFETCH_WAIT,
    at most AUTO_PREFETCH_MAX, and none until a job has been timed or while jobs take long (a
    slower job counts at once, a faster one moves the estimate 5% of the way). An integer fixes
    it; 0 means a claim asks for the free slots only. ``timed`` is not thread-safe: the slots
    call it under their own lock (or from the loop's one thread)."""

    def __init__(self, prefetch: int | str, concurrency: int) -> None:
        self.prefetch = check_prefetch(prefetch)
        self.concurrency = concurrency
        self._job_seconds: float | None = None

    def limit(self) -> int:
        """How many claimed jobs may wait for a slot now."""
        if self.prefetch != "auto":
            return int(self.prefetch)
        known = self._job_seconds
        if known is None:
            return 0
        return min(AUTO_PREFETCH_MAX, int(AUTO_PREFETCH_WAIT * self.concurrency / max(known, 1e-6)))

    def timed(self, run_seconds: float) -> None:
        """Account one handler's run time."""
        known = self._job_seconds
        if known is None or run_seconds > known:
            self._job_seconds = run_seconds
        else:
            self._job_seconds = known + 0.05 * (run_seconds - known)

    def claim_size(self, assigned: int) -> int:
        """How many jobs to claim now that ``assigned`` are running or waiting for a slot; 0: do
        not claim, wait for a slot to free. A claim is made when a slot is idle; while every slot
        is busy, only once the line of waiting jobs is half empty, so that claims stay large."""
        prefetch = self.limit()
        free = self.concurrency + prefetch - assigned
        if free <= 0 or (assigned >= self.concurrency and free < (prefetch + 1) // 2):
            return 0
        return min(free, 1000)

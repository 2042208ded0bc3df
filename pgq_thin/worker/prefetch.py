"""The prefetch policy: how many claimed jobs may wait for a slot, and so how many jobs a claim
asks for. Pure arithmetic over what it is told (the handlers' run times, and whether claims come
back full); both runtimes use it."""

from __future__ import annotations

__all__ = ["AUTO_PREFETCH_DEEP", "AUTO_PREFETCH_MAX", "AUTO_PREFETCH_WAIT", "PrefetchPolicy", "check_prefetch"]

#: prefetch="auto": claimed jobs may wait for a slot as long as, by the handlers' measured run
#: time, the last of them is expected to start within AUTO_PREFETCH_WAIT seconds; never more than
#: AUTO_PREFETCH_MAX of them, unless the backlog is deep: each claim that comes back full (there
#: were at least as many due jobs as it asked for) while that cap is what holds the prefetch back
#: doubles the cap, up to AUTO_PREFETCH_DEEP; each claim that comes back short, or the run time
#: holding the prefetch below the cap, halves it again (never below AUTO_PREFETCH_MAX).
AUTO_PREFETCH_WAIT = 0.1
AUTO_PREFETCH_MAX = 100
AUTO_PREFETCH_DEEP = 1000


def check_prefetch(prefetch: int | str) -> int | str:
    if prefetch == "auto":
        return prefetch
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0 or prefetch > 1000:
        raise ValueError(f"prefetch must be \"auto\" or an integer from 0 to 1000, got {prefetch!r}")
    return prefetch


class PrefetchPolicy:
    """``"auto"``: as many waiting jobs as ``concurrency`` slots get through in AUTO_PREFETCH_WAIT,
    at most a cap (AUTO_PREFETCH_MAX, growing to AUTO_PREFETCH_DEEP while claims come back full),
    and none until a job has been timed or while jobs take long (a slower job counts at once, a
    faster one moves the estimate 5% of the way). An integer fixes it; 0 means a claim asks for
    the free slots only. ``timed`` is not thread-safe: the slots call it under their own lock (or
    from the loop's one thread); ``claimed`` is the claimer's."""

    def __init__(self, prefetch: int | str, concurrency: int) -> None:
        self.prefetch = check_prefetch(prefetch)
        self.concurrency = concurrency
        self._job_seconds: float | None = None
        self._cap = AUTO_PREFETCH_MAX

    def _by_run_time(self) -> int:
        """How many waiting jobs the slots get through in AUTO_PREFETCH_WAIT (-1: nothing timed)."""
        known = self._job_seconds
        if known is None:
            return -1
        return int(AUTO_PREFETCH_WAIT * self.concurrency / max(known, 1e-6))

    def limit(self) -> int:
        """How many claimed jobs may wait for a slot now."""
        if self.prefetch != "auto":
            return int(self.prefetch)
        return max(0, min(self._cap, self._by_run_time()))

    def claimed(self, got: int, asked: int) -> None:
        """Account one claim's answer (``got`` jobs of ``asked``): the auto prefetch's cap doubles
        after a full claim while it is what holds the prefetch back, and halves after a short one
        or while the run time holds the prefetch below it."""
        if self.prefetch != "auto":
            return
        by_run_time = self._by_run_time()
        if got >= asked and by_run_time > self._cap:
            self._cap = min(AUTO_PREFETCH_DEEP, 2 * self._cap)
        elif got < asked or by_run_time < self._cap:
            self._cap = max(AUTO_PREFETCH_MAX, self._cap // 2)

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

"""Durations as people write them: a number with its unit (``500ms``, ``30s``, ``5m``, ``2h``, ``7d``),
or several (``1h 30m``). The CLI, the Python API and the dashboard's API read them the same way, a
bare number in text being refused (is ``"5"`` seconds or minutes?); the Python API takes a
``timedelta`` or a number of seconds as well (``Interval``, read by ``to_timedelta``). The CLI and
the dashboard write them the same way: ``1h``, ``1h 30m``, ``3m 12s``, ``4.5s``, ``250ms`` (what is
written can be typed back)."""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["UNITS", "Interval", "format_duration", "parse_duration", "to_timedelta"]

#: An interval argument of the Python API: a timedelta, a number of seconds, or a duration with its
#: unit as the CLI reads it (``"30s"``, ``"1h 30m"``).
Interval = timedelta | float | int | str

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)"
_DURATION = re.compile(rf"\s*(?:{_PART}\s*)+")
_EXAMPLES = "e.g. 30s, 500ms, 5m, 2h, 7d or 1h 30m"
#: The longest duration a timedelta holds, in days.
MAX_DAYS = timedelta.max.days
_MAX_SECONDS = timedelta.max.total_seconds()


class _Unreadable(ValueError):
    """Why a text is not a duration, as a predicate: ``what`` (``not``, ``unit``, ``long``) and ``detail``."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what
        self.detail = detail


def _read(text: str) -> timedelta:
    if not _DURATION.fullmatch(text):
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
            number = text.strip()
            raise _Unreadable("unit", f"{number!r} could be {number}s, {number}m or {number}h (units: ms, s, m, h, d)")
        raise _Unreadable("not", f"{text!r:.60} ({_EXAMPLES})")
    seconds = sum(float(number) * UNITS[unit] for number, unit in re.findall(_PART, text))
    if not seconds <= MAX_DAYS * 86400:  # a timedelta holds it (and it is not infinite)
        raise _Unreadable("long", f"{text.strip()!r:.60} (at most {MAX_DAYS}d)")
    return timedelta(seconds=seconds)


#: How parse_duration (the CLI: "argument --every: a duration needs a unit: ...") and to_timedelta
#: (after an argument's name: 'argument "every" needs a unit: ...') say each problem.
_ALONE = {"unit": "a duration needs a unit: ", "not": "not a duration: ", "long": "duration too long: "}
_AFTER_NAME = {"unit": "needs a unit: ", "not": "is not a duration: ", "long": "is too long: "}


def parse_duration(text: str) -> timedelta:
    """``'30s'`` / ``'500ms'`` / ``'5m'`` / ``'2h'`` / ``'7d'`` / ``'1h 30m'`` -> timedelta. ValueError
    saying what is wrong otherwise (a number without its unit among them)."""
    try:
        return _read(text)
    except _Unreadable as exc:
        raise ValueError(_ALONE[exc.what] + exc.detail) from None


def to_timedelta(value: Interval) -> timedelta:
    """An interval as the Python API takes one: a timedelta (as it is), a number of seconds (finite,
    within what a timedelta holds) or a duration with its unit (``"30s"``, ``"1h 30m"``, as
    parse_duration reads it). TypeError for another type, ValueError for a value it cannot be; each
    message reads after the argument's name (``lease must be ...``, ``lease is not a duration: ...``)."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        try:
            return _read(value)
        except _Unreadable as exc:
            raise ValueError(_AFTER_NAME[exc.what] + exc.detail) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"must be a timedelta, a number of seconds or a duration such as '30s', "
                        f"got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    shown = repr(value) if len(repr(value)) <= 24 else f"{repr(value)[:12]}... ({len(repr(value))} digits)"
    if not (math.isfinite(seconds) and abs(seconds) <= _MAX_SECONDS):
        raise ValueError(f"must be a finite number of seconds, at most {MAX_DAYS} days either way "
                         f"(a timedelta's range), got {shown}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # within a rounding of the limit
        raise ValueError(f"must be at most {MAX_DAYS} days either way, got {shown}") from None


def format_duration(value: timedelta | None) -> str:
    """A duration in at most two units: ``1h``, ``2h 5m``, ``3d 4h``, ``3m 12s``; under a minute
    to a tenth of a second (``4.5s``), under a second in milliseconds; ``-`` for None."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if round(seconds * 1000) <= 0:
        return "0s"
    if round(seconds * 1000) < 1000:
        return f"{round(seconds * 1000)}ms"
    if round(seconds, 1) < 60:
        return f"{round(seconds, 1):g}s"
    whole = int(round(seconds, 1))
    parts = [(whole // 86400, "d"), (whole % 86400 // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    first = next(i for i, (n, _) in enumerate(parts) if n)
    shown = [f"{n}{unit}" for n, unit in parts[first:first + 2] if n]
    return " ".join(shown)

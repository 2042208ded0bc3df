"""Durations as people write them: a number with its unit (``500ms``, ``30s``, ``5m``, ``2h``, ``7d``),
or several (``1h 30m``). The CLI reads them, a bare number being refused (is ``5`` seconds or
minutes?), and the CLI and the dashboard write them the same way: ``1h``, ``1h 30m``, ``3m 12s``,
``4.5s``, ``250ms`` (what is written can be typed back)."""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["UNITS", "format_duration", "parse_duration"]

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)"
_DURATION = re.compile(rf"\s*(?:{_PART}\s*)+")
_EXAMPLES = "e.g. 30s, 500ms, 5m, 2h, 7d or 1h 30m"
#: The longest duration a timedelta holds, in days.
MAX_DAYS = timedelta.max.days


def parse_duration(text: str) -> timedelta:
    """``'30s'`` / ``'500ms'`` / ``'5m'`` / ``'2h'`` / ``'7d'`` / ``'1h 30m'`` -> timedelta. ValueError
    saying what is wrong otherwise (a number without its unit among them)."""
    if not _DURATION.fullmatch(text):
        if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
            number = text.strip()
            raise ValueError(f"a duration needs a unit: {number!r} could be {number}s, {number}m or {number}h "
                             "(units: ms, s, m, h, d)")
        raise ValueError(f"not a duration: {text!r} ({_EXAMPLES})")
    seconds = sum(float(number) * UNITS[unit] for number, unit in re.findall(_PART, text))
    if not seconds <= MAX_DAYS * 86400:  # a timedelta holds it (and it is not infinite)
        raise ValueError(f"duration too long: {text.strip()!r} (at most {MAX_DAYS}d)")
    return timedelta(seconds=seconds)


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

"""pgq.cron_next(cron, after, timezone): the first instant strictly after `after` whose local time
in `timezone` matches `cron` (issue 15).

The reference is croniter (a test-only dependency). croniter's wall-clock arithmetic is the oracle
for which local times match; the issue's daylight-saving rule, which is not croniter's, is applied
on top with zoneinfo: a local time that does not exist is skipped (croniter fires it at the end of
the gap), a local time that happens twice fires once, at its first occurrence (croniter fires both).
Where croniter has other quirks (a one-value range `a-a` means `*` to it; `7/n` in day-of-week) the
generator leaves them out and hand-written tests pin pgq's meaning.

The functions are the installed schema's (migration 0004, sql/schema.sql)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sqlhelpers import fresh_database, one

UTC = timezone.utc
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
ROLES = ["pgq_producer", "pgq_worker", "pgq_admin", "pgq_monitor"]
HELPERS = ["_cron_next_bit", "_cron_bad_field", "_cron_value", "_cron_field", "_cron_parse",
           "_cron_local", "_cron_instant"]


@pytest.fixture(scope="module")
def cron_dsn(databases, template_db: str) -> Iterator[str]:
    """One migrated database for the module (nothing here writes): pgq.cron_next as installed."""
    for dsn in fresh_database(databases, template_db):
        with psycopg.connect(dsn, autocommit=True) as c:
            assert one(c, "SELECT to_regprocedure('pgq.cron_next(text, timestamptz, text)') IS NOT NULL")
        yield dsn


@pytest.fixture
def db(cron_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(cron_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def mod_db(cron_dsn: str) -> Iterator[psycopg.Connection]:
    """A connection shared by the property tests (Hypothesis calls them thousands of times)."""
    with psycopg.connect(cron_dsn, autocommit=True) as c:
        yield c


def cron_next(conn: psycopg.Connection, cron: str, after: datetime, tz: str | None = None) -> datetime:
    if tz is None:
        return one(conn, "SELECT pgq.cron_next(%s, %s)", (cron, after))
    return one(conn, "SELECT pgq.cron_next(%s, %s, %s)", (cron, after, tz))


def firings(conn: psycopg.Connection, cron: str, after: datetime, tz: str, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = cron_next(conn, cron, after, tz)
        out.append(after)
    return out


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local(tz: str, *args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)


# The reference ------------------------------------------------------------------------------------

def croniter_form(cron: str) -> str:
    """The same schedule written so that croniter reads it as the issue means it.

    croniter decides whether a day field is restricted from its expansion: a list holding `*`
    (`*,1`) or a day-of-week covering the week (`0-7`) reads as a bare `*` to it, so with the other
    day field restricted it ANDs them. The issue says only a bare `*` is unrestricted: both are
    restricted, a day matches if either does, and since one matches every day, every day matches.
    Fields whose expansion holds `*` are also rewritten as `*` (croniter repeats some firings of
    `*,1` in day-of-week)."""
    fields = cron.split()
    if len(fields) != 5:
        return cron
    expanded = croniter(cron).expanded
    full = {2: set(range(1, 32)), 4: set(range(7))}

    def covers(i: int) -> bool:
        return "*" in expanded[i] or {v % 7 if i == 4 else v for v in expanded[i]} >= full[i]

    for i in (0, 1, 3):
        if "*" in expanded[i]:
            fields[i] = "*"
    dom_restricted, dow_restricted = fields[2] != "*", fields[4] != "*"
    if dom_restricted and dow_restricted:
        if covers(2) or covers(4):
            fields[2] = fields[4] = "*"
    elif dom_restricted and "*" in expanded[2]:
        fields[2] = "*"
    elif dow_restricted and covers(4):
        fields[4] = "*"
    return " ".join(fields)


def reference(cron: str, after: datetime, tz: str) -> datetime:
    """croniter's local matches (naive: pure wall clock), with the issue's DST rule applied."""
    zone = ZoneInfo(tz)
    start = after.astimezone(zone).replace(tzinfo=None)
    it = croniter(croniter_form(cron), start)
    for _ in range(500):
        wall = it.get_next(datetime)
        first = wall.replace(tzinfo=zone, fold=0)  # zoneinfo: fold=0 is the first occurrence
        instant = first.astimezone(UTC)
        if instant.astimezone(zone).replace(tzinfo=None) != wall:
            continue  # in a spring-forward gap: does not exist, skipped
        if instant > after:
            return instant
        # Not after `after`: `after` is in the second pass of a fall-back overlap and this local
        # time already fired at its first occurrence.
    raise AssertionError(f"reference found nothing for {cron!r} after {after} in {tz}")


def transitions(tz: str, years: range) -> list[datetime]:
    """The UTC instants where the zone's offset changes, found by a daily scan and bisection."""
    zone = ZoneInfo(tz)
    out = []
    t = datetime(years.start, 1, 1, tzinfo=UTC)
    end = datetime(years.stop, 1, 1, tzinfo=UTC)
    while t < end:
        u = t + timedelta(days=1)
        if t.astimezone(zone).utcoffset() != u.astimezone(zone).utcoffset():
            lo, hi = t, u
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            out.append(hi.replace(second=0, microsecond=0))
        t = u
    return out


TRANSITIONS = {tz: transitions(tz, range(2018, 2031)) for tz in ZONES if tz != "UTC"}


def test_the_reference_sees_the_zones_transitions():
    assert len(TRANSITIONS["Europe/Berlin"]) == 26
    assert utc(2026, 3, 29, 1, 0) in TRANSITIONS["Europe/Berlin"]
    assert utc(2026, 10, 25, 1, 0) in TRANSITIONS["Europe/Berlin"]
    assert utc(2026, 3, 8, 7, 0) in TRANSITIONS["America/New_York"]
    assert utc(2026, 10, 3, 15, 30) in TRANSITIONS["Australia/Lord_Howe"]  # 02:00 -> 02:30 local


# Generated expressions --------------------------------------------------------------------------

NAMES = {3: ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
         4: ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]}
BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


@st.composite
def field(draw, index: int) -> str:
    lo, hi = BOUNDS[index]
    # A small field often enough that days and hours near the DST switch come up.
    if index in (0, 1) and draw(st.booleans()):
        hi = min(hi, 5 if index == 1 else 59)

    def value(v: int) -> str:
        if index in NAMES and v < (13 if index == 3 else 7) and draw(st.integers(0, 3)) == 0:
            name = NAMES[index][v - (1 if index == 3 else 0)]
            return draw(st.sampled_from([name, name.lower(), name.capitalize()]))
        return str(v)

    def item() -> str:
        kind = draw(st.sampled_from(["*", "n", "a-b", "*/n", "a-b/n", "a/n"]))
        step = draw(st.integers(1, BOUNDS[index][1] + 3))
        if kind == "*":
            return "*"
        if kind == "n":
            return value(draw(st.integers(lo, hi)))
        if kind == "*/n":
            return f"*/{step}"
        # croniter reads a-a as * and 7/n as something else: pgq's meaning is pinned by hand below.
        top = 6 if index == 4 and kind == "a/n" else hi
        a = draw(st.integers(lo, max(lo, top - 1)))
        if kind == "a/n":
            return f"{value(a)}/{step}"
        b = draw(st.integers(a + 1, max(a + 1, hi)))
        return f"{value(a)}-{value(b)}" + (f"/{step}" if kind == "a-b/n" else "")

    return ",".join(item() for _ in range(draw(st.integers(1, 3))))


@st.composite
def expressions(draw) -> str:
    fields = [draw(field(i)) for i in range(5)]
    # Both day fields `*` most of the time would hide the OR rule; both restricted hide AND.
    expr = " ".join(fields)
    try:
        croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
    except Exception:  # the reference refuses it (it never matches, e.g. 0 0 31 2 *)
        assume(False)
    return expr


INSTANTS = st.datetimes(min_value=datetime(1995, 1, 1), max_value=datetime(2035, 12, 31),
                        timezones=st.just(UTC))


@st.composite
def near_transition(draw) -> tuple[datetime, str]:
    tz = draw(st.sampled_from(sorted(TRANSITIONS)))
    t = draw(st.sampled_from(TRANSITIONS[tz]))
    return t + timedelta(seconds=draw(st.integers(-26 * 3600, 26 * 3600))), tz


AFTER_AND_ZONE = st.one_of(st.tuples(INSTANTS, st.sampled_from(ZONES)), near_transition())
PROPERTY = settings(max_examples=1000, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@PROPERTY
@given(cron=expressions(), cases=st.lists(AFTER_AND_ZONE, min_size=3, max_size=3))
def test_cron_next_matches_the_reference(mod_db, cron, cases):
    """Thousands of cases: 1000 expressions x 3 (instant, zone), half near a DST transition."""
    for after, tz in cases:
        assert cron_next(mod_db, cron, after, tz) == reference(cron, after, tz), (cron, after, tz)


@PROPERTY
@given(cron=expressions(), after=INSTANTS)
def test_cron_next_matches_croniter_itself_away_from_daylight_saving(mod_db, cron, after):
    """In UTC croniter's own answer is pgq's, whatever the expression (no DST rule to differ on)."""
    assert cron_next(mod_db, cron, after) == croniter(croniter_form(cron), after).get_next(datetime)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cron=expressions(), start=near_transition())
def test_consecutive_firings_across_a_transition_follow_the_rule(mod_db, cron, start):
    """Chained calls (after = the previous firing), as a schedule makes them: each is the
    reference's answer, strictly later than the one before, and no local time fires twice."""
    after, tz = start
    seen = set()
    for _ in range(8):
        nxt = cron_next(mod_db, cron, after, tz)
        assert nxt == reference(cron, after, tz)
        assert nxt > after
        wall = nxt.astimezone(ZoneInfo(tz)).replace(tzinfo=None)
        assert wall not in seen, f"{wall} fired twice"
        seen.add(wall)
        after = nxt


# Where croniter and the issue disagree: daylight saving -------------------------------------------

def test_croniter_itself_fires_a_nonexistent_time_and_both_passes_of_a_repeated_one():
    """Why the reference applies the DST rule itself (if croniter changes, revisit this file)."""
    berlin = ZoneInfo("Europe/Berlin")
    gap = croniter("30 2 * * *", local("Europe/Berlin", 2026, 3, 28, 12, 0)).get_next(datetime)
    assert gap == local("Europe/Berlin", 2026, 3, 29, 3, 0)  # the skipped 02:30, fired at 03:00
    it = croniter("30 2 * * *", local("Europe/Berlin", 2026, 10, 24, 12, 0))
    first, second = it.get_next(datetime), it.get_next(datetime)
    assert first.astimezone(UTC) == utc(2026, 10, 25, 0, 30)
    assert second.astimezone(UTC) == utc(2026, 10, 25, 1, 30)  # the same 02:30 again, in CET
    assert berlin  # (zone used above)


def test_spring_forward_skips_the_local_time_that_does_not_exist(db):
    # Europe/Berlin 2026-03-29: 02:00 CET -> 03:00 CEST; 02:30 does not exist that day.
    assert cron_next(db, "30 2 * * *", local("Europe/Berlin", 2026, 3, 28, 12, 0), "Europe/Berlin") \
        == local("Europe/Berlin", 2026, 3, 30, 2, 30)
    # America/New_York 2026-03-08: 02:00 EST -> 03:00 EDT.
    assert cron_next(db, "30 2 * * *", local("America/New_York", 2026, 3, 7, 12, 0), "America/New_York") \
        == local("America/New_York", 2026, 3, 9, 2, 30)
    # Australia/Lord_Howe 2026-10-04: 02:00 -> 02:30 (+10:30 -> +11); 02:00-02:29 do not exist.
    assert firings(db, "*/15 1-3 * * *", local("Australia/Lord_Howe", 2026, 10, 4, 1, 40),
                   "Australia/Lord_Howe", 3) == [local("Australia/Lord_Howe", 2026, 10, 4, 1, 45),
                                                 local("Australia/Lord_Howe", 2026, 10, 4, 2, 30),
                                                 local("Australia/Lord_Howe", 2026, 10, 4, 2, 45)]
    # Every minute: the minute before the gap, then the first one after it.
    assert firings(db, "* * * * *", utc(2026, 3, 29, 0, 58), "Europe/Berlin", 2) \
        == [utc(2026, 3, 29, 0, 59), utc(2026, 3, 29, 1, 0)]


def test_fall_back_fires_a_repeated_local_time_once_at_its_first_occurrence(db):
    # Europe/Berlin 2026-10-25: 03:00 CEST -> 02:00 CET; 02:00-02:59 happen twice.
    assert firings(db, "30 2 * * *", local("Europe/Berlin", 2026, 10, 24, 12, 0), "Europe/Berlin", 2) \
        == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]  # 02:30 CEST, then the next day
    # From inside the second pass: the overlap's times already fired; the next is 03:00 CET.
    assert cron_next(db, "* * * * *", local("Europe/Berlin", 2026, 10, 25, 2, 30, fold=1), "Europe/Berlin") \
        == local("Europe/Berlin", 2026, 10, 25, 3, 0)
    assert cron_next(db, "45 2 * * *", local("Europe/Berlin", 2026, 10, 25, 2, 30, fold=1), "Europe/Berlin") \
        == local("Europe/Berlin", 2026, 10, 26, 2, 45)
    # From inside the first pass, a later time of the overlap is still ahead.
    assert cron_next(db, "45 2 * * *", local("Europe/Berlin", 2026, 10, 25, 2, 30), "Europe/Berlin") \
        == utc(2026, 10, 25, 0, 45)
    # Australia/Lord_Howe 2026-04-05: 02:00 (+11) -> 01:30 (+10:30); 01:30-01:59 happen twice.
    assert firings(db, "*/15 1-2 * * *", local("Australia/Lord_Howe", 2026, 4, 5, 1, 20),
                   "Australia/Lord_Howe", 4) == [utc(2026, 4, 4, 14, 30), utc(2026, 4, 4, 14, 45),
                                                 utc(2026, 4, 4, 15, 30), utc(2026, 4, 4, 15, 45)]


def test_an_hourly_schedule_across_both_transitions(db):
    spring = firings(db, "0 * * * *", utc(2026, 3, 28, 23, 30), "Europe/Berlin", 4)
    assert [t.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M %Z") for t in spring] \
        == ["01:00 CET", "03:00 CEST", "04:00 CEST", "05:00 CEST"]
    assert spring == [utc(2026, 3, 29, 0), utc(2026, 3, 29, 1), utc(2026, 3, 29, 2), utc(2026, 3, 29, 3)]
    autumn = firings(db, "0 * * * *", utc(2026, 10, 24, 22, 30), "Europe/Berlin", 4)
    assert [t.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M %Z") for t in autumn] \
        == ["01:00 CEST", "02:00 CEST", "03:00 CET", "04:00 CET"]  # the second 02:00 (CET) not again
    assert autumn == [utc(2026, 10, 24, 23), utc(2026, 10, 25, 0), utc(2026, 10, 25, 2), utc(2026, 10, 25, 3)]
    ny = firings(db, "0 * * * *", utc(2026, 11, 1, 4, 30), "America/New_York", 3)
    assert ny == [utc(2026, 11, 1, 5), utc(2026, 11, 1, 7), utc(2026, 11, 1, 8)]  # 01:00 EDT, 02:00 EST


# The grammar --------------------------------------------------------------------------------------

def test_strictly_after_and_seconds(db):
    assert cron_next(db, "*/15 * * * *", utc(2026, 1, 1, 10, 15)) == utc(2026, 1, 1, 10, 30)
    assert cron_next(db, "*/15 * * * *", utc(2026, 1, 1, 10, 14, 59)) == utc(2026, 1, 1, 10, 15)
    assert cron_next(db, "* * * * *", utc(2026, 1, 1, 10, 0, 30)) == utc(2026, 1, 1, 10, 1)
    assert cron_next(db, "0 0 1 1 *", utc(2026, 12, 31, 23, 59, 59)) == utc(2027, 1, 1)


def test_timezone_defaults_to_utc_and_the_answer_is_an_instant(db):
    assert cron_next(db, "0 9 * * *", utc(2026, 6, 1)) == utc(2026, 6, 1, 9)
    assert cron_next(db, "0 9 * * *", utc(2026, 6, 1), "Europe/Berlin") == utc(2026, 6, 1, 7)
    assert cron_next(db, "0 9 * * *", utc(2026, 1, 1), "Europe/Berlin") == utc(2026, 1, 1, 8)
    assert cron_next(db, "0 9 * * *", utc(2026, 6, 1), "America/New_York") == utc(2026, 6, 1, 13)
    # Whatever the session's TimeZone setting.
    db.execute("SET TimeZone = 'Asia/Tokyo'")
    assert cron_next(db, "0 9 * * *", utc(2026, 6, 1)) == utc(2026, 6, 1, 9)


@pytest.mark.parametrize("macro, same_as", [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"), ("@DAILY", "0 0 * * *"), ("  @Weekly ", "0 0 * * 0"),
])
def test_macros(db, macro, same_as):
    for after in (utc(2026, 1, 1), utc(2026, 2, 28, 23, 59), utc(2027, 12, 31, 12, 0)):
        for tz in ("UTC", "Europe/Berlin"):
            assert cron_next(db, macro, after, tz) == cron_next(db, same_as, after, tz)
    assert cron_next(db, "@weekly", utc(2026, 1, 1)) == utc(2026, 1, 4)  # a Sunday


@pytest.mark.parametrize("named, numeric", [
    ("0 0 * JAN-MAR MON", "0 0 * 1-3 1"),
    ("0 0 * jan,Jul * ", "0 0 * 1,7 *"),
    ("0 0 * * mon-fri", "0 0 * * 1-5"),
    ("0 0 * * SAT,sun", "0 0 * * 6,0"),
    ("0 0 * * MON-SUN", "0 0 * * *"),        # SUN ending a range is 7: the whole week
    ("0 0 * * FRI-SUN", "0 0 * * 5,6,0"),
    ("0 0 * * SUN-SUN", "0 0 * * 0"),
    ("0 0 * * 0-7", "0 0 * * *"),
    ("0 0 * * 7", "0 0 * * 0"),              # 0 and 7 are both Sunday
    ("0 0 * * 5-7", "0 0 * * 5,6,0"),
    ("0 0 * * 1/3", "0 0 * * 1,4"),          # a/n stops at 6 (croniter's reading)
    ("0 0 * * 7/2", "0 0 * * 0"),            # croniter reads this otherwise; 7 is Sunday only
    ("0 0 * * */2", "0 0 * * 0,2,4,6"),
    ("5-5 * * * *", "5 * * * *"),            # croniter reads a-a as *
    ("0 3-3 * * *", "0 3 * * *"),
    ("0 0 * * 3-3/2", "0 0 * * 3"),
    ("*/90 * * * *", "0 * * * *"),           # a step longer than the range: its first value
    ("10/25 * * * *", "10,35 * * * *"),
    ("0  0\t*  * *", "0 0 * * *"),           # any white space separates fields
    ("00 08 * * *", "0 8 * * *"),
])
def test_names_and_readings(db, named, numeric):
    for after in (utc(2026, 1, 1), utc(2026, 5, 17, 13, 7), utc(2027, 11, 30, 23, 59)):
        assert firings(db, named, after, "UTC", 5) == firings(db, numeric, after, "UTC", 5)


def test_both_day_fields_restricted_match_either(db):
    # The 13th OR a Friday (13 Jan 2026 is a Tuesday).
    days = [t.day for t in firings(db, "0 0 13 * FRI", utc(2026, 1, 1), "UTC", 6)]
    assert days == [2, 9, 13, 16, 23, 30]
    # */2 counts as restricted: odd days OR Mondays.
    got = firings(db, "0 0 */2 * MON", utc(2026, 1, 1), "UTC", 7)
    assert [t.day for t in got] == [3, 5, 7, 9, 11, 12, 13]  # 12 Jan: a Monday
    got = firings(db, "0 0 */10 * MON", utc(2026, 1, 1), "UTC", 4)
    assert [t.day for t in got] == [5, 11, 12, 19]
    # One of them `*`: the other alone decides.
    assert [t.day for t in firings(db, "0 0 * * MON", utc(2026, 1, 1), "UTC", 3)] == [5, 12, 19]
    assert [t.day for t in firings(db, "0 0 13 * *", utc(2026, 1, 1), "UTC", 2)] == [13, 13]
    # Only a bare * is unrestricted: a list holding *, or a range covering every day, is
    # restricted, and (matching every day) makes every day match. croniter ANDs these.
    for cron in ("0 0 *,1 * TUE", "0 0 1-31 * MON", "0 0 1 * 0-7", "0 0 13 * SUN-SAT", "0 0 */1 * 5"):
        assert [t.day for t in firings(db, cron, utc(2026, 1, 1), "UTC", 3)] == [2, 3, 4], cron
    assert croniter("0 0 *,1 * TUE", datetime(2026, 1, 1)).get_next(datetime).day == 6  # (AND)
    # The OR rule makes an impossible day-of-month harmless.
    assert cron_next(db, "0 0 31 2 MON", utc(2026, 1, 1)) == utc(2026, 2, 2)


def test_far_jumps(db):
    assert cron_next(db, "0 0 29 2 *", utc(2026, 1, 1)) == utc(2028, 2, 29)
    assert cron_next(db, "0 0 29 2 *", utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is no leap year
    assert firings(db, "0 0 31 * *", utc(2026, 1, 31), "UTC", 3) \
        == [utc(2026, 3, 31), utc(2026, 5, 31), utc(2026, 7, 31)]
    assert cron_next(db, "0 0 30 2,4 *", utc(2026, 1, 1)) == utc(2026, 4, 30)
    assert cron_next(db, "59 23 31 12 *", utc(2026, 1, 1)) == utc(2026, 12, 31, 23, 59)
    assert cron_next(db, "0 0 1 1 *", utc(2026, 1, 1)) == utc(2027, 1, 1)
    assert cron_next(db, "0 12 29 2 *", utc(2028, 2, 29, 11), "Australia/Lord_Howe") \
        == local("Australia/Lord_Howe", 2032, 2, 29, 12, 0)


# Errors: one test per kind ------------------------------------------------------------------------

def error_of(conn: psycopg.Connection, sql: str, params: tuple) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, params)
    return info.value


@pytest.mark.parametrize("cron", ["* * * *", "* * * * * *", "", "   ", "0 0 * * * 2026"])
def test_a_wrong_number_of_fields(db, cron):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert 'argument "cron"' in str(e) and "5 fields" in str(e)


@pytest.mark.parametrize("cron, field", [
    ("60 * * * *", "minute"), ("* 24 * * *", "hour"), ("* * 0 * *", "day-of-month"),
    ("* * 32 * *", "day-of-month"), ("* * * 13 *", "month"), ("* * * 0 *", "month"),
    ("* * * * 8", "day-of-week"), ("1,2,99 * * * *", "minute"), ("0-60 * * * *", "minute"),
    ("99999999999 * * * *", "minute"),
])
def test_a_value_out_of_range(db, cron, field):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert f'argument "cron" has a bad {field} field' in str(e) and "out of range" in str(e)


@pytest.mark.parametrize("cron, field", [("*/0 * * * *", "minute"), ("* 1-5/0 * * *", "hour"),
                                         ("* * 3/0 * *", "day-of-month")])
def test_a_step_of_zero(db, cron, field):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert f'argument "cron" has a bad {field} field' in str(e) and "step" in str(e)


@pytest.mark.parametrize("cron, field", [("5-1 * * * *", "minute"), ("* 22-2 * * *", "hour"),
                                         ("* * * DEC-JAN *", "month"), ("* * * * FRI-MON", "day-of-week"),
                                         ("* * * * 6-2/2", "day-of-week")])
def test_a_reversed_range(db, cron, field):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert f'argument "cron" has a bad {field} field' in str(e) and "reversed" in str(e)


@pytest.mark.parametrize("cron, field", [("* * * FOO *", "month"), ("* * * * MONDAY", "day-of-week"),
                                         ("* * * * JAN", "day-of-week"), ("* * * MON *", "month"),
                                         ("x * * * *", "minute"), ("* * L * *", "day-of-month")])
def test_an_unknown_name(db, cron, field):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert f'argument "cron" has a bad {field} field' in str(e) and "not a number" in str(e)


@pytest.mark.parametrize("cron, field", [("1,,2 * * * *", "minute"), ("*/ * * * *", "minute"),
                                         ("1-2-3 * * * *", "minute"), ("*/2/3 * * * *", "minute"),
                                         ("* ** * * *", "hour"), ("* * * * 1-", "day-of-week"),
                                         ("* * ? * *", "day-of-month"), ("-1 * * * *", "minute"),
                                         ("* * * * */x", "day-of-week"), ("*5 * * * *", "minute")])
def test_malformed_syntax(db, cron, field):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert f'argument "cron" has a bad {field} field' in str(e)


@pytest.mark.parametrize("cron", ["@reboot", "@every 5m", "@", "@dayly"])
def test_an_unknown_macro(db, cron):
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert 'argument "cron" is not a known macro' in str(e)


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30-31 FEB *"])
def test_an_expression_that_never_matches(db, cron):
    """A decision (croniter also refuses these): 22023 at once, not a search that gives up."""
    e = error_of(db, "SELECT pgq.cron_next(%s, now())", (cron,))
    assert e.sqlstate == "22023"
    assert 'argument "cron" never matches' in str(e) and "day-of-month" in str(e)
    with pytest.raises(Exception):  # noqa: B017 - croniter's own error types differ between its versions
        croniter(cron, datetime(2026, 1, 1)).get_next(datetime)


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "Europe/Berlin ", "Not a zone"])
def test_an_unknown_timezone(db, tz):
    e = error_of(db, "SELECT pgq.cron_next('* * * * *', now(), %s)", (tz,))
    assert e.sqlstate == "22023"
    assert 'argument "timezone"' in str(e)


@pytest.mark.parametrize("args, argument", [
    ("NULL, now(), 'UTC'", "cron"), ("'* * * * *', NULL, 'UTC'", "after"),
    ("'* * * * *', now(), NULL", "timezone"),
])
def test_null_arguments(db, args, argument):
    e = error_of(db, f"SELECT pgq.cron_next({args})", ())
    assert e.sqlstate == "22004"
    assert f'argument "{argument}" must not be NULL' in str(e)


@pytest.mark.parametrize("after", ["infinity", "-infinity"])
def test_an_infinite_after(db, after):
    e = error_of(db, "SELECT pgq.cron_next('* * * * *', %s::timestamptz)", (after,))
    assert e.sqlstate == "22023"
    assert 'argument "after"' in str(e)


# Privileges ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_every_role_may_call_cron_next_and_none_its_helpers(db, role):
    db.execute(f"SET ROLE {role}")
    try:
        assert cron_next(db, "@hourly", utc(2026, 1, 1, 0, 30)) == utc(2026, 1, 1, 1)
        for name in HELPERS:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(f"SELECT pgq.{name}({helper_args(db, name)})")
    finally:
        db.execute("RESET ROLE")


def helper_args(conn: psycopg.Connection, name: str) -> str:
    types = one(conn, "SELECT array_agg(format_type(t, NULL) ORDER BY n) FROM pg_proc AS p, "
                      "unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n) "
                      "WHERE p.pronamespace = 'pgq'::regnamespace AND p.proname = %s", (name,))
    return ", ".join(f"NULL::{t}" for t in types)


def test_grants_definer_and_pinned_search_path(db):
    rows = db.execute("""
        SELECT p.proname, p.prosecdef, p.proconfig,
               EXISTS (SELECT FROM aclexplode(p.proacl) AS a WHERE a.grantee = 0) AS public_may,
               p.proacl IS NULL AS default_acl
        FROM pg_proc AS p
        WHERE p.pronamespace = 'pgq'::regnamespace AND (p.proname LIKE '\\_cron%%' OR p.proname = 'cron_next')
        """).fetchall()
    by_name = {r[0]: r[1:] for r in rows}
    assert set(by_name) == set(HELPERS) | {"cron_next"}
    for name, (secdef, _config, public_may, default_acl) in by_name.items():
        assert not public_may and not default_acl, f"PUBLIC may execute pgq.{name}"
        assert secdef == (name == "cron_next"), name
    assert "search_path=pgq, pg_temp" in by_name["cron_next"][1]

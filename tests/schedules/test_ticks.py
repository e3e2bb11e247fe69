"""The pure tick rules (astraeus.schedules): cron lines on a time zone's wall clock, DST (a skipped hour ticks once
at the shift, a repeated hour once on its first pass), and which ticks are due or missed at an instant."""

from __future__ import annotations

import datetime as dt

import pytest

from astraeus import schedules as P

BERLIN = "Europe/Berlin"


def utc(s: str) -> float:
    return dt.datetime.fromisoformat(s).replace(tzinfo=dt.UTC).timestamp()


def shown(ticks) -> list[tuple[str, str]]:
    return [(t.name, dt.datetime.fromtimestamp(t.at, dt.UTC).strftime("%m-%d %H:%M")) for t in ticks]


def test_a_daily_line_ticks_on_the_zones_wall_clock_winter_and_summer():
    assert shown(P.next_ticks("0 2 * * *", BERLIN, utc("2026-01-10T00:00"), 2)) == [
        ("202601100200", "01-10 01:00"), ("202601110200", "01-11 01:00")]
    assert shown(P.next_ticks("0 2 * * *", BERLIN, utc("2026-07-09T23:00"), 1)) == [("202607100200", "07-10 00:00")]
    assert shown(P.next_ticks("0 2 * * *", "UTC", utc("2026-07-10T00:00"), 1)) == [("202607100200", "07-10 02:00")]


def test_a_tick_in_the_skipped_hour_happens_once_at_the_shift():
    # Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist that night.
    ticks = P.next_ticks("30 2 * * *", BERLIN, utc("2026-03-28T12:00"), 3)
    assert shown(ticks) == [("202603290300", "03-29 01:00"), ("202603300230", "03-30 00:30"),
                            ("202603310230", "03-31 00:30")]


def test_every_tick_of_the_skipped_hour_is_one_tick_at_the_shift():
    ticks = P.next_ticks("*/20 * * * *", BERLIN, utc("2026-03-29T00:30"), 4)
    # 01:40 CET, then 02:00/02:20/02:40 (skipped) and 03:00 are one tick at the shift, then 03:20 CEST
    assert shown(ticks) == [("202603290140", "03-29 00:40"), ("202603290300", "03-29 01:00"),
                            ("202603290320", "03-29 01:20"), ("202603290340", "03-29 01:40")]


def test_a_repeated_hour_ticks_once_on_its_first_pass():
    # Berlin, 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:00-03:00 happens twice.
    assert shown(P.next_ticks("30 2 * * *", BERLIN, utc("2026-10-24T12:00"), 2)) == [
        ("202610250230", "10-25 00:30"), ("202610260230", "10-26 01:30")]
    hourly = P.next_ticks("0 * * * *", BERLIN, utc("2026-10-24T23:30"), 3)
    assert shown(hourly) == [("202610250200", "10-25 00:00"), ("202610250300", "10-25 02:00"),
                             ("202610250400", "10-25 03:00")]
    names = [t.name for t in P.next_ticks("*/15 * * * *", BERLIN, utc("2026-10-24T23:00"), 16)]
    assert len(names) == len(set(names))  # a tick's name is never used twice
    # asked from inside the second pass, the next tick is after it
    assert shown(P.next_ticks("*/20 * * * *", BERLIN, utc("2026-10-25T01:10"), 1)) == [("202610250300", "10-25 02:00")]


def test_missed_ticks_inside_the_deadline_are_each_due_outside_skipped_together():
    first = utc("2026-01-10T10:00")
    d = P.due("* * * * *", "UTC", first, utc("2026-01-10T10:30"), 300)
    assert d.missed is not None and d.missed.count == 25
    assert (d.missed.first.name, d.missed.last.name) == ("202601101000", "202601101024")
    assert [t.name for t in d.due] == [f"2026011010{m}" for m in range(25, 31)]
    assert d.next.name == "202601101031"
    assert "25 ticks (202601101000 to 202601101024) missed by more than the starting deadline of 300s" in \
        d.missed.describe(300)
    on_time = P.due("* * * * *", "UTC", first, first + 5, 300)
    assert on_time.missed is None and [t.name for t in on_time.due] == ["202601101000"]
    nothing = P.due("* * * * *", "UTC", first, first - 1, 300)
    assert nothing.due == [] and nothing.missed is None and nothing.next.at == first


def test_a_week_of_missed_minutes_is_counted_without_walking_it_all():
    d = P.due("* * * * *", "UTC", utc("2026-01-01T00:00"), utc("2026-01-08T00:00"), 600)
    assert d.missed.more and "more than 1000 ticks" in d.missed.describe(600)
    assert [t.name for t in d.due][0] == "202601072350" and len(d.due) == 11


@pytest.mark.parametrize("line,words", [
    ("0 2 * *", "has 4 fields: a cron line has five"),
    ("0 2 * * * *", "has 6 fields"),
    ("61 * * * *", "is not a valid cron line"),
    ("", "give a cron line of five fields"),
    ("0 0 31 2 *", "never ticks: no date matches it"),
])
def test_bad_cron_lines_say_what_a_cron_line_is(line, words):
    with pytest.raises(ValueError, match=words):
        P.check_cron(line)


def test_unknown_time_zone_names_an_example():
    with pytest.raises(ValueError, match="unknown time zone 'Europe/Berlim': use an IANA"):
        P.check_timezone("Europe/Berlim")
    assert P.check_timezone("Europe/Berlin").key == "Europe/Berlin"

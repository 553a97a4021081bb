"""Scheduled and predicted capacity of a node group: a floor by time of day, and a floor learned
from the request rate a period ago.

A group's ``schedule`` raises its floor (``min_size``) inside named windows of the week, in one time
zone: capacity is in place before a known peak instead of being added once queues build. Each
target renders the same windows: EC2 as the auto scaling group's scheduled actions (one to raise
the floor at a window's start, one to restore the group's own at its end), Kubernetes as KEDA cron
triggers, and the local autoscaler reads them itself. Windows of one group may not overlap: two
floors at once have no single meaning, so the stack is refused naming both windows. A window ends
on the day it starts; one that runs past midnight is written as two.

``forecast`` scales ahead of a recurring peak learned from the group's own published load: the
floor at ``now`` is what the load a ``period_s`` ago, ``lead_s`` later, needed (a seasonal-naive
forecast, the baseline every forecasting method is judged against). On EC2 this is the auto scaling
group's predictive scaling policy on the same metric, which AWS fits to 14 days of it; the local
autoscaler applies the rule above to what it has scraped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, time
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from frontier_settings import FieldProblem, FieldProblems
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CLOCK = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScheduleWindow(_Model):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,40}$")
    days: tuple[Day, ...] = Field(default=DAYS, min_length=1)
    start: str = Field(pattern=CLOCK, description="HH:MM, in the schedule's time zone.")
    end: str = Field(pattern=CLOCK, description="HH:MM, after start, the same day.")
    min_size: int = Field(ge=0, le=1000, description="The group's floor inside the window.")

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> ScheduleWindow:
        if self.end <= self.start:
            raise FieldProblems(
                FieldProblem(
                    "end",
                    self.end,
                    f"must be after {{start}} ({self.start}) on the same day; a window past midnight is "
                    "written as two",
                )
            )
        return self

    def covers(self, when: datetime) -> bool:
        """Whether ``when`` (already in the schedule's zone) lies inside this window."""
        clock = when.time()
        return DAYS[when.weekday()] in self.days and _clock(self.start) <= clock < _clock(self.end)


class Forecast(_Model):
    period_s: int = Field(default=86_400, ge=600, le=7 * 86_400, description="The load's period (a day).")
    lead_s: int = Field(default=900, ge=0, le=3_600, description="How far ahead of the load to scale.")
    per_host_load: float = Field(
        gt=0, le=100_000, description="Requests in flight one host carries (running + waiting)."
    )


class Schedule(_Model):
    timezone: str = "UTC"
    windows: tuple[ScheduleWindow, ...] = ()
    forecast: Forecast | None = None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (an IANA name such as UTC or Europe/Berlin)"
            ) from None
        return value

    @model_validator(mode="after")
    def _windows_do_not_overlap(self) -> Schedule:
        problems = []
        names = [w.name for w in self.windows]
        for i, window in enumerate(self.windows):
            if window.name in names[:i]:
                problems.append(
                    FieldProblem(f"windows[{i}].name", window.name, "is the name of an earlier window")
                )
            for j, other in enumerate(self.windows[:i]):
                shared = [d for d in window.days if d in other.days]
                if shared and window.start < other.end and other.start < window.end:
                    problems.append(
                        FieldProblem(
                            f"windows[{i}]",
                            None,
                            f"window {window.name!r} ({window.start}-{window.end}) overlaps window {other.name!r} "
                            f"(windows[{j}], {other.start}-{other.end}) on {', '.join(shared)}",
                        )
                    )
        if problems:
            raise FieldProblems(*problems)
        return self

    def floor_at(self, when: datetime) -> int | None:
        """The floor the windows set at ``when`` (any zone; naive means UTC), or None outside them."""
        local = (when if when.tzinfo else when.replace(tzinfo=ZoneInfo("UTC"))).astimezone(
            ZoneInfo(self.timezone)
        )
        for window in self.windows:
            if window.covers(local):
                return window.min_size
        return None


def forecast_floor(forecast: Forecast, history: Sequence[tuple[float, float]], now: float) -> int | None:
    """Hosts the load seen one period ago, ``lead_s`` after ``now``, needed: the most in flight over
    the lead (running + waiting, summed over the group) divided by what a host carries, rounded up.
    ``history`` is (unix time, load) samples; None when it does not reach back a period."""
    if not history or history[0][0] > now - forecast.period_s:
        return None
    start, end = now - forecast.period_s, now - forecast.period_s + max(forecast.lead_s, 1)
    seen = [load for at, load in history if start <= at <= end]
    if not seen:
        return None
    return math.ceil(max(seen) / forecast.per_host_load)


def cron_of(window: ScheduleWindow, at: str) -> str:
    """``at`` (the window's start or end, HH:MM) on its days, as a cron expression (min hour * * days)."""
    hour, minute = at.split(":")
    days = ",".join(str((DAYS.index(d) + 1) % 7) for d in window.days)  # cron: 0 = Sunday
    return f"{int(minute)} {int(hour)} * * {days}"


def _clock(text: str) -> time:
    hour, minute = text.split(":")
    return time(int(hour), int(minute))

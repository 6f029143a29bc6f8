"""A page's state, all of it in the URL: the time range (Grafana's ``from``/``to``, absolute
days or relative to today: ``now-6d`` .. ``now``), the number of top values ``k``, the
auto-refresh interval ``refresh``, and the output ``format`` (the page, or its JSON or CSV
twin). Copying a URL reproduces the page; a bad value is refused naming the parameter.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from urllib.parse import urlencode

from veil.server.analysis.sources import MAX_DAYS
from veil.shared.errors import ParameterError

#: relative days as Grafana writes them: ``now``, ``now-7d`` (days only: data is daily)
RELATIVE = re.compile(r"now(?:-(\d{1,4})d)?")
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
#: the range a page shows without one in its URL: the last 7 days, today included
DEFAULT_FROM = "now-6d"
DEFAULT_TO = "now"
DEFAULT_K = 5
MAX_K = 50
#: auto-refresh choices (seconds), as Grafana offers them; "" is off
REFRESH = {"": 0, "10s": 10, "30s": 30, "1m": 60, "5m": 300, "15m": 900}
FORMATS = ("html", "json", "csv")
#: the relative ranges the range picker offers
QUICK_RANGES = (("now", "Today"), ("now-6d", "Last 7 days"), ("now-29d", "Last 30 days"),
                ("now-89d", "Last 90 days"))


def resolve_day(value: str, field: str, today: dt.date) -> dt.date:
    """``value`` (``now``, ``now-Nd`` or ``YYYY-MM-DD``) as a date."""
    relative = RELATIVE.fullmatch(value)
    if relative:
        return today - dt.timedelta(days=int(relative[1] or 0))
    if DAY.fullmatch(value):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise ParameterError(field, f"{field} must be a day (YYYY-MM-DD), now, or now-Nd such as "
                                f"now-6d; got {value!r}")


def count(value: str, field: str, least: int = 1, most: int = 10**15) -> int:
    """A whole number a form or a URL gives, written in ASCII digits, from ``least`` to
    ``most`` (other digits, such as superscripts, pass ``isdigit`` but not ``int``; checked
    before anything of that size is built); :class:`ParameterError` naming ``field``."""
    text = value.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 16) \
            or not least <= int(text) <= most:
        raise ParameterError(field, f"{field} must be a whole number from {least} to {most:,}; "
                                    f"got {value[:40]!r}")
    return int(text)


@dataclasses.dataclass(frozen=True)
class PageState:
    """What the URL says: ``start``/``end`` as written and as resolved days, ``k``,
    ``refresh`` and ``format``."""

    range_from: str = DEFAULT_FROM
    range_to: str = DEFAULT_TO
    start: str = ""
    end: str = ""
    k: int = DEFAULT_K
    refresh: str = ""
    format: str = "html"

    @classmethod
    def from_args(cls, args: Mapping[str, str], today: dt.date | None = None) -> PageState:
        """Parse a request's query; :class:`ParameterError` naming the bad parameter."""
        today = today or dt.datetime.now(dt.UTC).date()
        range_from = args.get("from") or DEFAULT_FROM
        range_to = args.get("to") or DEFAULT_TO
        first = resolve_day(range_from, "from", today)
        last = resolve_day(range_to, "to", today)
        if first > last:
            raise ParameterError("from", f"from ({range_from}) must not be after to ({range_to})")
        # as a day-by-day decode: one request cannot ask for a row or a read a day of millennia
        if (last - first).days + 1 > MAX_DAYS:
            raise ParameterError("from", f"a range covers at most {MAX_DAYS} days; from "
                                         f"({range_from}) to ({range_to}) covers "
                                         f"{(last - first).days + 1}")
        k = count(args.get("k") or str(DEFAULT_K), "k", 1, MAX_K)
        refresh = args.get("refresh") or ""
        if refresh not in REFRESH:
            raise ParameterError("refresh", f"refresh must be one of "
                                            f"{', '.join(r for r in REFRESH if r)} (or empty: "
                                            f"off); got {refresh!r}")
        output = args.get("format") or "html"
        if output not in FORMATS:
            raise ParameterError("format", f"format must be one of {', '.join(FORMATS)}; "
                                           f"got {output!r}")
        return cls(range_from, range_to, first.isoformat(), last.isoformat(), k,
                   refresh, output)

    @property
    def days(self) -> list[str]:
        """Every day of the range, oldest first."""
        first = dt.date.fromisoformat(self.start)
        count = (dt.date.fromisoformat(self.end) - first).days + 1
        return [(first + dt.timedelta(days=offset)).isoformat() for offset in range(count)]

    @property
    def refresh_seconds(self) -> int:
        """Seconds between automatic reloads (0: off)."""
        return REFRESH[self.refresh]

    def query(self, **changes: str | int | None) -> str:
        """This state's query string with ``changes`` (None drops a parameter); defaults
        are left out, so URLs stay short."""
        values: dict[str, str | int | None] = {
            "from": self.range_from if self.range_from != DEFAULT_FROM else None,
            "to": self.range_to if self.range_to != DEFAULT_TO else None,
            "k": self.k if self.k != DEFAULT_K else None,
            "refresh": self.refresh or None,
        }
        values.update(changes)
        return urlencode({key: value for key, value in values.items() if value not in (None, "")})

"""How the decode and scaling benchmarks run and what they record.

Owns the time budget of one benchmark row (calibrate once, then a fixed number of rounds
so the whole suite stays within minutes), the figures stored in each row's
``extra_info`` (events, body bytes, argument bytes, its baseline) and the per-group
summary printed at the end of a run: median, events/s, MB/s and each row's ratio to its
group's baseline row (callgate for peer groups, the smallest case for scaling groups).
``report.py`` reads the same ``extra_info`` from the JSON. It never generates streams.

Peer groups compare per event (time per event of the row / time per event of the
baseline), so a row that ran on a shorter stream than its group (the SDKs on the L size)
still compares fairly; on the same stream that equals the ratio of medians. Scaling
groups compare medians (``per_event=False``): that ratio is the growth factor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

__all__ = ["ROWS", "Row", "format_summary", "record", "run_budgeted", "timed_median"]

T = TypeVar("T")


@dataclass
class Row:
    group: str
    name: str
    median: float
    events: int
    body_bytes: int
    baseline: bool
    note: str
    ratio_per_event: bool = True

    def cost(self) -> float:
        """What the ratio column compares: time per event, or the median itself."""
        return self.median / max(1, self.events) if self.ratio_per_event else self.median


ROWS: list[Row] = []


def run_budgeted(
    benchmark: Any,
    fn: Callable[[], T],
    *,
    budget: float = 0.6,
    min_rounds: int = 3,
    max_rounds: int = 100,
) -> T:
    """Run ``fn`` under pytest-benchmark for about ``budget`` seconds (at least
    ``min_rounds`` rounds). Untimed calls first warm caches, then calibrate."""
    # The first call of a row pays one-time costs (lazy imports, an SDK client, cold
    # caches): calibrated on it, a 30 µs body got one call per round while its peer got
    # dozens (and an SDK row got 3 rounds), so rows were timed under different
    # conditions. Calibrate on warm calls: the fastest of three for a short body.
    if getattr(benchmark, "disabled", False):
        # --benchmark-disable (the CI smoke): nothing is timed, the body runs once.
        return cast("T", benchmark.pedantic(fn, rounds=1, iterations=1))
    fn()
    once = _timed(fn)
    if once < budget / 10:
        once = min(once, _timed(fn), _timed(fn))
    once = max(once, 1e-7)
    # Rounds of at least ~2 ms, so timer resolution and loop overhead do not show.
    iterations = max(1, int(0.002 / once))
    rounds = int(budget / (once * iterations))
    rounds = max(min_rounds, min(max_rounds, rounds))
    result = benchmark.pedantic(fn, rounds=rounds, iterations=iterations, warmup_rounds=0)
    return result


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_median(benchmark: Any) -> float | None:
    """The row's median in seconds; None under ``--benchmark-disable`` (a correctness
    pass that runs each body once and times nothing)."""
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else float(stats.stats.median)


def record(
    benchmark: Any,
    *,
    events: int,
    body_bytes: int,
    arg_bytes: int,
    baseline: bool,
    note: str = "",
    per_event: bool = True,
    **extra: Any,
) -> None:
    """Store a row's figures in ``extra_info`` (for the JSON) and in ``ROWS`` (for the
    terminal summary)."""
    info = benchmark.extra_info
    info.update(
        events=events,
        body_bytes=body_bytes,
        arg_bytes=arg_bytes,
        baseline=baseline,
        note=note,
        ratio_per_event=per_event,
        **extra,
    )
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable: nothing was timed
        return
    median = stats.stats.median
    info["events_per_s"] = events / median
    info["mb_per_s"] = body_bytes / median / 1e6
    ROWS.append(
        Row(
            group=benchmark.group or "",
            name=benchmark.name,
            median=median,
            events=events,
            body_bytes=body_bytes,
            baseline=baseline,
            note=note,
            ratio_per_event=per_event,
        )
    )


def _fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:,.2f} {unit}"
    return f"{seconds * 1e9:,.0f} ns"


def format_summary(rows: list[Row]) -> list[str]:
    """One block per group: row, median, events/s, MB/s, ratio to the group baseline."""
    lines: list[str] = []
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    for group in sorted(groups):
        members = groups[group]
        base = next((r for r in members if r.baseline), None)
        lines.append(f"{group}")
        for r in members:
            ratio = f"{r.cost() / base.cost():8.2f}x" if base is not None else "        -"
            lines.append(
                f"  {r.name:<58} {_fmt_time(r.median):>12} {r.events / r.median:>14,.0f} ev/s "
                f"{r.body_bytes / r.median / 1e6:>9,.1f} MB/s {ratio}"
                + (f"  ({r.note})" if r.note else "")
            )
    return lines

"""The dashboard's charts over time as SVG geometry, which the template draws: served by the
admin itself, with no script and no asset from elsewhere. A chart is either stacked bars (a
bar per bucket, a segment per series) or lines (a point per bucket with a value)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils.translation import ngettext

from ..housekeeping import rollups
from . import dashboard_series as series
from .dashboard_series import Bucket, Timeline

WIDTH, HEIGHT = 560, 150
LEFT, BOTTOM, TOP = 52, 18, 8  # room for the axes' labels
X_TICKS = 6

Value = Callable[[Bucket], float | None]


@dataclass(frozen=True)
class Series:
    name: str  # its CSS class is dsch-<name>
    label: str  # the legend's
    value: Value
    # What a count of it reads as, singular and plural, where that is not the label itself.
    counted: tuple[str, str] | None = None

    def of(self, n: int) -> str:
        """The words after a count of ``n`` of this series."""
        return self.label if self.counted is None else ngettext(*self.counted, n)


@dataclass
class Chart:
    slug: str
    title: str
    unit: str
    legend: list[Series]
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[dict[str, object]] = field(default_factory=list)  # per bucket: its segments
    lines: list[dict[str, object]] = field(default_factory=list)  # per series: points, dots
    y_ticks: list[dict[str, object]] = field(default_factory=list)
    x_ticks: list[dict[str, object]] = field(default_factory=list)
    largest: float = 0.0
    left: int = LEFT  # where the plot begins, right of the values' labels

    @property
    def empty(self) -> bool:
        return not self.largest


def _label(bucket: Bucket, timeline: Timeline) -> str:
    if timeline.range.name == "week":
        return f"{bucket.start:%a %H:%M}"
    return f"{bucket.start:%H:%M}"


def _frame(chart: Chart, timeline: Timeline, largest: float, fmt: Callable[[float], str]) -> float:
    """Set the axes' ticks; the height of one unit."""
    chart.largest = largest
    plot = chart.height - BOTTOM - TOP
    top = largest or 1.0
    chart.y_ticks = [
        {"y": round(TOP + plot * (1 - share), 1), "label": fmt(top * share)} for share in (0.0, 0.5, 1.0)
    ]
    step = max(1, len(timeline.buckets) // X_TICKS)
    slot = (chart.width - LEFT) / len(timeline.buckets)
    chart.x_ticks = [
        {"x": round(LEFT + slot * i, 1), "label": _label(bucket, timeline)}
        for i, bucket in enumerate(timeline.buckets)
        if i % step == 0
    ]
    return plot / top


def _count(n: float) -> str:
    return f"{n:,.0f}" if n >= 10 or n == int(n) else f"{n:.1f}"


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def bars(slug: str, title: str, timeline: Timeline, stack: list[Series]) -> Chart:
    """A bar per bucket, its series stacked from the bottom."""
    chart = Chart(slug, title, "runs", stack)
    totals = [sum(s.value(b) or 0 for s in stack) for b in timeline.buckets]
    scale = _frame(chart, timeline, max(totals, default=0), _count)
    slot = (chart.width - LEFT) / len(timeline.buckets)
    for i, bucket in enumerate(timeline.buckets):
        base = float(chart.height - BOTTOM)
        segments = []
        for s in stack:
            n = s.value(bucket) or 0
            if n:
                h = n * scale
                base -= h
                segments.append(
                    {
                        "series": s.name,
                        "label": s.of(round(n)),
                        "n": _count(n),
                        "y": round(base, 1),
                        "height": round(h, 1),
                    }
                )
        chart.bars.append(
            {
                "x": round(LEFT + slot * i + 1, 1),
                "width": round(max(slot - 2, 1), 1),
                "segments": segments,
                "when": _label(bucket, timeline),
            }
        )
    return chart


def lines(
    slug: str, title: str, timeline: Timeline, drawn: list[Series], fmt: Callable[[float], str]
) -> Chart:
    """A line per series through the buckets that have a value (a point at each)."""
    chart = Chart(slug, title, "", drawn)
    values = [[s.value(b) for b in timeline.buckets] for s in drawn]
    scale = _frame(chart, timeline, max((v for vs in values for v in vs if v is not None), default=0), fmt)
    slot = (chart.width - LEFT) / len(timeline.buckets)
    for s, vs in zip(drawn, values, strict=True):
        dots = [
            {
                "x": round(LEFT + slot * (i + 0.5), 1),
                "y": round(chart.height - BOTTOM - v * scale, 1),
                "label": fmt(v),
                "when": _label(b, timeline),
            }
            for i, (b, v) in enumerate(zip(timeline.buckets, vs, strict=True))
            if v is not None
        ]
        points = " ".join(f"{d['x']},{d['y']}" for d in dots)
        chart.lines.append({"series": s.name, "label": s.label, "points": points, "dots": dots})
    return chart


def charts(timeline: Timeline) -> list[Chart]:
    """The dashboard's charts over time, in their order."""

    def key(name: str) -> Value:
        return lambda bucket: bucket.counts[name]

    return [
        bars(
            "throughput",
            "Runs by outcome",
            timeline,
            [
                Series("succeeded", "succeeded", key(series.SUCCEEDED)),
                Series("dead_letter", "dead-lettered", key(series.DEAD_LETTER)),
                Series("cancelled", "cancelled", key(series.CANCELLED)),
            ],
        ),
        bars(
            "failures",
            "Failures",
            timeline,
            [
                Series("retried", "failed, retried", key(rollups.RETRIES), series.RETRIED),
                Series("dead_letter", "dead-lettered", key(series.DEAD_LETTER)),
            ],
        ),
        lines(
            "lag",
            "Pickup lag",
            timeline,
            [
                Series("p50", "p50", lambda b: b.lag(0.5)),
                Series("p95", "p95", lambda b: b.lag(0.95)),
            ],
            _seconds,
        ),
        lines(
            "depth",
            "Queue depth (average waiting)",
            timeline,
            [Series("depth", "waiting", lambda b: b.depth)],
            _count,
        ),
        bars(
            "chains",
            "Batches and follow-ups",
            timeline,
            [
                Series("batches", "batches completed", key(rollups.BATCHES), series.BATCHES_COMPLETED),
                Series(
                    "follow_ups", "follow-ups enqueued", key(rollups.FOLLOW_UPS), series.FOLLOW_UPS_ENQUEUED
                ),
            ],
        ),
    ]

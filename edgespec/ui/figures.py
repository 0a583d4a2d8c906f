"""The chat app's step chart: accepted tokens per verification step, as a small HTML/SVG
fragment. Colours come from the drafter registry, so a new drafter is drawn without a
change here.

It is plain markup, as the gauge is (``ui/gauge.py``): a Plotly figure would make the page
load and start Plotly at the end of the first answer, seconds of the browser's main thread
on a 2-core CPU, and draw it again at the end of every answer after it (docs/app-cost.md).
Each mark's ``<title>`` is its hover text: what the step did, and why."""

from __future__ import annotations

import html
from dataclasses import dataclass

from edgespec.decoding.drafters import NONE, NONE_COLOUR, REGISTRY
from edgespec.decoding.events import Step
from edgespec.ui.reasons import reason_words

DRAFTER_COLOURS = {**{name: spec.colour for name, spec in REGISTRY.items()}, NONE: NONE_COLOUR}
UNKNOWN_COLOUR = "#6b7280"  # a drafter the registry does not name (never silently dropped)
DRAFTED_COLOUR = "rgba(156,163,175,0.35)"
CHART_TITLE = "Accepted tokens per step"
DRAFTED_NAME = "drafted (γ)"
NO_DRAFT_NAME = "no draft (target alone)"
NO_STEPS_TEXT = "The chart of the answer's steps appears when it ends."

# The drawing's own units (it scales to its panel's width): the plot area inside margins
# that leave room for the axes' numbers and names.
_WIDTH, _HEIGHT = 560, 220
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 10, 8, 38
_PLOT_W, _PLOT_H = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
_BAR_SHARE = 0.85  # of a step's band; the rest is the gap between bars
_MARK_PX = 9  # the widest a step-without-draft mark gets, so that a few steps read as marks


def drafter_colour(name: str) -> str:
    return DRAFTER_COLOURS.get(name, UNKNOWN_COLOUR)


@dataclass(frozen=True)
class Point:
    step: int  # 1-based
    value: int
    hover: str


@dataclass(frozen=True)
class Series:
    """One kind of mark: its legend name, its colour and a point per step it covers, drawn
    as bars up to each value or, for steps with no draft, as a short line on the axis."""

    name: str
    colour: str
    points: list[Point]
    bars: bool = True


def _hover(number: int, step: Step) -> str:
    return (
        f"step {number}: {step.drafter}, γ {step.gamma} (planned {step.planned_gamma}), "
        f"accepted {step.accepted}\n{reason_words(step)}"
    )


def step_series(steps: list[Step]) -> list[Series]:
    """What the chart draws: a faint bar of what was drafted, then one series of accepted
    tokens per drafter (registry order first, then any name it does not know, so that no
    step goes undrawn), then the steps with no draft, at 0: a mark, so that they show
    without looking like an accepted token."""
    numbered = [(n, s, _hover(n, s)) for n, s in enumerate(steps, start=1)]
    drafting = [(n, s, h) for n, s, h in numbered if s.gamma > 0]
    series = []
    if drafting:
        series.append(Series(DRAFTED_NAME, DRAFTED_COLOUR, [Point(n, s.gamma, h) for n, s, h in drafting]))
    for drafter in dict.fromkeys([*REGISTRY, *(s.drafter for _, s, _ in drafting)]):
        picked = [Point(n, s.accepted, h) for n, s, h in drafting if s.drafter == drafter]
        if picked:
            series.append(Series(f"accepted ({drafter})", drafter_colour(drafter), picked))
    plain = [Point(n, 0, h) for n, s, h in numbered if s.gamma == 0]
    if plain:
        series.append(Series(NO_DRAFT_NAME, NONE_COLOUR, plain, bars=False))
    return series


@dataclass(frozen=True)
class _Scale:
    steps: int
    most: int  # the most tokens a step drafted (at least 1: an axis of 0..1 without drafts)

    @property
    def top(self) -> float:
        return self.most * 1.05  # room above the tallest bar

    @property
    def band(self) -> float:
        return _PLOT_W / self.steps

    def x(self, step: int) -> float:
        """The left edge of a step's band."""
        return _LEFT + (step - 1) * self.band

    def y(self, value: float) -> float:
        return _TOP + _PLOT_H * (1 - value / self.top)


def _marks(series: Series, scale: _Scale) -> str:
    width = scale.band * _BAR_SHARE
    offset = (scale.band - width) / 2
    parts = []
    for p in series.points:
        title = f"<title>{html.escape(p.hover)}</title>"
        if not series.bars:
            mark = min(width, _MARK_PX)
            left = scale.x(p.step) + (scale.band - mark) / 2
            parts.append(
                f'<line data-step="{p.step}" data-y="0" x1="{left:.2f}" x2="{left + mark:.2f}" '
                f'y1="{scale.y(0):.2f}" y2="{scale.y(0):.2f}" stroke-width="3">{title}</line>'
            )
        else:
            top = scale.y(p.value)
            parts.append(
                f'<rect data-step="{p.step}" data-y="{p.value}" x="{scale.x(p.step) + offset:.2f}" '
                f'y="{top:.2f}" width="{width:.2f}" height="{scale.y(0) - top:.2f}">{title}</rect>'
            )
    paint = f'fill="{series.colour}"' if series.bars else f'stroke="{series.colour}"'
    return (
        f'<g class="series" data-series="{html.escape(series.name)}" data-colour="{series.colour}" '
        f"{paint}>{''.join(parts)}</g>"
    )


def _axes(scale: _Scale) -> str:
    """Whole numbers only, on both axes: about ten step ticks, five token ticks, and the
    axes' names."""
    y_tick = max(1, -(-scale.most // 4))
    x_tick = max(1, -(-scale.steps // 10))
    parts = [
        f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{scale.y(0):.2f}" y2="{scale.y(0):.2f}" '
        'stroke="currentColor" stroke-opacity="0.4"/>'
    ]
    for value in range(0, scale.most + 1, y_tick):
        parts.append(f'<text x="{_LEFT - 6}" y="{scale.y(value) + 4:.2f}" text-anchor="end">{value}</text>')
    for step in range(1, scale.steps + 1, x_tick):
        centre = scale.x(step) + scale.band / 2
        below = _HEIGHT - _BOTTOM + 16
        parts.append(f'<text x="{centre:.2f}" y="{below}" text-anchor="middle">{step}</text>')
    parts.append(f'<text x="{_LEFT + _PLOT_W / 2:.0f}" y="{_HEIGHT - 4}" text-anchor="middle">step</text>')
    parts.append(
        f'<text x="10" y="{_TOP + _PLOT_H / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 10 {_TOP + _PLOT_H / 2:.0f})">tokens</text>'
    )
    return f'<g class="axes" fill="currentColor" font-size="13">{"".join(parts)}</g>'


def _legend(series: list[Series]) -> str:
    chips = "".join(
        f'<span data-legend-series="{html.escape(s.name)}" style="white-space:nowrap">'
        f'<span style="display:inline-block;width:10px;height:10px;margin-right:4px;'
        f'background:{s.colour}"></span>{html.escape(s.name)}</span>'
        for s in series
    )
    return f'<div style="display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px">{chips}</div>'


def steps_chart_html(steps: list[Step]) -> str:
    """The chart of an answer's steps; before there are any, a line saying when it comes."""
    title = f'<div style="font-size:13px;font-weight:600">{CHART_TITLE}</div>'
    if not steps:
        note = f'<div style="font-size:12px;opacity:0.7">{NO_STEPS_TEXT}</div>'
        return f'<div class="steps-chart">{title}{note}</div>'
    series = step_series(steps)
    scale = _Scale(len(steps), max(max(s.gamma for s in steps), 1))
    svg = (
        f'<svg viewBox="0 0 {_WIDTH} {_HEIGHT}" style="width:100%" role="img" '
        f'aria-label="{CHART_TITLE}, {len(steps)} steps">'
        f"{_axes(scale)}{''.join(_marks(s, scale) for s in series)}</svg>"
    )
    return f'<div class="steps-chart" style="font-family:sans-serif">{title}{svg}{_legend(series)}</div>'

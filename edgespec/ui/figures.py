"""The chat app's Plotly figure: the per-step chart.
Colours come from the drafter registry, so a new drafter is drawn without a change here."""

from __future__ import annotations

import plotly.graph_objects as go

from edgespec.decoding.drafters import NONE, NONE_COLOUR, REGISTRY
from edgespec.decoding.events import Step
from edgespec.ui.reasons import reason_words

DRAFTER_COLOURS = {**{name: spec.colour for name, spec in REGISTRY.items()}, NONE: NONE_COLOUR}
UNKNOWN_COLOUR = "#6b7280"  # a drafter the registry does not name (never silently dropped)
NO_DRAFT_NAME = "no draft (target alone)"
DRAFTED_NAME = "drafted (γ)"
_FONT = {"family": "sans-serif", "size": 12}


def drafter_colour(name: str) -> str:
    return DRAFTER_COLOURS.get(name, UNKNOWN_COLOUR)


def _layout(height: int, **extra) -> dict:
    # Transparent backgrounds so the figures sit on Gradio's light and dark themes alike.
    return {
        "height": height,
        "margin": {"l": 30, "r": 30, "t": 40, "b": 20},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": _FONT,
        **extra,
    }


def steps_figure(steps: list[Step]) -> go.Figure:
    """Accepted tokens per verification step, over a faint bar of what was drafted, one
    colour per drafter. A step with no draft accepted nothing: it sits at 0 as a marker,
    so it shows without looking like an accepted token. The hover says why."""
    numbers = list(range(1, len(steps) + 1))
    hover = [
        f"step {n}: {s.drafter}, γ {s.gamma} (planned {s.planned_gamma}), accepted {s.accepted}"
        f"<br>{reason_words(s)}"
        for n, s in zip(numbers, steps, strict=True)
    ]
    drafting = [(n, s, h) for n, s, h in zip(numbers, steps, hover, strict=True) if s.gamma > 0]
    plain = [(n, h) for n, s, h in zip(numbers, steps, hover, strict=True) if s.gamma == 0]
    figure = go.Figure()
    if drafting:
        figure.add_trace(
            go.Bar(
                x=[n for n, _, _ in drafting],
                y=[s.gamma for _, s, _ in drafting],
                name=DRAFTED_NAME,
                marker={"color": "rgba(156,163,175,0.35)"},
                hoverinfo="skip",
            )
        )
    # Registry order first, then any name it does not know, so that no step goes undrawn.
    names = list(dict.fromkeys([*REGISTRY, *(s.drafter for _, s, _ in drafting)]))
    for drafter in names:
        picked = [(n, s, h) for n, s, h in drafting if s.drafter == drafter]
        if not picked:
            continue
        figure.add_trace(
            go.Bar(
                x=[n for n, _, _ in picked],
                y=[s.accepted for _, s, _ in picked],
                name=f"accepted ({drafter})",
                marker={"color": drafter_colour(drafter)},
                hovertext=[h for _, _, h in picked],
                hoverinfo="text",
            )
        )
    if plain:
        figure.add_trace(
            go.Scatter(
                x=[n for n, _ in plain],
                y=[0] * len(plain),
                mode="markers",
                name=NO_DRAFT_NAME,
                marker={"color": NONE_COLOUR, "symbol": "line-ew-open", "size": 9, "line": {"width": 3}},
                hovertext=[h for _, h in plain],
                hoverinfo="text",
                cliponaxis=False,
            )
        )
    top = max(max((s.gamma for s in steps), default=0), 1)
    figure.update_layout(
        **_layout(
            280,
            barmode="overlay",
            bargap=0.15,
            title={"text": "Accepted tokens per step", "font": {"size": 13}},
            # Whole numbers only, on both axes: about ten step ticks, five token ticks.
            xaxis={"title": {"text": "step"}, "tick0": 1, "dtick": max(1, -(-len(steps) // 10))},
            # An answer with no draft still gets a readable axis (0..1), its markers on 0.
            yaxis={"title": {"text": "tokens"}, "range": [0, top * 1.05], "dtick": max(1, -(-top // 4))},
            legend={"orientation": "h", "y": -0.35},
            showlegend=True,
        )
    )
    return figure

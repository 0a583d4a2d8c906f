"""The chat app's Plotly figures: the "Accepted tokens" gauge and the per-step chart.
Colours come from the drafter registry, so a new drafter is drawn without a change here."""

from __future__ import annotations

import plotly.graph_objects as go

from edgespec.decoding.drafters import NONE, NONE_COLOUR, REGISTRY
from edgespec.decoding.events import Step
from edgespec.ui.answer import AnswerRun
from edgespec.ui.reasons import reason_words
from edgespec.ui.text import gauge_reading

GAUGE_TITLE = "Accepted tokens"
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


def _tick(span: int) -> int | None:
    """Whole-token ticks, about eight at most; None lets Plotly choose."""
    if span <= 8:
        return 1
    return 2 if span <= 16 else None


def gauge_figure(run: AnswerRun | None) -> go.Figure:
    """Accepted out of drafted: the latest drafting step while the answer streams, the
    whole answer once it ends (``gauge_reading`` says which, in the subtitle). Two numbers
    below carry the answer's mean τ and acceptance rate."""
    accepted, drafted, lines = gauge_reading(run)
    span = max(drafted, 1)  # a zero-width axis cannot be drawn: an empty gauge spans 0..1
    figure = go.Figure()
    figure.add_trace(
        go.Indicator(
            mode="gauge+number",
            value=accepted,
            number={"suffix": f" / {drafted}", "font": {"size": 34}},
            gauge={
                "axis": {"range": [0, span], "dtick": _tick(span)},
                "bar": {"color": "#16a34a"},
                "steps": [{"range": [0, span], "color": "rgba(156,163,175,0.25)"}],
            },
            domain={"x": [0, 1], "y": [0.32, 0.9]},
        )
    )
    figure.add_trace(
        go.Indicator(
            mode="number",
            value=round(run.tau, 2) if run else 0.0,
            number={"valueformat": ".2f", "font": {"size": 22}},
            title={"text": "mean τ (tokens / target pass)", "font": {"size": 12}},
            domain={"x": [0, 0.5], "y": [0, 0.24]},
        )
    )
    if run is not None and run.drafted:
        figure.add_trace(
            go.Indicator(
                mode="number",
                value=round(100 * run.acceptance_rate, 1),
                number={"suffix": " %", "valueformat": ".0f", "font": {"size": 22}},
                title={"text": "drafts accepted", "font": {"size": 12}},
                domain={"x": [0.5, 1], "y": [0, 0.24]},
            )
        )
    else:
        # A rate over nothing drafted is no number: "0 %" would read as all drafts rejected.
        figure.add_annotation(
            text="drafts accepted<br><b>no drafts</b>",
            x=0.75,
            y=0.1,
            xref="paper",
            yref="paper",
            showarrow=False,
            font={"size": 13},
        )
    # The label sits in the layout title: an indicator's own title lands inside the arc.
    subtitle = "<br>".join(lines)
    figure.update_layout(
        **_layout(
            320,
            margin={"l": 25, "r": 25, "t": 75, "b": 10},
            title={"text": f"{GAUGE_TITLE}<br><sup>{subtitle}</sup>", "x": 0.5, "font": {"size": 16}},
        )
    )
    return figure


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

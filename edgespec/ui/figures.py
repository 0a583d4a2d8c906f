"""The chat app's Plotly figures: the live "Accepted tokens" gauge and the per-step chart."""

from __future__ import annotations

import plotly.graph_objects as go

from edgespec.decoding.events import Step

GAUGE_TITLE = "Accepted tokens"
DRAFTER_COLOURS = {"model": "#2563eb", "ngram": "#9333ea", "reflow": "#db2777", "none": "#9ca3af"}
_FONT = {"family": "sans-serif", "size": 12}


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


def gauge_figure(step: Step | None, step_number: int, tau: float, acceptance: float) -> go.Figure:
    """The gauge shows the latest drafting step (accepted out of γ); two numbers below it
    carry the running mean τ and the acceptance rate of the answer so far."""
    gamma = step.gamma if step else 0
    accepted = step.accepted if step else 0
    detail = (
        f"step {step_number}, {step.drafter} drafter, γ = {gamma}" if step else "waiting for a drafting step"
    )
    figure = go.Figure()
    figure.add_trace(
        go.Indicator(
            mode="gauge+number",
            value=accepted,
            number={"suffix": f" / {gamma}", "font": {"size": 34}},
            # A zero-width axis cannot be drawn: an empty gauge still spans 0..1.
            gauge={
                "axis": {"range": [0, max(gamma, 1)], "dtick": 1 if gamma <= 8 else 2},
                "bar": {"color": "#16a34a"},
                "steps": [{"range": [0, max(gamma, 1)], "color": "rgba(156,163,175,0.25)"}],
            },
            domain={"x": [0, 1], "y": [0.32, 0.9]},
        )
    )
    figure.add_trace(
        go.Indicator(
            mode="number",
            value=round(tau, 2),
            number={"valueformat": ".2f", "font": {"size": 22}},
            title={"text": "mean τ (tokens / target pass)", "font": {"size": 12}},
            domain={"x": [0, 0.5], "y": [0, 0.24]},
        )
    )
    figure.add_trace(
        go.Indicator(
            mode="number",
            value=round(100 * acceptance, 1),
            number={"suffix": " %", "valueformat": ".0f", "font": {"size": 22}},
            title={"text": "drafts accepted", "font": {"size": 12}},
            domain={"x": [0.5, 1], "y": [0, 0.24]},
        )
    )
    # The label sits in the layout title: an indicator's own title lands inside the arc.
    figure.update_layout(
        **_layout(
            300,
            margin={"l": 25, "r": 25, "t": 60, "b": 10},
            title={"text": f"{GAUGE_TITLE}<br><sup>{detail}</sup>", "x": 0.5, "font": {"size": 16}},
        )
    )
    return figure


def steps_figure(steps: list[Step]) -> go.Figure:
    """Accepted tokens per verification step, over a faint bar of what was drafted, one
    colour per drafter; the hover names the drafter, γ (planned and drafted) and the reason."""
    numbers = list(range(1, len(steps) + 1))
    hover = [
        f"step {n}: {s.drafter}, γ {s.gamma} (planned {s.planned_gamma}), accepted {s.accepted}"
        + (f"<br>{s.reason}" if s.reason else "")
        for n, s in zip(numbers, steps, strict=True)
    ]
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=numbers,
            y=[s.gamma for s in steps],
            name="drafted (γ)",
            marker={"color": "rgba(156,163,175,0.35)"},
            hoverinfo="skip",
        )
    )
    for drafter, colour in DRAFTER_COLOURS.items():
        picked = [(n, s, h) for n, s, h in zip(numbers, steps, hover, strict=True) if s.drafter == drafter]
        if not picked:
            continue
        figure.add_trace(
            go.Bar(
                x=[n for n, _, _ in picked],
                # A target-only step still produced one token; show it as a thin stub so
                # the step is visible rather than an empty slot.
                y=[s.accepted if s.gamma else 0.15 for _, s, _ in picked],
                name=f"accepted ({drafter})" if drafter != "none" else "no draft (target only)",
                marker={"color": colour},
                hovertext=[h for _, _, h in picked],
                hoverinfo="text",
            )
        )
    figure.update_layout(
        **_layout(
            240,
            barmode="overlay",
            bargap=0.15,
            title={"text": "Accepted tokens per step", "font": {"size": 13}},
            # Whole step numbers only, about ten ticks at most.
            xaxis={"title": {"text": "step"}, "tick0": 1, "dtick": max(1, -(-len(steps) // 10))},
            yaxis={"title": {"text": "tokens"}, "rangemode": "tozero"},
            legend={"orientation": "h", "y": -0.35},
        )
    )
    return figure

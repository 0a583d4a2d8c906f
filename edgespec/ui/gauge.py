"""The "Accepted tokens" gauge as a small HTML/SVG fragment. It is plain markup rather than
a Plotly figure so that the live feed (``ui/live.py``) can swap it in at every drafting
step for the cost of one ``innerHTML``: drawing a Plotly figure in the browser costs the
decoding, on a machine whose cores llama.cpp keeps busy, far more."""

from __future__ import annotations

import html
import math

from edgespec.ui.answer import AnswerRun
from edgespec.ui.text import gauge_reading

GAUGE_TITLE = "Accepted tokens"
ACCEPTED_COLOUR = "#16a34a"
TRACK_COLOUR = "rgba(156,163,175,0.25)"
_RADIUS = 80
_ARC = f"M{100 - _RADIUS} 100 A{_RADIUS} {_RADIUS} 0 0 1 {100 + _RADIUS} 100"
_ARC_LENGTH = math.pi * _RADIUS


def gauge_html(run: AnswerRun | None) -> str:
    """Accepted out of drafted, as an arc and a number: the latest drafting step while the
    answer streams, the whole answer once it ends (the subtitle says which). Below: the
    answer's mean τ and its acceptance rate ("no drafts" when nothing was drafted: "0 %"
    would read as every draft rejected)."""
    accepted, drafted, lines = gauge_reading(run)
    share = accepted / drafted if drafted else 0.0
    subtitle = "".join(f"<div>{html.escape(line)}</div>" for line in lines)
    tau = f"{run.tau:.2f}" if run is not None else "0.00"
    rate = f"{100 * run.acceptance_rate:.0f} %" if run is not None and run.drafted else "no drafts"
    return (
        f'<div class="gauge" data-accepted="{accepted}" data-drafted="{drafted}" '
        'style="text-align:center;font-family:sans-serif">'
        f'<div style="font-size:16px;font-weight:600">{GAUGE_TITLE}</div>'
        f'<div class="gauge-subtitle" style="font-size:12px;opacity:0.8">{subtitle}</div>'
        '<svg viewBox="0 0 200 112" style="width:100%;max-width:280px" role="img" '
        f'aria-label="{accepted} of {drafted} drafted tokens accepted">'
        f'<path d="{_ARC}" fill="none" stroke="{TRACK_COLOUR}" stroke-width="20"/>'
        f'<path d="{_ARC}" fill="none" stroke="{ACCEPTED_COLOUR}" stroke-width="20" '
        f'stroke-dasharray="{share * _ARC_LENGTH:.1f} {_ARC_LENGTH:.1f}"/>'
        f'<text class="number" x="100" y="96" text-anchor="middle" font-size="30" '
        f'fill="currentColor">{accepted} / {drafted}</text></svg>'
        '<div style="display:flex;justify-content:space-around;font-size:12px">'
        f'<div>mean τ (tokens / target pass)<div class="gauge-tau" style="font-size:20px">{tau}</div></div>'
        f'<div>drafts accepted<div class="gauge-rate" style="font-size:20px">{rate}</div></div>'
        "</div></div>"
    )

"""One palette: the step chart's drafter colours and the provenance highlights must never
be mistaken for each other (CIE76 colour difference, pure)."""

from __future__ import annotations

import itertools
import re

import pytest

from edgespec.decoding.drafters import REGISTRY
from edgespec.ui.text import PROVENANCE_STYLE

# ΔE of about 2 is barely visible; 30 and more reads as another colour at a glance.
DISTINCT = 30.0


def lab(colour: str) -> tuple[float, float, float]:
    """sRGB "#rrggbb" (or "rgba(r,g,b,a)") to CIE L*a*b* (D65)."""
    if colour.startswith("rgba"):
        red, green, blue = (int(v) / 255 for v in re.findall(r"\d+", colour)[:3])
    else:
        red, green, blue = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = linear(red), linear(green), linear(blue)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e(first: str, second: str) -> float:
    return sum((p - q) ** 2 for p, q in zip(lab(first), lab(second), strict=True)) ** 0.5


def test_delta_e_is_zero_for_one_colour_and_large_for_opposites():
    assert delta_e("#3b82f6", "#3b82f6") == 0.0
    assert delta_e("#000000", "#ffffff") == pytest.approx(100.0, abs=0.5)
    assert delta_e("#2563eb", "#3b82f6") < DISTINCT, "two blues are one colour to the eye"


# Provenance highlights are drawn translucent; their solid colour is what the eye compares.
PROVENANCE = {source: style[1] for source, style in PROVENANCE_STYLE.items()}
SOLID = {"draft": "#22c55e", "target": "#ef4444", "bonus": "#3b82f6", "plain": "#9ca3af"}


def test_the_solid_provenance_colours_are_the_ones_drawn():
    for source, solid in SOLID.items():
        red, green, blue = (int(solid[i : i + 2], 16) for i in (1, 3, 5))
        assert PROVENANCE[source].startswith(f"rgba({red},{green},{blue},")


@pytest.mark.parametrize(("drafter", "source"), list(itertools.product(REGISTRY, SOLID)))
def test_no_drafter_colour_looks_like_a_provenance_colour(drafter: str, source: str):
    assert delta_e(REGISTRY[drafter].colour, SOLID[source]) >= DISTINCT


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(REGISTRY, 2)))
def test_drafters_have_colours_of_their_own(first: str, second: str):
    assert delta_e(REGISTRY[first].colour, REGISTRY[second].colour) >= DISTINCT

"""Words and tables of the chat app: stats, speedup, provenance, errors. Pure functions of
the data, so they are easy to test and the handlers stay about control flow."""

from __future__ import annotations

import html

from edgespec.decoding.events import BONUS, DRAFT, TARGET, Stats, Step
from edgespec.ui.answer import AnswerRun

# Provenance colours: translucent, so the text stays readable on light and dark themes.
PROVENANCE_STYLE = {
    DRAFT: ("accepted draft", "rgba(34,197,94,0.35)", "a drafted token the target accepted"),
    TARGET: (
        "target's own (correction)",
        "rgba(249,115,22,0.35)",
        "the target's own token: a correction after a rejected draft, or plain decoding",
    ),
    BONUS: (
        "bonus (all drafts accepted)",
        "rgba(59,130,246,0.35)",
        "the target's extra token when every draft was accepted",
    ),
}
LENIENCE_NOTE = (
    "**λ = 1 is exact**: the answer follows the target model's own distribution. "
    "**Any other λ changes the outputs** (λ < 1 accepts more drafts): they are then no longer "
    "exactly what the target model would produce. A change applies from the next step of a "
    "running answer; it has no effect at temperature 0 (greedy)."
)
STEP_HEADERS = ["step", "drafter", "γ planned", "γ drafted", "accepted", "reason"]
_STOP_REASONS = {
    "eos": "the model ended its answer",
    "stop_string": "a stop string",
    "max_tokens": "max tokens reached",
    "context_full": "the context is full",
    "cancelled": "stopped",
}


def provenance_html(run: AnswerRun | None, colour: bool) -> str:
    """The latest answer as HTML: one coloured span per run of same-provenance tokens and
    a legend when colouring is on; the plain text when it is off."""
    text = run.text if run is not None else ""
    if not text:
        body = '<span style="opacity:0.6">The latest answer appears here, token by token.</span>'
    elif colour and run is not None:
        body = "".join(_provenance_span(piece, source) for piece, source in run.runs)
    else:
        body = html.escape(text)
    legend = _legend_html() if colour else '<div style="opacity:0.6">colouring off: plain text</div>'
    return (
        f'<div class="provenance-panel">{legend}'
        f'<div class="provenance-text" style="white-space:pre-wrap;font-family:ui-monospace,monospace;'
        f'font-size:0.9em;line-height:1.6;margin-top:6px">{body}</div></div>'
    )


def _provenance_span(text: str, source: str) -> str:
    label, background, _ = PROVENANCE_STYLE.get(source, PROVENANCE_STYLE[TARGET])
    return (
        f'<span data-source="{source}" title="{label}" '
        f'style="background:{background};border-radius:3px">{html.escape(text)}</span>'
    )


def _legend_html() -> str:
    chips = "".join(
        f'<span data-legend="{source}" title="{meaning}" style="background:{background};'
        f'border-radius:3px;padding:1px 6px;margin-right:6px">{label}</span>'
        for source, (label, background, meaning) in PROVENANCE_STYLE.items()
    )
    return f'<div class="provenance-legend" style="font-size:0.85em">{chips}</div>'


def live_stats_markdown(run: AnswerRun) -> str:
    steps = len(run.steps)
    line = f"Generating… **{run.tokens}** tokens, {steps} target passes"
    if steps:
        line += f", τ {run.tau:.2f}"
    if run.drafted:
        line += f", acceptance {100 * run.acceptance_rate:.0f}%"
    return line


def final_stats_markdown(stats: Stats, stop_reason: str) -> str:
    reason = _STOP_REASONS.get(stop_reason, stop_reason or "finished")
    acceptance = (
        f"{100 * stats.acceptance_rate:.0f}% ({stats.accepted} / {stats.drafted} drafted)"
        if stats.drafted
        else "no drafts"
    )
    rows = [
        ("tokens", f"{stats.tokens} ({reason})"),
        ("tokens/s", f"{stats.tokens_per_second:.1f}"),
        ("τ (tokens / target pass)", f"{stats.tau:.2f} over {stats.target_passes} passes"),
        ("acceptance", acceptance),
        ("time to first token", f"{stats.ttft_s:.2f} s"),
        ("time split", _time_split(stats)),
        ("prompt", f"{stats.prompt_tokens} tokens, {stats.reused_tokens} reused from the cache"),
    ]
    return "| last answer | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)


def _time_split(stats: Stats) -> str:
    parts = [
        ("prefill", stats.prefill_s),
        ("draft", stats.draft_s),
        ("verify", stats.verify_s),
        ("other", stats.other_s),
    ]
    total = stats.wall_s or 1.0
    return ", ".join(f"{name} {seconds:.2f} s ({100 * seconds / total:.0f}%)" for name, seconds in parts)


def speedup_markdown(answer_rate: float | None, baseline_rate: float | None) -> str:
    """Only ever a ratio of two rates measured here: no baseline, no speedup figure."""
    if baseline_rate is None:
        if answer_rate is None:
            return "Speedup: send a message, then **Measure baseline** to time the target model alone."
        return (
            "Speedup: no figure yet. **Measure baseline** re-runs the last prompt with the target "
            "model alone (drafter none) on this machine."
        )
    if answer_rate is None or baseline_rate <= 0:
        return f"Measured baseline: {baseline_rate:.1f} tok/s (target only). Send a message to compare."
    return (
        f"**speedup ×{answer_rate / baseline_rate:.2f} vs measured baseline ({baseline_rate:.1f} tok/s)**"
        f" — last answer {answer_rate:.1f} tok/s. The baseline is the target model alone on the last "
        "prompt, with the same settings and cache state, measured on this machine."
    )


def step_rows(steps: list[Step]) -> list[list[str | int]]:
    return [
        [n, s.drafter, s.planned_gamma, s.gamma, s.accepted, s.reason] for n, s in enumerate(steps, start=1)
    ]


def error_markdown(message: str) -> str:
    return f"⚠️ **{message}**" if message else ""

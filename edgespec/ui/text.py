"""Words and tables of the chat app: stats, speedup, provenance, errors. Pure functions of
the data, so they are easy to test and the handlers stay about control flow."""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence

from edgespec.decoding.drafters import NONE_COLOUR
from edgespec.decoding.events import BONUS, DRAFT, PLAIN, TARGET, Stats, Step
from edgespec.ui.answer import AnswerRun
from edgespec.ui.markdown_colour import coloured_markdown
from edgespec.ui.reasons import reason_words


def translucent(colour: str, alpha: float = 0.35) -> str:
    """A "#rrggbb" colour as rgba: highlighted text stays readable on light and dark themes."""
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


# Provenance of each token: (legend label, background, what it means), in legend order.
PROVENANCE_STYLE = {
    DRAFT: ("accepted draft", translucent("#22c55e"), "a drafted token the target accepted"),
    TARGET: (
        "correction",
        translucent("#ef4444"),
        "the target's own token in place of a rejected draft",
    ),
    BONUS: (
        "bonus",
        translucent("#3b82f6"),
        "the target's extra token after every drafted token was accepted",
    ),
    PLAIN: (
        "target, no draft",
        translucent(NONE_COLOUR),
        "the target's own token in a step with no draft (and the first token)",
    ),
}
LENIENCE_NOTE = (
    "**λ = 1 is exact**: the answer follows the target model's own distribution. "
    "**Any other λ changes the outputs** (λ < 1 accepts more drafts): they are then no longer "
    "exactly what the target model would produce. A change applies from the next step of a "
    "running answer; it has no effect at temperature 0 (greedy)."
)
# A provenance span's tooltip.
PROVENANCE_LABELS = {source: style[0] for source, style in PROVENANCE_STYLE.items()}
STEP_HEADERS = ["step", "drafter", "γ planned", "γ drafted", "accepted", "why"]
_STOP_REASONS = {
    "eos": "the model ended its answer",
    "stop_string": "a stop string",
    "max_tokens": "max tokens reached",
    "context_full": "the context is full",
    "cancelled": "stopped",
}


def coloured_answer(pieces: Sequence[Sequence[str]]) -> str:
    """An answer shown by provenance in its chat bubble: its Markdown rendered, with the
    provenance colours over the rendered text (``markdown_colour``), and its Markdown
    source, hidden, for the message's copy button (the page's clipboard hook copies it in
    place of this markup). One line of HTML, newlines as character references: the chat's
    Markdown would end the HTML block at a blank line (one in a code block, say)."""
    return _coloured_answer(tuple((text, source) for text, source in pieces))


# The chat is drawn again whole at every change (a message sent, the toggle, a chat
# picked), and rendering a long answer takes tens of milliseconds: its markup is kept.
@functools.lru_cache(maxsize=64)
def _coloured_answer(pieces: tuple[tuple[str, str], ...]) -> str:
    markup = coloured_markdown(pieces, PROVENANCE_LABELS)
    source = html.escape("".join(text for text, _ in pieces), quote=False)
    answer = f'<div class="prov-answer">{markup}<div class="prov-source" hidden>{source}</div></div>'
    return answer.replace("\n", "&#10;")


def provenance_pieces(pieces: Sequence[Sequence[str]], colour: bool) -> str:
    """Runs of same-provenance text as coloured spans (plain text when colouring is off)."""
    if not colour:
        return _escape("".join(text for text, _ in pieces))
    return "".join(_provenance_span(text, source) for text, source in pieces if text)


def _escape(text: str) -> str:
    return html.escape(text).replace("\n", "&#10;")


def provenance_legend(run: AnswerRun | None, colour: bool) -> str:
    if not colour:
        return '<div style="opacity:0.6">colouring off: plain text</div>'
    return _legend_html(run.sources if run is not None else {})


def _provenance_span(text: str, source: str) -> str:
    label = PROVENANCE_STYLE.get(source, PROVENANCE_STYLE[PLAIN])[0]
    # Classes, not data attributes or inline styles: the chat's sanitizer keeps classes.
    return f'<span class="prov prov-{html.escape(source)}" title="{label}">{_escape(text)}</span>'


def provenance_css() -> str:
    """The provenance classes' colours for the page. A coloured answer is laid out as the
    chat lays out Markdown; its source, kept for copying, is never shown."""
    rules = [".prov{border-radius:3px}", ".prov-source{display:none}"]
    rules += [f".prov-{source}{{background:{style[1]}}}" for source, style in PROVENANCE_STYLE.items()]
    return "\n".join(rules)


def _legend_html(counts: dict[str, int]) -> str:
    """One chip per provenance, with how many of the answer's tokens it holds."""
    chips = "".join(
        f'<span data-legend="{source}" data-count="{counts.get(source, 0)}" title="{meaning}" '
        f'class="prov prov-{source}" style="padding:1px 6px;margin:0 6px 2px 0;display:inline-block">'
        f"{label} {counts.get(source, 0)}</span>"
        for source, (label, _background, meaning) in PROVENANCE_STYLE.items()
    )
    return f'<div class="provenance-legend" style="font-size:0.85em">{chips}</div>'


def live_stats_markdown(run: AnswerRun) -> str:
    return _live_stats(run, "**{}**")


def live_stats_html(run: AnswerRun) -> str:
    return _live_stats(run, "<b>{}</b>")


def _live_stats(run: AnswerRun, bold: str) -> str:
    steps = len(run.steps)
    tokens = bold.format(run.tokens) + (" token" if run.tokens == 1 else " tokens")
    line = f"Generating… {tokens}, {_count(steps, 'target pass')}"
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
    decoded = stats.tokens > 1 and stats.target_passes > 0
    rows = [
        ("tokens", f"{stats.tokens} ({reason})"),
        ("tokens/s, end to end", f"{stats.tokens_per_second:.1f} (prompt processing included)"),
        (
            "tokens/s, decode phase",
            f"{stats.decode_tokens_per_second:.1f} (after the first token)"
            if decoded
            else "— (the answer ended at its first token: no decode phase)",
        ),
        (
            "τ (tokens after the first, per target pass)",
            _tau(stats) if decoded else "— (no pass after the first token)",
        ),
        ("acceptance", acceptance),
        ("time to first token", f"{stats.ttft_s:.2f} s (the target's prompt pass)"),
        ("time split", _time_split(stats)),
        ("prompt", f"{stats.prompt_tokens} tokens, {stats.reused_tokens} reused from the cache"),
    ]
    return "| last answer | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)


def _tau(stats: Stats) -> str:
    line = f"{stats.tau:.2f} over {_count(stats.target_passes, 'pass')}"
    if stats.tau < 1 and not stats.drafted:
        # Plain decoding gives one token a pass; the pass that ends the answer gives none.
        line += " (1 a pass without drafts, less the pass that ended the answer)"
    return line


def _time_split(stats: Stats) -> str:
    """Prefill counts both models' prompt passes: the draft's runs after the first token,
    so it can exceed the time to first token."""
    parts = [
        ("prefill (target, then draft)", stats.prefill_s),
        ("draft", stats.draft_s),
        ("verify", stats.verify_s),
        ("other", stats.other_s),
    ]
    total = stats.wall_s or 1.0
    return ", ".join(f"{name} {seconds:.2f} s ({100 * seconds / total:.0f}%)" for name, seconds in parts)


def speedup_markdown(answer_rate: float | None, baseline_rates: Sequence[float] | None) -> str:
    """Only ever a ratio of two rates measured here: no baseline, no speedup figure. The
    baseline is measured twice; both rates are shown, so their spread says how far the
    figure can be trusted."""
    if not baseline_rates:
        if answer_rate is None:
            return "Speedup: send a message, then **Measure baseline** to time the target model alone."
        return (
            "Speedup: no figure yet. **Measure baseline** re-runs the last prompt with the target "
            "model alone (drafter none) on this machine."
        )
    mean = sum(baseline_rates) / len(baseline_rates)
    runs = " and ".join(f"{rate:.1f}" for rate in baseline_rates)
    if answer_rate is None or mean <= 0:
        return f"Measured baseline: {runs} tok/s end to end (target only). Send a message to compare."
    return (
        f"**speedup ×{answer_rate / mean:.2f} vs measured baseline ({mean:.1f} tok/s)**"
        f" — this answer {answer_rate:.1f} tok/s; the baseline ran {len(baseline_rates)} times "
        f"({runs} tok/s), all end to end. The baseline is the target model alone on this "
        "answer's prompt, with the same settings and cache state, measured on this machine."
    )


def step_rows(steps: list[Step]) -> list[list[str | int]]:
    return [
        [n, s.drafter, s.planned_gamma, s.gamma, s.accepted, reason_words(s)]
        for n, s in enumerate(steps, start=1)
    ]


def gauge_reading(run: AnswerRun | None) -> tuple[int, int, list[str]]:
    """What the gauge shows: accepted out of drafted, and the lines saying what that is.
    While the answer streams, its latest drafting step; once it ends, the whole answer."""
    if run is None:
        return 0, 0, ["send a message: its drafting steps show here"]
    total = len(run.steps)
    if run.done is not None and run.drafted:
        # The drafts in the answer, as the legend counts them: a draft accepted in the
        # step where the answer ended, after its end, is not in it.
        kept = run.sources.get(DRAFT, 0)
        summary = f"whole answer: {run.drafting_steps} of {_count(total, 'step')} drafted"
        detail = f"{kept} of {run.drafted} drafted tokens accepted, τ {run.tau:.2f}"
        return kept, run.drafted, [summary, detail]
    if run.done is not None:
        if total:
            detail = f"{_count(total, 'step')} with no draft, τ {run.tau:.2f}"
        else:
            detail = f"{'its one token came from' if run.tokens == 1 else 'it ended at'} the prompt pass"
        return 0, 0, ["no drafting in this answer", detail]
    number, step = run.last_drafting_step()
    if step is None:
        plain = f" ({_count(total, 'plain step')} so far)" if total else ""
        return 0, 0, [f"no drafting step yet{plain}"]
    line = f"step {number} of {total} so far: {step.drafter}, {step.accepted} of {step.gamma} accepted"
    return step.accepted, step.gamma, [line]


def _count(n: int, noun: str) -> str:
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def error_markdown(message: str) -> str:
    return f"⚠️ **{message}**" if message else ""

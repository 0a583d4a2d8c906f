"""One answer as the chat app sees it: the engine's events folded into what the panels
show (provenance runs, per-step records, running τ and acceptance) while it streams."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from edgespec.decoding.events import PLAIN, Done, Event, Stats, Step, Token


@dataclass
class AnswerRun:
    """Accumulates the events of one generation, in order."""

    # Consecutive tokens of the same provenance merged into [text, source] runs: a long
    # answer stays a short list, which keeps every streamed UI update small.
    runs: list[list[str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    sources: dict[str, int] = field(default_factory=dict)  # tokens by provenance
    done: Done | None = None
    _step_tokens_due: int = 0  # tokens of the latest step not yet received

    def add(self, event: Event) -> bool:
        """Fold in one event; True when it completes a step (the step's tokens follow its
        Step event, so only then do the counters describe the step whole)."""
        if isinstance(event, Token):
            self.tokens += 1
            self.sources[event.source] = self.sources.get(event.source, 0) + 1
            self._append(event.text, event.source)
            if self._step_tokens_due:
                self._step_tokens_due -= 1
                return self._step_tokens_due == 0
        elif isinstance(event, Step):
            self.steps.append(event)
            self.drafted += event.gamma
            self.accepted += event.accepted
            self._step_tokens_due = event.accepted + 1  # the accepted drafts and the target's own
        elif isinstance(event, Done):
            self.done = event
            # The tail was held back for a possible stop string; its tokens were already
            # counted, so it takes the provenance of the last one.
            last_source = self.runs[-1][1] if self.runs else PLAIN
            self._append(event.tail, last_source)
        return False

    def _append(self, text: str, source: str) -> None:
        if not text:
            return
        if self.runs and self.runs[-1][1] == source:
            self.runs[-1][0] += text
        else:
            self.runs.append([text, source])

    @property
    def text(self) -> str:
        if self.done is not None:
            return self.done.text
        return "".join(text for text, _ in self.runs)

    @property
    def tau(self) -> float:
        """Tokens per target pass so far, defined like ``Stats.tau`` (the prefill's first
        token counts in neither term)."""
        passes = len(self.steps)
        return (self.tokens - 1) / passes if passes and self.tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def drafting_steps(self) -> int:
        return sum(1 for step in self.steps if step.gamma > 0)

    def last_drafting_step(self) -> tuple[int, Step | None]:
        """The latest step that drafted anything and its 1-based number: what the gauge
        shows while the answer streams (a plain target step has nothing to accept)."""
        for index in range(len(self.steps) - 1, -1, -1):
            if self.steps[index].gamma > 0:
                return index + 1, self.steps[index]
        return 0, None


def answer_record(run: AnswerRun) -> tuple[dict, list[list[str]], list[dict]]:
    """What the chat store keeps of a finished answer so that it can be shown again as it
    was: its stats (with the stop reason and the tokens by provenance), its provenance runs
    and its steps, all plain JSON values."""
    done = run.done
    stats = asdict(done.stats) if done is not None else {}
    stats["stop_reason"] = done.stop_reason if done is not None else ""
    stats["sources"] = dict(run.sources)
    return stats, [list(piece) for piece in run.runs], [asdict(step) for step in run.steps]


def answer_from_record(
    text: str, stats: dict | None, provenance: list[list[str]] | None, steps: list[dict] | None
) -> AnswerRun:
    """A stored answer folded again, as ``answer_record`` kept it (an answer stored without
    figures, such as an imported plain chat, comes back as plain text)."""
    stats = dict(stats or {})
    stop_reason = str(stats.pop("stop_reason", "") or "")
    sources = {str(k): int(v) for k, v in (stats.pop("sources", None) or {}).items()}
    known = {f.name for f in fields(Stats)}
    figures = Stats(**{k: v for k, v in stats.items() if k in known})
    folded = [Step(**step) for step in steps or []]
    run = AnswerRun(
        runs=[[str(piece), str(source)] for piece, source in (provenance or [[text, PLAIN]]) if piece],
        steps=folded,
        tokens=figures.tokens or sum(sources.values()),
        # As ``add`` counts them: every step's drafts, the one that ended the answer too.
        drafted=sum(step.gamma for step in folded) if folded else figures.drafted,
        accepted=sum(step.accepted for step in folded) if folded else figures.accepted,
        sources=sources,
    )
    run.done = Done(text=text, tail="", stop_reason=stop_reason, stats=figures)
    return run

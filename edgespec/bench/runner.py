"""The benchmark: every configuration through the same loaded pair, interleaved, on the
prompt corpus (``bench.corpus``), and the figures a report is made of.

Each run starts from empty caches (a full prefill, like a new request). Two speeds are
kept per run: the decode phase (tokens after the first over the time after the first
token, so the target's prompt prefill, identical for every configuration, does not
dilute the ratios; the draft model's own prefill comes after the first token and counts
against it) and end to end (all tokens over the whole wall time).

Ratios to target-only are taken per prompt and per repeat (the runs of one round sit
next to each other in time, so a slow minute of the machine hits both alike), then the
median over repeats gives one ratio per prompt, and a category's figure is the
geometric mean over its prompts, reported with its worst prompt.
"""

from __future__ import annotations

import itertools
import math
import os
import resource
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from edgespec.api import EdgeSpec, settings_from
from edgespec.bench.corpus import CorpusPrompt, predicted_output, prompt_tokens, settings_extras
from edgespec.decoding.auto import describe
from edgespec.decoding.events import Done, Step
from edgespec.errors import EdgespecError
from edgespec.models.gguf import kv_bytes_per_token
from edgespec.runtime.model import Model
from edgespec.runtime.system import cpu_flags, cpu_model, widest_isa


@dataclass(frozen=True)
class Config:
    label: str
    drafter: str
    gamma: int | str
    temperature: float = 0.0
    verify: str = "token"
    adaptive: bool = False
    predict: bool = False  # sends the prompt's code as the Predicted Output, as an editor would
    external: bool = False  # answered by another program, through run_benchmark's ``external``

    @property
    def fixed(self) -> bool:
        return not self.adaptive


BASELINE = Config("target only", "none", 0)
AUTO = Config("auto", "auto", "auto", adaptive=True)
GREEDY = [
    BASELINE,
    Config("model γ=2", "model", 2),
    Config("model γ=4", "model", 4),
    Config("model γ=8", "model", 8),
    Config("ngram γ=4", "ngram", 4),
    Config("ngram γ=16", "ngram", 16),
    Config("reflow γ=4", "reflow", 4),
    Config("copy γ=16", "copy", 16),
    AUTO,
    Config("auto predicted", "auto", "auto", adaptive=True, predict=True),
]
DEFAULT_LABELS = ["target only", "auto", "model γ=4", "ngram γ=4", "ngram γ=16", "reflow γ=4"]
SAMPLING_TEMPERATURE = 0.7
SAMPLING = [
    Config("target only T=0.7", "none", 0, SAMPLING_TEMPERATURE),
    Config("model γ=4 token T=0.7", "model", 4, SAMPLING_TEMPERATURE, "token"),
    Config("model γ=4 block T=0.7", "model", 4, SAMPLING_TEMPERATURE, "block"),
    Config("auto T=0.7", "auto", "auto", SAMPLING_TEMPERATURE, adaptive=True),
]
ALL_CONFIGS = {c.label: c for c in [*GREEDY, *SAMPLING]}


def baseline_for(config: Config) -> Config:
    """Target-only decoding at the same temperature: the ratio's denominator."""
    return BASELINE if config.temperature == 0 else SAMPLING[0]


def with_baselines(configs: Iterable[Config]) -> list[Config]:
    """``configs`` with each one's baseline in front of it: a ratio needs both."""
    out: list[Config] = []
    for config in configs:
        for c in (baseline_for(config), config):
            if c not in out:
                out.append(c)
    return out


@dataclass
class Run:
    prompt: str  # corpus id
    category: str
    config: str
    repeat: int
    seed: int | None
    tokens: int
    decode_tps: float  # tokens after the first, per second after the first token
    e2e_tps: float  # all tokens over the whole wall time, prefill included
    tau: float
    acceptance: float
    target_passes: int
    drafted: int
    steps: dict[str, int]  # verification steps per drafter ("none": plain decoding)
    time_s: dict[str, float]
    python_share: float  # Python work outside llama.cpp, share of the time after prefill
    accepted: dict[str, int] = field(default_factory=dict)  # accepted draft tokens per drafter

    @classmethod
    def from_done(
        cls,
        prompt: CorpusPrompt,
        config: Config,
        repeat: int,
        seed: int | None,
        done: Done,
        steps: Counter,
        accepted: Counter | None = None,
    ) -> Run:
        s = done.stats
        decode_time = s.wall_s - s.prefill_s
        return cls(
            prompt=prompt.id,
            category=prompt.category,
            config=config.label,
            repeat=repeat,
            seed=seed,
            tokens=s.tokens,
            decode_tps=s.decode_tokens_per_second,
            e2e_tps=s.tokens_per_second,
            tau=s.tau,
            acceptance=s.acceptance_rate,
            target_passes=s.target_passes,
            drafted=s.drafted,
            steps=dict(steps),
            time_s=s.as_dict()["time_s"],
            python_share=s.other_s / decode_time if decode_time > 0 else 0.0,
            accepted=dict(accepted or {}),
        )


def geomean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values if v > 0 and not math.isnan(v)]
    return math.exp(statistics.fmean(logs)) if logs else math.nan


@dataclass
class Cell:
    """One category × configuration: what the report's tables and bars read."""

    category: str
    config: str
    prompts: int
    decode_tps: float  # median over every run, for reading off absolute speeds
    decode_ratio: float  # geometric mean over prompts of the per-prompt ratio to target-only
    decode_worst: tuple[str, float]  # (prompt id, its ratio)
    decode_spread: tuple[float, float]  # min–max of the per-repeat geometric means
    e2e_ratio: float
    e2e_worst: tuple[str, float]
    e2e_spread: tuple[float, float]
    tau: float
    acceptance: float
    steps: dict[str, float]  # share of verification steps per drafter
    python_share: float
    per_prompt: dict[str, float]  # decode-phase ratio per prompt (median over repeats)


@dataclass
class Report:
    runs: list[Run] = field(default_factory=list)
    configs: list[Config] = field(default_factory=list)
    peak_rss: int = 0
    memory_budget: int = 0
    costs: str = ""
    machine: str = ""

    def run_of(self, prompt: str, config: str, repeat: int) -> Run | None:
        for run in self.runs:
            if run.prompt == prompt and run.config == config and run.repeat == repeat:
                return run
        return None

    def prompt_ratios(self, prompt: str, config: Config, attr: str) -> list[float]:
        """Ratios to target-only for one prompt, one per repeat: each against the baseline
        run of the same repeat."""
        base = baseline_for(config).label
        ratios = []
        for run in self.runs:
            if run.prompt != prompt or run.config != config.label:
                continue
            ref = self.run_of(prompt, base, run.repeat)
            value = getattr(run, attr)
            if ref is not None and getattr(ref, attr) > 0:
                ratios.append(value / getattr(ref, attr))
        return ratios

    def prompt_ratio(self, prompt: str, config: Config, attr: str = "decode_tps") -> float:
        """The median over repeats: this machine's speed jitters by ±10 %, and a median is
        not dragged by one disturbed run."""
        ratios = self.prompt_ratios(prompt, config, attr)
        return statistics.median(ratios) if ratios else math.nan

    def undrafted_ratios(self, config: Config, attr: str = "decode_tps") -> dict[str, list[float]]:
        """Per prompt, the ratios of the runs of ``config`` that took no drafting step: the
        same work as target-only (plain steps, the controller's little Python aside), so
        their spread is this run's noise, against which a per-prompt bar is read."""
        base = baseline_for(config).label
        found: dict[str, list[float]] = {}
        for run in self.runs:
            if run.config != config.label or set(run.steps) - {"none"}:
                continue
            ref = self.run_of(run.prompt, base, run.repeat)
            if ref is not None and getattr(ref, attr) > 0:
                found.setdefault(run.prompt, []).append(getattr(run, attr) / getattr(ref, attr))
        return found

    def prompts_of(self, category: str) -> list[str]:
        return list(dict.fromkeys(r.prompt for r in self.runs if r.category == category))

    def categories(self) -> list[str]:
        return list(dict.fromkeys(r.category for r in self.runs))

    def cell(self, category: str, config: Config) -> Cell | None:
        runs = [r for r in self.runs if r.category == category and r.config == config.label]
        if not runs:
            return None
        prompts = self.prompts_of(category)
        figures = {}
        for attr in ("decode_tps", "e2e_tps"):
            per_prompt = {p: self.prompt_ratio(p, config, attr) for p in prompts}
            per_prompt = {p: v for p, v in per_prompt.items() if not math.isnan(v)}
            worst = min(per_prompt.items(), key=lambda item: item[1]) if per_prompt else ("", math.nan)
            repeats = sorted({r.repeat for r in runs})
            by_repeat = []
            for k in repeats:
                values = []
                for p in prompts:
                    run, ref = self.run_of(p, config.label, k), self.run_of(p, baseline_for(config).label, k)
                    if run and ref and getattr(ref, attr) > 0:
                        values.append(getattr(run, attr) / getattr(ref, attr))
                if values:
                    by_repeat.append(geomean(values))
            spread = (min(by_repeat), max(by_repeat)) if by_repeat else (math.nan, math.nan)
            figures[attr] = (geomean(per_prompt.values()), worst, spread, per_prompt)
        steps: Counter = Counter()
        for run in runs:
            steps.update(run.steps)
        total = sum(steps.values())
        return Cell(
            category=category,
            config=config.label,
            prompts=len({r.prompt for r in runs}),
            decode_tps=statistics.median(r.decode_tps for r in runs),
            decode_ratio=figures["decode_tps"][0],
            decode_worst=figures["decode_tps"][1],
            decode_spread=figures["decode_tps"][2],
            e2e_ratio=figures["e2e_tps"][0],
            e2e_worst=figures["e2e_tps"][1],
            e2e_spread=figures["e2e_tps"][2],
            tau=statistics.fmean(r.tau for r in runs),
            acceptance=statistics.fmean(r.acceptance for r in runs),
            steps={k: v / total for k, v in sorted(steps.items())} if total else {},
            python_share=statistics.median(r.python_share for r in runs),
            per_prompt=figures["decode_tps"][3],
        )

    def summary(self) -> dict[str, dict[str, Cell]]:
        out: dict[str, dict[str, Cell]] = {}
        for category in self.categories():
            for config in self.configs:
                cell = self.cell(category, config)
                if cell is not None:
                    out.setdefault(category, {})[config.label] = cell
        return out

    def as_dict(self) -> dict:
        return _no_nan(  # type: ignore[return-value]
            {
                "machine": self.machine,
                "costs": self.costs,
                "configs": [asdict(c) for c in self.configs],
                "runs": [asdict(r) for r in self.runs],
                "summary": {
                    category: {label: asdict(cell) for label, cell in cells.items()}
                    for category, cells in self.summary().items()
                },
                "peak_rss": self.peak_rss,
                "memory_budget": self.memory_budget,
            }
        )


def _no_nan(value: object) -> object:
    """NaN (a ratio without a baseline) as null: strict JSON readers reject NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def machine() -> str:
    """The CPU's model name and widest vector extension: figures from one machine say
    little about another."""
    return f"{cpu_model()} ({widest_isa(cpu_flags())}), {os.cpu_count()} cores"


def kv_cache_bytes(model: Model) -> int:
    """Bytes of the f16 KV cache at the model's context length, from its GGUF header."""
    return model.n_ctx * kv_bytes_per_token(model.gguf)


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# One run of an ``external`` configuration: (pair, configuration, prompt, repeat, max_tokens).
ExternalRun = Callable[[EdgeSpec, Config, CorpusPrompt, int, int], Run]


def require_external(configs: list[Config], external: ExternalRun | None) -> None:
    """A configuration another program answers needs that program: refused before any
    model loads or anything runs."""
    if external is None and any(config.external for config in configs):
        raise EdgespecError("these configurations are answered by another program, and none was given")


def _edgespec_run(
    lm: EdgeSpec,
    config: Config,
    prompt: CorpusPrompt,
    tokens: list[int],
    repeat: int,
    run_seed: int | None,
    max_tokens: int,
) -> Run:
    """One answer of edgespec's own in ``config``, as a new process gives it (a full prefill,
    no earlier answer for ``suffix`` to copy), with its steps and accepted tokens counted
    per drafter."""
    lm.start_afresh()
    settings = settings_from(
        temperature=config.temperature,
        seed=run_seed,
        verify=config.verify,
        max_tokens=max_tokens,
        **settings_extras(prompt),
    )
    steps: Counter = Counter()
    accepted: Counter = Counter()
    done = None
    prediction = predicted_output(prompt) if config.predict else None
    for event in lm.stream(
        tokens, settings, drafter=config.drafter, gamma=config.gamma, prediction=prediction
    ):
        if isinstance(event, Step):
            steps[event.drafter] += 1
            accepted[event.drafter] += event.accepted
        elif isinstance(event, Done):
            done = event
    assert done is not None
    return Run.from_done(prompt, config, repeat, run_seed, done, steps, accepted)


def run_benchmark(
    lm: EdgeSpec,
    prompts: list[CorpusPrompt],
    configs: list[Config],
    *,
    max_tokens: int,
    repeats: int = 1,
    seed: int = 1,
    on_run: Callable[[Run], None] = lambda run: None,
    external: ExternalRun | None = None,
) -> Report:
    """For each prompt, for each repeat, every configuration in turn, so that runs compared
    with each other are minutes apart at most; the order turns by one from one round to the
    next (A B C, B C A, C A B …) so that no configuration always runs first: on a VM the
    first and the second run of a round need not be equally fast, and a fixed order would
    hand that difference to one configuration. Sampling runs of one repeat share a seed
    (``seed + repeat``), so they draw from the same random stream. ``external`` answers the
    configurations marked so (a lab instrument's, another program on the same prompts)."""
    require_external(configs, external)
    # The cost profile is loaded or measured here, before anything is timed.
    state = lm.controller_state()
    report = Report(configs=list(configs), costs=describe(state.costs), machine=machine())
    for round_, (prompt, repeat) in enumerate(itertools.product(prompts, range(repeats))):
        if repeat == 0:
            tokens = prompt_tokens(lm, prompt)
        turn = round_ % len(configs)
        for config in [*configs[turn:], *configs[:turn]]:
            if config.external:
                assert external is not None  # checked above
                run = external(lm, config, prompt, repeat, max_tokens)
            else:
                run_seed = seed + repeat if config.temperature else None
                run = _edgespec_run(lm, config, prompt, tokens, repeat, run_seed, max_tokens)
            report.runs.append(run)
            on_run(run)
    report.peak_rss = peak_rss_bytes()
    models = [m for m in (lm.target, lm.draft) if m is not None]
    report.memory_budget = sum(m.path.stat().st_size + kv_cache_bytes(m) for m in models)
    return report

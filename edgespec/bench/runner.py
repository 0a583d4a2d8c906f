"""The benchmark: every configuration through the same engine, side by side, in one run.

Each run starts from empty caches (a full prefill, like a new request). Speeds are
generation speeds: tokens after the first, per second after the first token, so the
target's prompt prefill (identical for every configuration) does not dilute the ratios;
the draft model's own prefill comes after the first token and is counted against it.
"""

from __future__ import annotations

import math
import resource
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edgespec.api import EdgeSpec
from edgespec.bench.prompts import PROMPTS
from edgespec.decoding.events import Done
from edgespec.runtime.model import Model


@dataclass(frozen=True)
class Config:
    label: str
    drafter: str
    gamma: int | str
    temperature: float = 0.0
    verify: str = "token"
    adaptive: bool = False

    @property
    def fixed(self) -> bool:
        return not self.adaptive


BASELINE = Config("target only", "none", 0)
GREEDY = [
    BASELINE,
    Config("model γ=2", "model", 2),
    Config("model γ=4", "model", 4),
    Config("model γ=8", "model", 8),
    Config("ngram γ=4", "ngram", 4),
    Config("ngram γ=16", "ngram", 16),
    Config("reflow γ=4", "reflow", 4),
    Config("auto", "auto", "auto", adaptive=True),
]
SAMPLING_TEMPERATURE = 0.7
SAMPLING = [
    Config("target only T=0.7", "none", 0, SAMPLING_TEMPERATURE),
    Config("model γ=4 token T=0.7", "model", 4, SAMPLING_TEMPERATURE, "token"),
    Config("model γ=4 block T=0.7", "model", 4, SAMPLING_TEMPERATURE, "block"),
    Config("auto T=0.7", "auto", "auto", SAMPLING_TEMPERATURE, adaptive=True),
]


@dataclass
class Run:
    category: str
    config: str
    seed: int | None
    tokens: int
    gen_tps: float  # tokens after the first, per second after the first token
    e2e_tps: float
    tau: float
    acceptance: float
    target_passes: int
    drafted: int
    time_s: dict[str, float]
    python_share: float  # Python work outside llama.cpp, share of the time after prefill

    @classmethod
    def from_done(cls, category: str, config: Config, seed: int | None, done: Done) -> Run:
        s = done.stats
        after_first = s.wall_s - s.ttft_s
        decode_time = s.wall_s - s.prefill_s
        return cls(
            category=category,
            config=config.label,
            seed=seed,
            tokens=s.tokens,
            gen_tps=(s.tokens - 1) / after_first if after_first > 0 else 0.0,
            e2e_tps=s.tokens_per_second,
            tau=s.tau,
            acceptance=s.acceptance_rate,
            target_passes=s.target_passes,
            drafted=s.drafted,
            time_s=s.as_dict()["time_s"],
            python_share=s.other_s / decode_time if decode_time > 0 else 0.0,
        )


@dataclass
class Report:
    runs: list[Run] = field(default_factory=list)
    peak_rss: int = 0
    memory_budget: int = 0
    costs: str = ""

    def median(self, category: str, config: str, attr: str) -> float:
        """The median over repeats and seeds: this machine's speed jitters by ±10 %, and a
        median is not dragged by one disturbed run."""
        values = [getattr(r, attr) for r in self.runs if r.category == category and r.config == config]
        return statistics.median(values) if values else math.nan

    def as_dict(self) -> dict:
        return {
            "runs": [asdict(r) for r in self.runs],
            "peak_rss": self.peak_rss,
            "memory_budget": self.memory_budget,
            "costs": self.costs,
        }


def kv_cache_bytes(model: Model) -> int:
    """Bytes of the f16 KV cache at the model's context length, from its GGUF header."""
    meta = model.gguf.metadata
    arch = meta.get("general.architecture", "")
    layers = int(meta.get(f"{arch}.block_count", 0))
    heads = int(meta.get(f"{arch}.attention.head_count", 1))
    heads_kv = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    embd = int(meta.get(f"{arch}.embedding_length", 0))
    k_dim = int(meta.get(f"{arch}.attention.key_length", embd // max(heads, 1)))
    v_dim = int(meta.get(f"{arch}.attention.value_length", embd // max(heads, 1)))
    return model.n_ctx * layers * heads_kv * (k_dim + v_dim) * 2


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def run_benchmark(
    lm: EdgeSpec,
    categories: list[str],
    configs: list[Config],
    *,
    max_tokens: int,
    seeds: list[int | None],
    repeats: int = 1,
    on_run: Callable[[Run], None] = lambda run: None,
) -> Report:
    """Rounds of every configuration in turn (not all runs of one, then the next), so
    that a slow minute of the machine hits every configuration alike. Greedy runs are
    repeated ``repeats`` times; sampling runs once per seed."""
    report = Report()
    rounds = max(repeats, len(seeds))
    for category in categories:
        prompt = lm.prompt_tokens(PROMPTS[category], chat=True)
        for round_ in range(rounds):
            seed = seeds[round_] if round_ < len(seeds) else None
            for config in configs:
                if (config.temperature == 0 and round_ >= repeats) or (config.temperature and seed is None):
                    continue
                lm.target.reset()
                if lm.draft is not None:
                    lm.draft.reset()
                done = lm.generate(
                    prompt,
                    drafter=config.drafter,
                    gamma=config.gamma,
                    temperature=config.temperature,
                    seed=seed if config.temperature else None,
                    verify=config.verify,
                    max_tokens=max_tokens,
                )
                run = Run.from_done(category, config, seed if config.temperature else None, done)
                report.runs.append(run)
                on_run(run)
    report.peak_rss = peak_rss_bytes()
    models = [m for m in (lm.target, lm.draft) if m is not None]
    report.memory_budget = sum(m.path.stat().st_size + kv_cache_bytes(m) for m in models)
    return report

"""``edgespec doctor``: one screen with what a bug report needs, and every problem found.

Each failed check is one line starting with "FAIL" that says what to do; the exit code is
0 when every check passed and 1 otherwise. A line starting with "WARN" is no failure but
something to know before trusting figures: a model decoding at under half the speed its
cost profile measured on this machine (the machine is busy, or throttled).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from edgespec.cli.generate import rpc_options
from edgespec.cli.rpc_flags import add_rpc_flags
from edgespec.errors import EdgespecError
from edgespec.models import catalog, store
from edgespec.models.gguf import kv_bytes_per_token
from edgespec.models.resolve import resolve
from edgespec.progress import byte_bar
from edgespec.runtime import rpc, system
from edgespec.runtime.context_size import default_context
from edgespec.runtime.model import LoadOptions, Model, amx_guard_needed

PROMPT = "def fibonacci(n):\n"
N_TOKENS = 20
# Below this share of the speed the cost profile predicts, the machine is not itself:
# a short decode varies by tens of percent, not by half.
SLOW_SHARE = 0.5


def add_parser(subparsers) -> None:
    doctor = subparsers.add_parser("doctor", help="check this machine, the llama.cpp build and the models")
    doctor.add_argument("--target", default="default", help="catalog name or GGUF path of the target")
    doctor.add_argument("--draft", default="default", help="catalog name or GGUF path of the draft")
    add_rpc_flags(doctor)
    doctor.set_defaults(handler=run)


class Report:
    def __init__(self) -> None:
        self.failures = 0
        self.warnings = 0

    def line(self, key: str, value: object) -> None:
        print(f"{key + ':':<16} {value}", flush=True)

    def fail(self, message: str) -> None:
        self.failures += 1
        print(f"FAIL {message}", flush=True)

    def warn(self, message: str) -> None:
        self.warnings += 1
        print(f"WARN {message}", flush=True)


def run(args: argparse.Namespace) -> int:
    report = Report()
    _machine(report)
    _build(report)
    _cached_models(report)
    models = _load(report, args)
    profile = _cost_profile(report, models)
    for role, model in models.items():
        speed = _decode(report, model)
        if speed is not None:
            _compare_speed(report, model, speed, _predicted_speed(profile, role))
        model.close()
    warned = f", {report.warnings} warning(s) above" if report.warnings else ""
    if report.failures:
        print(f"{report.failures} check(s) failed{warned}", flush=True)
        return 1
    print(f"all checks passed{warned}", flush=True)
    return 0


def _machine(report: Report) -> None:
    flags = system.cpu_flags()
    report.line("os", system.os_name())
    report.line("python", sys.version.split()[0])
    report.line("cpu", system.cpu_model())
    report.line("isa", " ".join(system.isa_of_interest(flags)) or "(no /proc/cpuinfo flags)")


def _build(report: Report) -> None:
    record = system.build_record()
    if record is not None:
        built = record.get("built_at") or "before records"
        report.line(
            "llama.cpp build",
            f"{record.get('recipe', '?')} recipe, key {record.get('key', '?')}, "
            f"CMAKE_ARGS={record.get('cmake_args', '')!r}, built {built}",
        )
    else:
        where = Path(sys.prefix) / system.BUILD_RECORD
        report.line("llama.cpp build", f"no build record in {where} (run: make setup)")
    info = system.system_info()
    features = sorted(system.compiled_features(info))
    report.line("compiled in", " ".join(features))
    report.line("backends", f"{', '.join(system.backends(info))}; GPU offload: {system.gpu_offload()}")
    cpu_amx = system.cpu_has_amx(system.cpu_flags())
    lib_amx = system.library_has_amx(info)
    guard = "extra buffer types off (AMX guard)" if amx_guard_needed() else "not needed"
    report.line(
        "amx", f"CPU {'yes' if cpu_amx else 'no'}, library {'yes' if lib_amx else 'no'}; guard {guard}"
    )
    protocol = ".".join(map(str, rpc.PROTOCOL))
    found = (
        f"yes (protocol {protocol}: --rpc, edgespec worker)" if rpc.available() else rpc.unavailable_reason()
    )
    report.line("rpc", found)


def _cached_models(report: Report) -> None:
    found = False
    for model in catalog.all_models().values():
        path = store.model_file(model.name)
        if not path.is_file():
            continue
        found = True
        bar = byte_bar(f"verify {model.name}", path.stat().st_size)
        status = store.verify(model, bar.update)
        bar.close()
        if status == "ok":
            report.line(f"model {model.name}", f"ok ({path.stat().st_size / 1e6:,.0f} MB)")
        else:
            report.fail(f"{model.name}: {status}; run: edgespec models pull {model.name}")
    if not found:
        report.fail(f"no models cached in {store.models_dir()}; run: edgespec models pull --default")


def _load(report: Report, args: argparse.Namespace) -> dict[str, Model]:
    loaded: dict[str, Model] = {}
    for role, arg in (("target", args.target), ("draft", args.draft)):
        name = catalog.default_name(role) if arg == "default" else arg
        try:
            # The target over the workers --rpc names; the draft always here.
            endpoints, split = rpc_options(args) if role == "target" else ((), ())
            resolved = resolve(name, download=False)
            options = LoadOptions(n_ctx=512, max_outputs=1, rpc=endpoints, tensor_split=split)
            model = Model(resolved.path, options, name=resolved.name)
        except EdgespecError as exc:
            report.fail(f"{role} {name}: {exc}")
            continue
        buffers = ", ".join(f"{k} {v:,.0f} MiB" for k, v in model.buffers.items()) or "none reported"
        report.line(f"{role} buffers", f"{model.name}: {buffers}")
        if model.placement is not None:
            report.line(f"{role} layers", model.placement.describe())
        report.line(f"{role} context", _context_line(model))
        loaded[role] = model
    return loaded


def _context_line(model: Model) -> str:
    """The context a default load gives this model (``--ctx 0``), and why."""
    trained = model.n_ctx_train
    chosen = default_context(trained, kv_bytes_per_token(model.gguf))
    per_token = kv_bytes_per_token(model.gguf)
    return (
        f"{chosen:,} tokens by default (trained for {trained:,}; KV cache "
        f"{per_token * chosen / (1 << 30):.2f} GiB at f16); --ctx overrides"
    )


def _cost_profile(report: Report, models: dict[str, Model]) -> dict | None:
    """Where the pair's cost profile is and when it was measured; its contents, if any."""
    if "target" not in models:
        return None
    # costs is another layer's file format: read it, tolerate anything, never fail on it.
    try:
        from edgespec.decoding import costs

        path = costs.profile_path(models["target"], models.get("draft"))
    except Exception as exc:
        report.line("cost profile", f"unknown ({exc.__class__.__name__}: {exc})")
        return None
    if not path.is_file():
        report.line("cost profile", "not measured yet — it will be measured on first use")
        return None
    when = None
    data = None
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("measured_at"), int | float):
            when = float(data["measured_at"])
    except (OSError, ValueError):
        pass
    source = "measured" if when else "file written"
    when = when or path.stat().st_mtime
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M UTC")
    report.line("cost profile", f"{path} ({source} {stamp})")
    return data if isinstance(data, dict) else None


def _predicted_speed(profile: dict | None, role: str) -> float | None:
    """Tokens/s of one-token passes in the profile (its "target" and "draft" curves hold
    seconds per pass by batch size), or None where it does not say."""
    curve = profile.get(role) if profile else None
    seconds = curve.get("1") if isinstance(curve, dict) else None
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return 1.0 / seconds
    return None


def _compare_speed(report: Report, model: Model, measured: float, predicted: float | None) -> None:
    if predicted is not None and measured < SLOW_SHARE * predicted:
        report.warn(
            f"{model.name} decodes at {measured:.1f} tokens/s, under half the {predicted:.1f} its cost "
            "profile measured: this machine looks busy (or throttled), so speeds measured now will be low"
        )


def _decode(report: Report, model: Model) -> float | None:
    """A real greedy decode: tokens/s here (returned), and proof the build computes on
    this CPU."""
    sequence = model.sequence(0)
    try:
        logits = sequence.decode(model.tokenize(PROMPT), 1)
        out: list[int] = []
        started = time.perf_counter()
        for _ in range(N_TOKENS):
            token = int(np.argmax(logits[-1]))
            out.append(token)
            logits = sequence.decode([token], 1)
        elapsed = time.perf_counter() - started
    except EdgespecError as exc:
        report.fail(
            f"{model.name}: decoding failed: {exc}; run: make setup (or EDGESPEC_BUILD=portable make setup)"
        )
        return None
    text = model.detokenize(out)
    speed = len(out) / elapsed
    report.line(f"decode {model.name}", f"{speed:.1f} tokens/s  {text[:40]!r}")
    return speed

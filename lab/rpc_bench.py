"""The target split over a worker, behind an emulated network: does speculation hide it?

For each delay (``--delays``, milliseconds each way, default 0 1 5) this starts an
``edgespec worker`` on loopback and a relay in front of it (``tools/netdelay.py``: every
chunk held for the delay each way), then, interleaved per prompt as ``edgespec bench``
interleaves, runs through the relay ``target only`` and ``auto`` with the target split, and
llama.cpp's own loops (``llama-speculative-simple --rpc``: draft-simple, ngram-mod,
ngram-simple) over the same split, same GGUFs (``python -m lab.llamacpp bench --rpc``);
the loops get a second worker behind a second relay at the same delay, since a worker
serves one client at a time and the benchmark holds the first. The same two
configurations with the target local run once, first, in a benchmark of their own. A probe
then loads the target in this process, local and split, and times passes of k tokens (the
cost curve T(k)/T(1)) while the relay counts the replies each pass waits for: the
network's share of a pass is those replies × two delays, the rest is compute.

    python -m lab.rpc_bench [--delays 0 1 5] [--categories "code editing" summarization]
                            [--split test] [--max-tokens 128] [--out rpc.md]

Every process here (this one, the benchmark, the worker) runs on this machine's cores: the
worker's compute and ours share them, which a second machine would not; every table says
so. It takes long (each delay is a whole benchmark): the lead runs it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError, run_reporting_errors
from edgespec.models import store
from lab import llamacpp
from tools.netdelay import Relay, RelayError

DELAYS = (0.0, 1.0, 5.0)
OURS = ["target only", "auto"]  # the baseline first: every ratio is to it
LOOPS = [c.label for c in llamacpp.LLAMACPP]
SIZES = (1, 2, 4, 8, 16)  # the probe's pass sizes
PROBE_PASSES = 8  # passes of each size the probe times (the median is kept)
START_S = 120  # a worker (or relay) that does not listen by then failed
BENCH_TIMEOUT_S = 6 * 3600


# ---------------------------------------------------------------- processes


def wait_listening(port: int, proc: subprocess.Popen | None, timeout_s: float = START_S) -> None:
    """Until something accepts connections on loopback ``port`` (``proc`` must stay alive)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EdgespecError(f"the worker exited ({proc.returncode}) before it listened on port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise EdgespecError(f"nothing listened on 127.0.0.1:{port} within {timeout_s} s")


class Worker:
    """``edgespec worker`` in a process of its own, on loopback."""

    def __init__(self, port: int, threads: int | None, cache_dir: Path | None, log: Path) -> None:
        self.port = port
        command = [sys.executable, "-m", "edgespec", "worker", "--host", "127.0.0.1", "--port", str(port)]
        if threads:
            command += ["--threads", str(threads)]
        if cache_dir is not None:
            command += ["--cache-dir", str(cache_dir)]
        self.log = log
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            pass  # free, as it must be
        else:
            raise EdgespecError(f"port {port} is taken already: give the workers others with --worker-port")
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        wait_listening(port, self.proc)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed if it does not end."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_json(command: list[str], json_path: Path) -> dict:
    """A benchmark command in its own process, its lines passed through; its ``--json``."""
    print("$", shlex.join(command), flush=True)
    result = subprocess.run([*command, "--json", str(json_path)], timeout=BENCH_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise EdgespecError(f"{' '.join(command[:4])} … failed ({result.returncode}); its output is above")
    return json.loads(json_path.read_text(encoding="utf-8"))


def corpus_args(args: argparse.Namespace) -> list[str]:
    """The corpus options both benchmarks get alike."""
    out = ["--split", args.split, "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
           "--ctx", str(args.ctx), "--target", args.target, "--draft", args.draft]  # fmt: skip
    if args.categories:
        out += ["--categories", *args.categories]
    if args.prompts:
        out += ["--prompts", *args.prompts]
    if args.threads:
        out += ["--threads", str(args.threads)]
    return out


def configs(args: argparse.Namespace) -> list[str]:
    """Ours, then the fixed configurations asked for."""
    return [*OURS, *args.fixed]


def split_args(args: argparse.Namespace, address: str) -> list[str]:
    """How the target is split: over the relay, the layers as the options say."""
    out = ["--rpc", address]
    if args.tensor_split:
        out += ["--tensor-split", args.tensor_split]
    return out


# ---------------------------------------------------------------- the probe


@dataclass(frozen=True)
class Probe:
    """The target's passes: median seconds per pass size, and the replies (bursts from the
    worker, counted by the relay) each pass waited for."""

    delay_ms: float
    seconds: dict[int, float]
    replies_per_pass: float
    layout: str  # where the layers were

    @property
    def network_s(self) -> float:
        """What one pass waits on the wire: each reply one round trip, a delay each way."""
        return self.replies_per_pass * 2 * self.delay_ms / 1000

    def ratio(self, k: int) -> float:
        return self.seconds[k] / self.seconds[1] if self.seconds.get(1) else math.nan


def probe(args: argparse.Namespace, relay: Relay | None) -> Probe:
    """Load the target here (split through ``relay``, or local without one) and time passes
    of each size, every row of logits asked for as a verification asks, the relay counting
    what came back during each pass."""
    from edgespec.api import EdgeSpec, RuntimeOptions  # loads llama.cpp: only when probing

    split = {"rpc": (relay.address,), **_layer_options(args)} if relay is not None else {}
    lm = EdgeSpec(args.target, None, RuntimeOptions(n_ctx=512, threads=args.threads, **split), quiet=True)
    try:
        model = lm.target
        layout = model.placement.describe() if model.placement is not None else "every layer here"
        sequence = model.sequence(0)
        filler = model.tokenize(" the quick brown fox jumps over the lazy dog" * 8, add_special=False)
        samples: dict[int, list[float]] = {k: [] for k in SIZES}
        replies = passes = 0
        for _ in range(PROBE_PASSES):
            for k in SIZES:
                sequence.reset()
                sequence.decode(filler[:4], 1)
                before = relay.snapshot()["down"].bursts if relay is not None else 0
                start = time.perf_counter()
                sequence.decode(filler[4 : 4 + k], k)
                samples[k].append(time.perf_counter() - start)
                replies += relay.snapshot()["down"].bursts - before if relay is not None else 0
                passes += 1
        sequence.reset()
    finally:
        lm.close()
    delay = relay.delay_s * 1000 if relay is not None else 0.0
    medians = {k: statistics.median(v) for k, v in samples.items()}
    return Probe(delay, medians, replies / passes, layout)


def _layer_options(args: argparse.Namespace) -> dict:
    from edgespec.runtime import rpc

    return {"tensor_split": rpc.parse_split(args.tensor_split)} if args.tensor_split else {}


def profile_curve(args: argparse.Namespace, address: str) -> str:
    """``edgespec costs show`` for the split target: the profile the controller priced with
    (its output from the pair's line on)."""
    command = [sys.executable, "-m", "edgespec", "costs", "show", "--target", args.target, "--draft",
               args.draft, *split_args(args, address)]  # fmt: skip
    if args.threads:
        command += ["--threads", str(args.threads)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    text = (result.stdout if result.returncode == 0 else result.stderr).strip()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("for ")), 0)
    return "\n".join(lines[start:])


# ---------------------------------------------------------------- the tables


def _cell(summary: dict, category: str, label: str) -> dict | None:
    return summary.get(category, {}).get(label)


def _speed(cell: dict | None) -> str:
    return "–" if cell is None or not cell.get("decode_tps") else f"{cell['decode_tps']:.2f}"


def _ratio(cell: dict | None) -> str:
    ratio = None if cell is None else cell.get("decode_ratio")
    return "–" if ratio is None or math.isnan(ratio) else f"×{ratio:.2f}"


def shared_cores_note(args: argparse.Namespace) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"the benchmark ({args.threads or 'all'} threads) and its worker ({args.worker_threads or 'all'} "
            f"threads) share this machine's {cores} cores, which a worker on another machine would "
            f"not take")  # fmt: skip


def _worst(cell: dict | None) -> str:
    """The prompt where ``auto`` did least well against ``none`` (median over repeats)."""
    worst = None if cell is None else cell.get("decode_worst")
    return "–" if not worst or worst[1] is None else f"×{worst[1]:.2f} ({worst[0]})"


def _best_fixed(summary: dict, category: str, fixed: list[str]) -> str:
    """The fixed configuration (drafter, γ) that did best, and ``auto`` over it."""
    cells = {label: _cell(summary, category, label) for label in fixed}
    ranked = [(c["decode_ratio"], label) for label, c in cells.items() if c and c.get("decode_ratio")]
    if not ranked:
        return "not run"
    best, label = max(ranked)
    auto = (_cell(summary, category, OURS[1]) or {}).get("decode_ratio")
    versus = f"; auto ÷ it {auto / best:.2f}" if auto else ""
    return f"{label} ×{best:.2f}{versus}"


def _row(name: str, summary: dict, category: str, loops: bool, fixed: list[str]) -> list[str]:
    none, auto = _cell(summary, category, OURS[0]), _cell(summary, category, OURS[1])
    theirs = [
        f"{_speed(_cell(summary, category, label))} ({_ratio(_cell(summary, category, label))})"
        if loops else "not run"
        for label in LOOPS
    ]  # fmt: skip
    ours = [_speed(none), _speed(auto), _ratio(auto), _worst(auto), _best_fixed(summary, category, fixed)]
    return [name, *ours, *theirs]


def category_table(category: str, local: dict, split: dict[float, dict], args: argparse.Namespace) -> str:
    """One category: a row per delay, and one with the target local (no worker)."""
    head = ["target", "none tok/s", "auto tok/s", "auto ÷ none", "auto's worst prompt", "best fixed",
            *(f"{label.removeprefix('llama.cpp ')} tok/s (÷ none)" for label in LOOPS)]  # fmt: skip
    rows = [
        _row(f"split, {d:g} ms each way", r["summary"], category, not args.no_loops, args.fixed)
        for d, r in split.items()
    ]
    rows.append(_row("local", local.get("summary", {}), category, False, args.fixed))
    cells = local.get("summary", {}).get(category, {}).values()
    prompts = max((c.get("prompts", 0) for c in cells), default=0)
    note = f"Decode-phase tokens/s, greedy, ratios to `none` in the same run; {shared_cores_note(args)}."
    return "\n".join([f"### {category} ({prompts} prompts)", "", note, "", *_markdown(head, rows)])


def passes_table(probes: dict[float, Probe], local: Probe | None, args: argparse.Namespace) -> str:
    """The target's passes per delay: the curve, and the wire apart from compute."""
    head = ["target", "T(1) ms", "network per pass ms", "compute per pass ms", "replies per pass",
            *(f"T({k})/T(1)" for k in SIZES[1:])]  # fmt: skip
    rows = []
    for name, p in [*((f"split, {d:g} ms each way", p) for d, p in probes.items()), ("local", local)]:
        if p is None:
            continue
        t1 = p.seconds[1]
        wire = p.network_s
        rows.append([name, f"{t1 * 1000:.1f}", f"{wire * 1000:.1f}", f"{(t1 - wire) * 1000:.1f}",
                     f"{p.replies_per_pass:.1f}", *(f"{p.ratio(k):.2f}" for k in SIZES[1:])])  # fmt: skip
    layouts = sorted({p.layout for p in probes.values()})
    note = (f"Medians of {PROBE_PASSES} passes of each size, every row of logits read back as a "
            f"verification reads them; network per pass = the replies a pass waited for (the relay's "
            f"count) × 2 × the delay, compute = the rest; {shared_cores_note(args)}. Split: "
            f"{'; '.join(layouts) or 'not probed'}.")  # fmt: skip
    return "\n".join(["### The target's passes", "", note, "", *_markdown(head, rows)])


def _markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


# ---------------------------------------------------------------- the run


def relay_ports(base: int, delay_ms: float) -> tuple[int, int]:
    """The relays' ports at one delay (ours, the loops'): the cost profile's key names the
    worker's address, so each delay's curve is measured and kept apart from the others'."""
    port = base + 2 * round(delay_ms * 10)
    return port, port + 1


def start_relay(port: int, worker_port: int, delay_ms: float) -> Relay:
    try:
        return Relay(f"127.0.0.1:{port}", f"127.0.0.1:{worker_port}", delay_ms).start()
    except RelayError as e:
        raise EdgespecError(f"{e} (give the relays other ports with --relay-port)") from None


@dataclass
class Delay:
    """What one delay's run found."""

    report: dict
    probe: Probe | None
    curve: str
    relays: str


def run_delay(args: argparse.Namespace, delay: float, work: Path) -> Delay:
    """One delay: a worker for ours and one for llama.cpp's loops (a worker serves one client
    at a time, and the benchmark holds ours while the loops run), a relay before each, the
    interleaved benchmark through them, then the probe and the profile's curve."""
    cache = Path(args.worker_cache) if args.worker_cache else store.home() / "rpc-cache"
    names = ["ours"] if args.no_loops else ["ours", "loops"]
    workers: list[Worker] = []
    relays: list[Relay] = []
    try:
        for i, (name, port) in enumerate(zip(names, relay_ports(args.relay_port, delay), strict=False)):
            log = work / f"worker-{name}-{delay:g}ms.log"
            workers.append(Worker(args.worker_port + i, args.worker_threads, cache, log))
            relays.append(start_relay(port, args.worker_port + i, delay))
        ours = relays[0].address
        if args.no_loops:
            command = [sys.executable, "-m", "edgespec", "bench", *corpus_args(args), *split_args(args, ours),
                       "--configs", *configs(args)]  # fmt: skip
        else:
            command = [sys.executable, "-m", "lab.llamacpp", "bench", *corpus_args(args),
                       *split_args(args, ours), "--loop-rpc", relays[1].address,
                       "--configs", *configs(args), *LOOPS,
                       *(["--binary", args.binary] if args.binary else [])]  # fmt: skip
        report = run_json(command, work / f"split-{delay:g}ms.json")
        measured = None if args.no_probe else probe(args, relays[0])
        counts = "; ".join(f"{name}: {relay.report()}" for name, relay in zip(names, relays, strict=True))
        return Delay(report, measured, profile_curve(args, ours), counts.replace("\n", ", "))
    finally:
        for relay in relays:
            relay.stop()
        for worker in workers:
            worker.stop()


def run(args: argparse.Namespace) -> int:
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="rpc-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.no_loops:
        binary = Path(args.binary) if args.binary else llamacpp.default_binary()
        if not binary.is_file():
            raise EdgespecError(f"no llama.cpp tool at {binary}; build it with: python -m lab.llamacpp build")
    bench = [sys.executable, "-m", "edgespec", "bench", *corpus_args(args), "--configs", *configs(args)]
    local = run_json(bench, work / "local.json")
    local_probe = None if args.no_probe else probe(args, None)
    found = {delay: run_delay(args, delay, work) for delay in args.delays}
    text = report_text(args, local, local_probe, found, work)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


def report_text(
    args: argparse.Namespace, local: dict, local_probe: Probe | None, found: dict[float, Delay], work: Path
) -> str:
    parts = [f"## The target split over a worker ({time.strftime('%Y-%m-%d')})", "",
             f"{local.get('machine', '')}; target {local.get('target')}, draft {local.get('draft')}; "
             f"split {args.split}, {args.max_tokens} tokens, {args.repeats} repeat(s); runs and logs "
             f"in {work}.", ""]  # fmt: skip
    split = {delay: d.report for delay, d in found.items()}
    # Where the benchmark's target had its layers, where its JSON says (a "placement" record).
    layouts = {json.dumps(r["placement"]) for r in split.values() if r.get("placement")}
    parts += [f"Split target's layers: {layout}\n" for layout in sorted(layouts)]
    parts += [category_table(category, local, split, args) + "\n" for category in local.get("summary", {})]
    probes = {delay: d.probe for delay, d in found.items() if d.probe is not None}
    if probes:
        parts.append(passes_table(probes, local_probe, args) + "\n")
    for delay, d in found.items():
        parts += [f"{delay:g} ms each way: the profile the controller priced with, and what the relays "
                  f"carried ({d.relays}):", "", "```", d.curve, "```", ""]  # fmt: skip
    return "\n".join(parts)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab.rpc_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", type=float, nargs="+", default=list(DELAYS), metavar="MS",
                        help="emulated delay each way, milliseconds (default: 0 1 5)")  # fmt: skip
    parser.add_argument("--split", default="test", help="corpus half (dev, test, all)")
    parser.add_argument("--categories", nargs="+", default=None, metavar="CAT")
    parser.add_argument("--prompts", nargs="+", default=None, metavar="ID")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--target", default="default")
    parser.add_argument("--draft", default="default")
    parser.add_argument("--threads", type=int, default=None, help="the benchmark's and llama.cpp's threads")
    parser.add_argument("--worker-threads", type=int, default=None, help="the workers' threads")
    parser.add_argument("--tensor-split", default=None, help="passed on as --tensor-split")
    parser.add_argument(
        "--worker-port", type=int, default=50052, help="ours; the loops' worker takes the next"
    )
    parser.add_argument("--relay-port", type=int, default=50100, help="the first relay port (two per delay)")
    parser.add_argument("--worker-cache", default=None, help="the workers' --cache-dir")
    parser.add_argument("--binary", default=None, help="the llama-speculative-simple to run")
    parser.add_argument("--fixed", nargs="*", default=[], metavar="LABEL",
                        help="fixed configurations beside auto, named as edgespec bench --configs names "
                        "them ('ngram γ=16' 'model γ=4'): auto ÷ the best of them per category")  # fmt: skip
    parser.add_argument("--no-loops", action="store_true", help="leave llama.cpp's loops out")
    parser.add_argument("--no-probe", action="store_true", help="leave the pass probe out")
    parser.add_argument("--work-dir", default=None, help="where the runs' JSON and logs go")
    parser.add_argument("--out", default=None, metavar="FILE.md", help="also write the tables here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_reporting_errors(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())

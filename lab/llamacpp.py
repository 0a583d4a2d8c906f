"""llama.cpp's own speculative decoding on the same prompts, as a reference.

``llama-speculative-simple`` runs each of llama.cpp's loops (``LOOPS``): ``ngram-simple``
(its prompt lookup: a 12-token match, then a 48-token draft), ``ngram-mod`` (a rolling
hash of the last tokens over the context, drafting 48 to 64) and ``draft-simple`` (the
draft model, up to 3 tokens a step). It is built from the llama.cpp sources vendored in
the ``llama-cpp-python`` sdist, outside the repository, as are ``llama-server`` (for
``edgespec bench --sessions --llama-server BINARY``) and ``llama-bench``
(``lab/costs_check.py``):

    python -m lab.llamacpp build [--tool llama-server]   # once: configures and builds it (minutes)
    python -m lab.llamacpp bench [BENCH OPTIONS] [--binary BINARY]
                                # edgespec bench with llama.cpp's loops beside its configurations

Its decode-phase speed (llama.cpp's "decoded N tokens in S seconds", which starts after
the prompt is encoded) is compared with ours on the same models, prompts and threads, as
the tokens asked for over those seconds: the tool keeps the whole draft its last step
accepted, up to 48 tokens past the request, which a client asking for N never receives.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from edgespec.api import EdgeSpec
from edgespec.bench.corpus import CorpusPrompt, conversation
from edgespec.bench.runner import ALL_CONFIGS, DEFAULT_LABELS, Cell, Config, Run
from edgespec.bootstrap import LLAMA_CPP_VERSION, llama_cpp_source  # the sdist the runtime is built from
from edgespec.cli import bench as bench_cli
from edgespec.errors import EdgespecError, run_reporting_errors
from edgespec.models import store
from edgespec.runtime import rpc, system
from edgespec.runtime.chat_template import render

_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


@dataclass(frozen=True)
class ReferenceRun:
    tokens: int  # what llama.cpp decoded: its last step may accept a draft past the request
    decode_s: float
    drafted: int
    accepted: int
    requested: int = 0  # the tokens asked for (0: no limit)

    @property
    def delivered(self) -> int:
        """The tokens of the request: a whole accepted draft is kept past the request's
        end, but a client asked for no more (ours stops exactly there), so the rate counts
        what was asked for over the time it took to have it."""
        return min(self.tokens, self.requested) if self.requested > 0 else self.tokens

    @property
    def decode_tps(self) -> float:
        return self.delivered / self.decode_s if self.decode_s > 0 else 0.0


def runtime_cmake_args() -> list[str]:
    """The CMake arguments the runtime's own llama.cpp was built with (`make setup`'s
    record): the reference must run the same kernels, and on a CPU with AMX a native build
    would crash at its first decode (llama.cpp issue 20824)."""
    record = system.build_record() or {}
    return str(record.get("cmake_args") or "").split()


TOOLS = ("llama-speculative-simple", "llama-server", "llama-bench")  # what ``build`` can make


def default_binary(cmake_args: list[str] | None = None, tool: str = TOOLS[0]) -> Path:
    """Where ``tool`` built with ``cmake_args`` (default: the runtime's) lives: one build
    directory per set of arguments, so a change of recipe builds it anew."""
    args = runtime_cmake_args() if cmake_args is None else cmake_args
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:10]
    build_dir = store.home() / "llama.cpp" / f"build-{LLAMA_CPP_VERSION}-{key}"
    return build_dir / "bin" / tool


def build(jobs: int | None = None, tool: str = TOOLS[0]) -> Path:
    """Download the llama-cpp-python sdist with pip, configure its vendored llama.cpp with
    the runtime build's CMake arguments, and build ``tool`` (``llama-speculative-simple``
    or ``llama-server``, the peer the sessions benchmark measures beside us)."""
    if tool not in TOOLS:
        raise EdgespecError(f"unknown llama.cpp tool {tool!r} (known: {', '.join(TOOLS)})")
    cmake_args = runtime_cmake_args()
    binary = default_binary(cmake_args, tool)
    if binary.is_file():
        return binary
    if shutil.which("cmake") is None:
        raise EdgespecError("building llama.cpp's tools needs cmake (apt-get install cmake)")
    build_dir = binary.parent.parent
    source = vendored_source()
    subprocess.run(
        ["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON", *cmake_args],
        check=True,
    )  # fmt: skip
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", tool, "-j", str(jobs or os.cpu_count() or 2)],
        check=True,
    )
    if not binary.is_file():
        raise EdgespecError(f"the llama.cpp build did not produce {binary}")
    return binary


def vendored_source() -> Path:
    """llama.cpp's sources as the llama-cpp-python sdist vendors them, unpacked once into
    the cache (kept: every tool's build directory is configured from this one tree, and the
    tests read its real chat templates)."""
    source = llama_cpp_source()
    if (source / "CMakeLists.txt").is_file():
        return source
    work = source.parent.parent.parent
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
             "-d", tmp, f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
            check=True,
        )  # fmt: skip
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        unpacked = next(p for p in Path(tmp).glob("llama_cpp_python-*") if p.is_dir())
        shutil.rmtree(source.parent.parent, ignore_errors=True)
        os.replace(unpacked, source.parent.parent)
    return source


LOOPS = ("ngram-simple", "ngram-mod", "draft-simple")  # llama.cpp's --spec-type names


def run_loop(
    binary: Path,
    loop: str,
    target: Path,
    draft: Path | None,
    prompt_text: str,
    n_predict: int,
    threads: int,
    ctx: int = 4096,
    split: tuple[str, ...] = (),
) -> ReferenceRun:
    """One greedy generation with one of llama.cpp's speculative loops (``LOOPS``), each
    with llama.cpp's own defaults. ``prompt_text`` is the chat-rendered prompt (special
    tokens are parsed); ``draft`` is the draft model, which ``draft-simple`` needs;
    ``split``: the tool's options that split the target over workers (``split_options``)."""
    if loop not in LOOPS:
        raise EdgespecError(f"unknown llama.cpp loop {loop!r} (known: {', '.join(LOOPS)})")
    # The tool stops once it has decoded more than -n tokens: asked for one less, it stops
    # as soon as it has the n_predict tokens, as a server would.
    cmd = [
        str(binary), "-m", str(target), "--spec-type", loop, "-p", prompt_text,
        "-n", str(max(n_predict - 1, 1)), "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
        "--temp", "0", "--top-k", "1", "--seed", "1", *split,
    ]  # fmt: skip
    if loop == "draft-simple":
        if draft is None:
            raise EdgespecError("llama.cpp's draft-simple loop needs a draft model")
        cmd += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        if split:
            cmd += ["-devd", "none"]  # the draft stays here, as ours does: its passes pay no network
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    log = result.stdout + result.stderr
    decoded, drafted, accepted = _DECODED.search(log), _DRAFTED.search(log), _ACCEPTED.search(log)
    if result.returncode != 0 or decoded is None:
        tail = " | ".join(line for line in log.strip().splitlines()[-3:])
        raise EdgespecError(
            f"llama-speculative-simple --spec-type {loop} failed ({result.returncode}): {tail}"
        )
    return ReferenceRun(
        tokens=int(decoded.group(1)),
        decode_s=float(decoded.group(2)),
        drafted=int(drafted.group(1)) if drafted else 0,
        accepted=int(accepted.group(1)) if accepted else 0,
        requested=n_predict,
    )


# Each loop as a benchmark configuration, answered by the tool in a process of its own on
# the same model files and prompt; draft-simple drafts with the pair's draft model.
LLAMACPP = [
    Config(f"llama.cpp {loop}", "model" if loop == "draft-simple" else "llama.cpp", 0, external=True)
    for loop in LOOPS
]


def split_options(lm: EdgeSpec, workers: tuple[str, ...]) -> tuple[str, ...]:
    """llama.cpp's options for the split our target has (``lm.target.placement``), over
    ``workers`` (the same number as ours): the same layers offloaded, in the same shares, the
    output matrix kept here as ours is; () for a target on this machine alone."""
    placement = lm.target.placement
    if placement is None:
        return ()
    if len(workers) != len(placement.endpoints):
        raise EdgespecError(f"llama.cpp's loops need {len(placement.endpoints)} worker(s) of their own "
                            f"(--loop-rpc), as many as --rpc names")  # fmt: skip
    shares = ",".join(f"{share:g}" for share in placement.plan.device_shares)
    layers = str(placement.plan.n_gpu_layers)
    out = ["--rpc", ",".join(workers), "-ngl", layers, "-ts", shares, "--fit", "off"]  # fit: as told
    if not any(span.where == "here" and span.device != "CPU" for span in placement.plan.spans):
        out += ["-ot", r"^output\.weight$=CPU"]
    return tuple(out)


def reference_run(
    binary: Path,
    lm: EdgeSpec,
    config: Config,
    prompt: CorpusPrompt,
    repeat: int,
    max_tokens: int,
    *,
    loop_workers: tuple[str, ...] = (),
) -> Run:
    """The same prompt through one of llama.cpp's own loops (its decode phase), as a
    benchmark run; with our target split, theirs is split alike over ``loop_workers``."""
    messages, tools = conversation(prompt)
    text = render(lm.target, messages, tools=tools)
    threads = lm.target.options.n_threads or system.default_threads()
    loop = config.label.removeprefix("llama.cpp ")
    draft = lm.draft.path if lm.draft is not None else None
    split = split_options(lm, loop_workers)
    ref = run_loop(binary, loop, lm.target.path, draft, text, max_tokens, threads, lm.target.n_ctx, split)
    passes = max(ref.tokens - ref.accepted - 1, 1)  # one target token per verification
    return Run(
        prompt=prompt.id,
        category=prompt.category,
        config=config.label,
        repeat=repeat,
        seed=None,
        tokens=ref.delivered,
        decode_tps=ref.decode_tps,
        e2e_tps=math.nan,  # llama.cpp's prefill is not comparable with ours: decode phase only
        tau=(ref.tokens - 1) / passes,
        acceptance=ref.accepted / ref.drafted if ref.drafted else 0.0,
        target_passes=passes,
        drafted=ref.drafted,
        steps={},
        time_s={},
        python_share=math.nan,
    )


# ---------------------------------------------------------------- the bars against llama.cpp

BARS_FILE = Path(__file__).resolve().parent / "data" / "llamacpp_bars.toml"


@dataclass(frozen=True)
class LoopBars:
    """``data/llamacpp_bars.toml``: auto against llama.cpp's best loop (it says why)."""

    against_llamacpp: float
    against_llamacpp_prompt: float
    llamacpp_categories: tuple[str, ...]


def load_bars(path: Path = BARS_FILE) -> LoopBars:
    """The bars of ``path``; a key missing, unknown or of the wrong type is one line."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise EdgespecError(f"{path}: cannot read the bars ({e})") from None
    names = list(LoopBars.__dataclass_fields__)
    for key in [*data, *names]:
        if key not in names or key not in data:
            raise EdgespecError(f"{path}: {'unknown' if key not in names else 'missing'} bar {key!r}")
    try:
        categories = bench_cli.known_categories(path, "llamacpp_categories", data["llamacpp_categories"])
        return LoopBars(float(data["against_llamacpp"]), float(data["against_llamacpp_prompt"]),
                        tuple(categories))  # fmt: skip
    except (TypeError, ValueError) as e:
        raise EdgespecError(f"{path}: a bar has the wrong type ({e})") from None


def loop_bars(category: str, cells: dict[str, Cell], b: LoopBars) -> list[bench_cli.Bar]:
    """Auto against llama.cpp's best speculative loop, over the category and per prompt
    (only in the categories the bars name, and where llama.cpp's loops ran)."""
    labels = {c.label for c in LLAMACPP}
    loops = {label: c for label, c in cells.items() if label in labels}
    if not loops or category not in b.llamacpp_categories or "auto" not in cells:
        return []
    cell, near = cells["auto"], bench_cli.near
    best = max(loops, key=lambda label: loops[label].decode_ratio)
    vs, floor = cell.decode_ratio / loops[best].decode_ratio, b.against_llamacpp
    out = [(vs >= floor, f"{category}: auto ×{near(vs, floor)} of llama.cpp's best loop here "
                         f"({best}; geometric means; bar ≥ {floor:.2f})")]  # fmt: skip
    for prompt, ratio in cell.per_prompt.items():
        theirs = {label: c.per_prompt[prompt] for label, c in loops.items() if prompt in c.per_prompt}
        if theirs:
            top = max(theirs, key=lambda label: theirs[label])
            vs, floor = ratio / theirs[top], b.against_llamacpp_prompt
            out.append((vs >= floor, f"{prompt}: auto ×{near(vs, floor)} of llama.cpp's best loop on "
                                     f"it ({top}; bar ≥ {floor:.2f})"))  # fmt: skip
    return out


# ---------------------------------------------------------------- the command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab.llamacpp", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="build one of llama.cpp's tools (minutes, once)")
    make.add_argument("--tool", choices=TOOLS, default=TOOLS[0])
    make.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    bench_cli.add_parser(commands)  # `bench`: edgespec bench's corpus options, and one more
    commands.choices["bench"].add_argument(
        "--binary", default=None, help="the llama-speculative-simple to run (default: the one `build` made)"
    )
    commands.choices["bench"].add_argument(
        "--loop-rpc", default=None, metavar="HOST:PORT[,...]",
        help="with --rpc: the workers llama.cpp's loops split the target over, the same way (a worker "
             "serves one client at a time, and ours is taken)",
    )  # fmt: skip
    return parser


def run_bench(args: argparse.Namespace) -> int:
    """``edgespec bench`` on the corpus with llama.cpp's loops beside its configurations
    (all of them, unless --configs names some) and the bars against them."""
    if args.sessions is not None or args.parallel is not None:
        raise EdgespecError("--sessions and --parallel are edgespec bench's own: run them there")
    binary = Path(args.binary) if args.binary else default_binary()
    if not binary.is_file():
        raise EdgespecError(f"no llama.cpp tool at {binary}; build it with: python -m lab.llamacpp build")
    known = {**ALL_CONFIGS, **{c.label: c for c in LLAMACPP}}
    named = args.configs or DEFAULT_LABELS
    if not any(known.get(label) in LLAMACPP for label in named):
        args.configs = [*named, *(c.label for c in LLAMACPP)]
    if bool(args.rpc) != bool(args.loop_rpc):
        raise EdgespecError("--rpc and --loop-rpc go together: llama.cpp's loops need workers of their own")
    loop_workers = rpc.parse_endpoints(args.loop_rpc) if args.loop_rpc else ()
    bars = load_bars()
    return bench_cli.run_corpus(
        args,
        known=known,
        external=functools.partial(reference_run, binary, loop_workers=loop_workers),
        more_bars=lambda category, cells: loop_bars(category, cells, bars),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run() -> int:
        if args.command == "build":
            print(build(args.jobs, args.tool))
            return 0
        return run_bench(args)

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())

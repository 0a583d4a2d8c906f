"""Sessions: what a user waits for over a whole session of requests to a chat server.

    edgespec bench --sessions [WORKLOAD ...] [--split dev|test|all] [--repeats N]
        [--url [LABEL=]URL ...] [--edgespec] [--llama-server BINARY]
        [--edgespec-args="ARGS"] [--llama-server-args="ARGS"] [--json FILE]

Workloads (``data/sessions.toml``, each with a dev and a test variant): ``alternating``
(conversations taking turns, each opening with a ~2,000-token file, then short questions),
``agent`` (one agent loop whose history grows by a tool result per request), ``agent+chat``
(an agent loop and a short chat at once, from two client threads) and ``restart``
(alternating conversations, the server restarted in the middle: only for servers this
benchmark started). Every request is streamed, greedy, with a fixed ``max_tokens``, and
recorded: time to first token (the first non-empty content delta), end to end, prompt,
cached and completion tokens (``usage`` with ``stream_options.include_usage``, else
llama-server's ``timings``). A conversation's first request is ``cold``; its later ones are
``returning``; the first after a restart is ``resumed``.

Targets: ``--url`` servers already running, or servers started here, one at a time (two
model servers on one machine slow each other down): ``edgespec serve`` and, with
``--llama-server``, a llama.cpp server binary the user names, on the same GGUFs and threads
(a checkout builds one from the runtime's own sources: ``python -m lab.llamacpp build
--tool llama-server``). A started server is started afresh for every workload, so every
workload begins cold; targets take turns, the order alternating from workload to workload
and repeat to repeat. Each run's system prompts open with a tag of their own, so that no
cache (a ``--url`` server's, a cache on disk) carries a prefix over from an earlier run. The
workloads and their files are built in ``session_workloads.py``; the client and the servers
live in ``session_servers.py``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from edgespec.bench.session_servers import (
    Server,
    Settings,
    Target,
    api_url,
    chat,
    edgespec_command,
    llama_server_command,
)
from edgespec.bench.session_workloads import CHARS_PER_TOKEN, WORKLOADS, Workload, load_workloads
from edgespec.errors import EdgespecError

# ---------------------------------------------------------------- running a workload


@dataclass(frozen=True)
class Record:
    workload: str
    target: str
    repeat: int
    conversation: str
    turn: int
    phase: str  # cold: a conversation's first request; resumed: its first after a restart
    ttft_s: float | None
    e2e_s: float
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    cache_n: int | None
    prompt_n: int | None
    at_s: float  # when the request was sent, from the workload's start

    @property
    def wait_s(self) -> float:
        """What the user waited for the first token; a reply with no content at all made
        them wait for the whole of it."""
        return self.e2e_s if self.ttft_s is None else self.ttft_s


@dataclass
class WorkloadRun:
    workload: str
    kind: str
    target: str
    repeat: int
    wall_s: float | None = None  # first request sent to last answer, restarts left out
    restart_s: float = 0.0
    note: str = ""
    records: list[Record] = field(default_factory=list)


class _Session:
    """One workload on one serving target: the conversations' histories, the records."""

    def __init__(self, workload: Workload, server: Server, settings: Settings, run: WorkloadRun, tag: str,
                 emit: Callable[[Record], None]):  # fmt: skip
        self.workload, self.server, self.settings, self.run, self.emit = workload, server, settings, run, emit
        # The run's tag first: no cache can hold this prefix from an earlier run.
        self.histories = [
            [{"role": "system", "content": f"Session {tag}.\n{c.system}"}] for c in workload.conversations
        ]
        self.resumed: set[int] = set()
        self.lock = threading.Lock()
        self.failed = threading.Event()
        self.started = time.perf_counter()

    def ask(self, index: int, turn: int) -> None:
        conversation, history = self.workload.conversations[index], self.histories[index]
        user = {"role": "user", "content": conversation.turns[turn]}
        at = time.perf_counter() - self.started
        reply = chat(self.server.endpoint, [*history, user], max_tokens=self.settings.max_tokens,
                     timeout=self.settings.request_timeout_s)  # fmt: skip
        history += [user, {"role": "assistant", "content": reply.text}]
        phase = "cold" if turn == 0 else "resumed" if index in self.resumed else "returning"
        self.resumed.discard(index)
        record = Record(self.workload.id, self.run.target, self.run.repeat, conversation.name, turn, phase,
                        reply.ttft_s, reply.e2e_s, reply.prompt_tokens, reply.cached_tokens,
                        reply.completion_tokens, reply.cache_n, reply.prompt_n, at)  # fmt: skip
        with self.lock:
            self.run.records.append(record)
            self.emit(record)

    def alternate(self) -> None:
        """Round by round, every conversation that has a turn left takes it."""
        for round_ in range(max(len(c.turns) for c in self.workload.conversations)):
            if round_ == self.workload.restart_after:
                self.run.restart_s += self.server.restart()
                self.resumed = set(range(len(self.workload.conversations)))
            for index, conversation in enumerate(self.workload.conversations):
                if round_ < len(conversation.turns):
                    self.ask(index, round_)

    def at_once(self) -> None:
        """Every conversation from its own client thread, all at the same time."""
        errors: list[BaseException] = []

        def client(index: int) -> None:
            try:
                for turn in range(len(self.workload.conversations[index].turns)):
                    if self.failed.is_set():
                        return
                    self.ask(index, turn)
            except BaseException as e:
                errors.append(e)
                self.failed.set()

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(len(self.workload.conversations))]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # joined in slices: Ctrl-C still reaches this thread
                thread.join(0.2)
        if errors:
            raise errors[0]


def run_workload(workload: Workload, target: Target, settings: Settings, repeat: int, tag: str,
                 emit: Callable[[Record], None] = lambda r: None) -> WorkloadRun:  # fmt: skip
    """``workload`` on ``target``: a started target is started for it and stopped after."""
    run = WorkloadRun(workload.id, workload.kind, target.label, repeat)
    if workload.restart_after is not None and not target.started_here:
        run.note = "skipped: a server given with --url cannot be restarted from here"
        return run
    with Server(target, settings) as server:
        session = _Session(workload, server, settings, run, tag, emit)
        session.at_once() if workload.concurrent else session.alternate()
        run.wall_s = time.perf_counter() - session.started - run.restart_s
    return run


def run_all(workloads: list[Workload], targets: list[Target], settings: Settings, repeats: int, tag: str,
            emit: Callable[[Record], None] = lambda r: None,
            runs: list[WorkloadRun] | None = None) -> list[WorkloadRun]:  # fmt: skip
    """Every workload on every target, one server at a time; the targets' order turns
    from workload to workload and repeat to repeat, so that none always goes first. Each
    finished run is appended to ``runs`` (and returned): a run stopped midway keeps them."""
    runs = [] if runs is None else runs
    for repeat in range(repeats):
        for number, workload in enumerate(workloads):
            order = targets if (repeat + number) % 2 == 0 else targets[::-1]
            for target in order:
                print(f"== {workload.id} on {target.label} (repeat {repeat + 1}/{repeats})", file=sys.stderr,
                      flush=True)  # fmt: skip
                run = run_workload(workload, target, settings, repeat, f"{tag}.{repeat}", emit)
                if run.note:
                    print(f"   {run.note}", file=sys.stderr, flush=True)
                runs.append(run)
    return runs


def print_record(record: Record) -> None:
    ttft = "   none" if record.ttft_s is None else f"{record.ttft_s:6.2f}s"
    cached = "?" if record.cached_tokens is None else record.cached_tokens
    print(f"  {record.workload:<18} {record.target:<14} #{record.repeat} {record.conversation:<9} "
          f"turn {record.turn} {record.phase:<9} ttft {ttft}  e2e {record.e2e_s:6.2f}s  "
          f"prompt {record.prompt_tokens} (cached {cached})  {record.completion_tokens} tok",
          file=sys.stderr, flush=True)  # fmt: skip


# ---------------------------------------------------------------- the summary


@dataclass(frozen=True)
class Row:
    workload: str
    target: str
    requests: int
    cold_ttft_s: float | None  # medians over every repeat's requests of the phase
    returning_ttft_s: float | None
    resumed_ttft_s: float | None
    cached_share: float | None  # returning requests: cached prompt tokens / prompt tokens
    e2e_s: float | None
    wall_s: float | None  # median over repeats
    note: str = ""

    @property
    def returning_ratio(self) -> float | None:
        return ratio(self.returning_ttft_s, self.cold_ttft_s)

    @property
    def resumed_ratio(self) -> float | None:
        return ratio(self.resumed_ttft_s, self.cold_ttft_s)


def median(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole


def cached_share(records: Iterable[Record]) -> float | None:
    """Of the prompt tokens of the requests that report both counts, the share cached."""
    known = [
        (r.cached_tokens, r.prompt_tokens) for r in records if r.cached_tokens is not None and r.prompt_tokens
    ]
    return sum(c for c, _ in known) / sum(p for _, p in known) if known else None


def summarize(runs: list[WorkloadRun]) -> list[Row]:
    """One row per workload and target, in the order they first ran."""
    groups: dict[tuple[str, str], list[WorkloadRun]] = {}
    for run in runs:
        groups.setdefault((run.workload, run.target), []).append(run)
    rows = []
    for (workload, target), group in groups.items():
        records = [r for run in group for r in run.records]

        def waits(phase: str, records: list[Record] = records) -> list[float | None]:
            return [r.wait_s for r in records if r.phase == phase]

        rows.append(Row(
            workload, target, len(records), median(waits("cold")), median(waits("returning")),
            median(waits("resumed")), cached_share(r for r in records if r.phase == "returning"),
            median(r.e2e_s for r in records), median(run.wall_s for run in group),
            "; ".join(sorted({run.note for run in group if run.note})),
        ))  # fmt: skip
    return rows


def _cell(value: float | None, form: str = "{:.2f}") -> str:
    return "–" if value is None else form.format(value)


def markdown(rows: list[Row]) -> str:
    """The summary as a Markdown table (TTFT: time to first token, medians in seconds)."""
    lines = ["| workload | target | requests | cold TTFT s | returning TTFT s | returning/cold "
             "| after restart TTFT s | restart/cold | cached (returning) | e2e s | wall s |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for row in rows:
        if not row.requests:  # skipped: the note across the figures' columns
            lines.append(" | ".join(["| " + row.workload, row.target, "0", row.note, *[""] * 7]) + " |")
            continue
        lines.append(" | ".join([
            f"| {row.workload}", row.target, str(row.requests), _cell(row.cold_ttft_s),
            _cell(row.returning_ttft_s), _cell(row.returning_ratio, "×{:.2f}"), _cell(row.resumed_ttft_s),
            _cell(row.resumed_ratio, "×{:.2f}"), _cell(row.cached_share, "{:.0%}"), _cell(row.e2e_s),
            _cell(row.wall_s, "{:.1f}") + " |",
        ]))  # fmt: skip
    return "\n".join(lines)


def write_json(path: str, header: dict, runs: list[WorkloadRun], rows: list[Row]) -> None:
    summary = [
        {**asdict(r), "returning_ratio": r.returning_ratio, "resumed_ratio": r.resumed_ratio} for r in rows
    ]
    record = {**header, "summary": summary, "runs": [asdict(run) for run in runs]}
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, ensure_ascii=False)
    except OSError as e:
        raise EdgespecError(f"cannot write {path}: {e.strerror or e}") from None


# ---------------------------------------------------------------- the command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``edgespec bench --sessions``'s own options (the corpus benchmark's --split,
    --target, --draft, --regime, --ctx, --threads, --max-tokens, --repeats, --json apply)."""
    group = parser.add_argument_group("sessions (--sessions): whole sessions of requests to chat servers")
    group.add_argument("--sessions", nargs="*", default=None, metavar="WORKLOAD",
                       help=f"run the sessions benchmark instead: these workloads (default: all of "
                            f"{', '.join(WORKLOADS)}); --max-tokens defaults to 64 here")  # fmt: skip
    group.add_argument("--url", action="append", default=[], metavar="[LABEL=]URL",
                       help="a running OpenAI-compatible server (repeatable), e.g. llama-server="
                            "http://127.0.0.1:8081/v1; edgespec serve is then not started")  # fmt: skip
    group.add_argument("--edgespec", action="store_true", help="with --url: start edgespec serve as well")
    group.add_argument("--llama-server", default=None, metavar="BINARY",
                       help="also start this llama-server binary on the same GGUFs")  # fmt: skip
    group.add_argument(
        "--edgespec-args",
        default="",
        metavar='"ARGS"',
        help='more options for edgespec serve, e.g. --edgespec-args="--cache-ram 2"',
    )
    group.add_argument(
        "--llama-server-args", default="", metavar='"ARGS"', help="more options for llama-server"
    )
    group.add_argument(
        "--model", default=None, help="the model field sent (default: the first /v1/models lists)"
    )
    group.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    group.add_argument("--startup-timeout", type=float, default=900.0, metavar="S",
                       help="seconds a started server may take to be ready (default 900)")  # fmt: skip
    group.add_argument("--request-timeout", type=float, default=900.0, metavar="S",
                       help="seconds a request may wait for data (default 900)")  # fmt: skip


_CORPUS_ONLY = ("categories", "prompts", "configs", "sampling")


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings, or one line for a value out of range or a corpus-only option."""
    for name in _CORPUS_ONLY:
        if getattr(args, name, None):
            raise EdgespecError(f"--{name} is the corpus benchmark's; --sessions does not take it")
    unknown = [w for w in args.sessions if w not in WORKLOADS]
    if unknown:
        raise EdgespecError(f"unknown sessions workload {unknown[0]!r} (known: {', '.join(WORKLOADS)})")
    settings = Settings(
        max_tokens=64 if args.max_tokens is None else args.max_tokens,
        ctx=args.ctx,
        threads=(os.cpu_count() or 1) if args.threads is None else args.threads,
        model=args.model,
        api_key=args.api_key,
        startup_timeout_s=args.startup_timeout,
        request_timeout_s=args.request_timeout,
    )
    if settings.max_tokens < 1 or args.repeats < 1 or settings.threads < 1:
        raise EdgespecError("--max-tokens, --repeats and --threads must be at least 1")
    if 0 < settings.ctx < 16 or settings.ctx < 0:
        raise EdgespecError(f"--ctx must be at least 16 tokens, or 0 for the model's (got {settings.ctx})")
    if min(settings.startup_timeout_s, settings.request_timeout_s) <= 0:
        raise EdgespecError("the timeouts must be positive")
    return settings


def too_long(workloads: list[Workload], settings: Settings) -> list[str]:
    """The conversations that may not fit in ``ctx`` (their text at 4 characters a token,
    every answer at ``max_tokens``): a warning, as the estimate is rough."""
    found = []
    for workload in workloads:
        for c in workload.conversations:
            tokens = (len(c.system) + sum(map(len, c.turns))) // CHARS_PER_TOKEN
            tokens += len(c.turns) * settings.max_tokens
            if settings.ctx and tokens > settings.ctx:
                found.append(f"{workload.id}/{c.name}: about {tokens} tokens > --ctx {settings.ctx}")
    return found


def url_target(value: str, number: int) -> Target:
    """``LABEL=URL`` or a bare URL (labelled by its host and port)."""
    label, sep, url = value.partition("=")
    if not sep or "://" in label:
        label, url = urlsplit(value).netloc or f"url{number}", value
    return Target(label.strip(), url=api_url(url))


def gguf_paths(target: str, draft: str) -> tuple[Path, Path | None]:
    """The GGUF files ``edgespec serve --target T --draft D`` loads, for llama-server: a
    catalog name (``default`` included) resolved as edgespec resolves it, a path as it is."""
    from edgespec.models import catalog
    from edgespec.models.resolve import resolve

    def path(name: str, role: str) -> Path:
        return resolve(catalog.default_name(role) if name == "default" else name).path

    return path(target, "target"), None if draft in ("", "none") else path(draft, "draft")


def llama_server_binary(given: str) -> Path:
    binary = Path(given)
    if not binary.is_file():
        raise EdgespecError(f"no llama-server at {binary}")
    return binary


def targets_from(args: argparse.Namespace, settings: Settings) -> list[Target]:
    """edgespec serve (unless only --url servers are asked for), llama-server with
    --llama-server, then the --url servers; the models are the regime's pair."""
    targets = []
    if not args.url or args.edgespec or args.llama_server is not None:
        from edgespec.bench.regimes import pair_for

        pair = pair_for(args.regime, args.target, args.draft)  # f16: converted once, cached
        if not args.url or args.edgespec:
            extra = args.edgespec_args
            if "--cache-dir" not in extra:  # what a user keeps conversations warm across a restart with
                kv = tempfile.mkdtemp(prefix="edgespec-sessions-kv-")
                atexit.register(shutil.rmtree, kv, True)
                extra = f"{extra} --cache-dir {kv}"
            command = edgespec_command(pair.target, pair.draft, settings, extra)
            targets.append(Target("edgespec", command=command))
        if args.llama_server is not None:
            binary = llama_server_binary(args.llama_server)
            command = llama_server_command(binary, *gguf_paths(pair.target, pair.draft), settings,
                                           args.llama_server_args)  # fmt: skip
            targets.append(Target("llama-server", command=command))
    targets += [url_target(value, i + 1) for i, value in enumerate(args.url)]
    labels = [t.label for t in targets]
    if len(set(labels)) < len(labels):
        raise EdgespecError(f"two targets share a label ({', '.join(labels)}); name them with LABEL=URL")
    return targets


def run_from_args(args: argparse.Namespace) -> int:
    """``edgespec bench --sessions``: one line per request on stderr, the summary on stdout."""
    settings = settings_from(args)
    workloads = load_workloads(args.split, args.sessions or WORKLOADS)
    targets = targets_from(args, settings)
    for line in too_long(workloads, settings):
        print(f"edgespec: warning: {line}", file=sys.stderr)
    header = {"split": args.split, "repeats": args.repeats, "tag": secrets.token_hex(3), **asdict(settings),
              "targets": [asdict(t) for t in targets], "workloads": [w.id for w in workloads]}  # fmt: skip
    header.pop("api_key")
    print(f"edgespec bench --sessions: {len(workloads)} workloads × {len(targets)} targets × {args.repeats} "
          f"repeats, max_tokens {settings.max_tokens}, {settings.threads} threads, ctx {settings.ctx}",
          file=sys.stderr, flush=True)  # fmt: skip
    runs: list[WorkloadRun] = []
    try:
        run_all(workloads, targets, settings, args.repeats, header["tag"], print_record, runs)
        header["complete"] = True
    finally:  # stopped by an error or Ctrl-C: the workloads that finished are still reported
        header.setdefault("complete", False)
        if runs:
            report(args.json, header, runs)
    return 0


def report(json_path: str | None, header: dict, runs: list[WorkloadRun]) -> None:
    rows = summarize(runs)
    note = "" if header["complete"] else ", stopped before the end: the workloads that finished"
    print(f"\n## Sessions (split {header['split']}, {header['repeats']} repeats, max_tokens "
          f"{header['max_tokens']}, {header['threads']} threads{note})\n\n{markdown(rows)}")  # fmt: skip
    if json_path:
        write_json(json_path, header, runs, rows)

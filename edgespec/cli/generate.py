"""``edgespec generate`` and ``edgespec chat``.

Both share one set of flags (models, runtime, drafter, sampling). ``generate --json``
prints one JSON object as the last line of stdout: the contract other tools rely on.
"""

from __future__ import annotations

import argparse
import json
import sys

from edgespec.api import DEFAULT_MAX_GAMMA, EdgeSpec, RuntimeOptions, settings_from
from edgespec.decoding.engine import GenerationSettings
from edgespec.decoding.events import Done, Token
from edgespec.decoding.policy import DRAFTER_CHOICES
from edgespec.errors import EdgespecError


def _gamma(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        gamma = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"gamma must be a number or 'auto' (got {value!r})") from None
    return gamma


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models and runtime")
    models.add_argument(
        "--target", default="default", help="catalog name or GGUF path (default: the default target)"
    )
    models.add_argument(
        "--draft", default="default", help="catalog name or GGUF path (default: the default draft)"
    )
    models.add_argument("--ctx", type=int, default=4096, help="context length in tokens (default 4096)")
    models.add_argument(
        "--n-gpu-layers", type=int, default=-1, help="target layers on the GPU (-1: all, where a GPU exists)"
    )
    models.add_argument(
        "--n-gpu-layers-draft", type=int, default=-1, help="draft layers on the GPU (-1: all)"
    )
    models.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    models.add_argument("--rollback", choices=("auto", "truncate", "snapshot"), default="auto",
                        help="how caches are cut back after a rejection (default: auto)")  # fmt: skip
    models.add_argument("--verbose", action="store_true", help="show llama.cpp's own log")


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    spec = parser.add_argument_group("speculation")
    spec.add_argument("--drafter", choices=DRAFTER_CHOICES, default="auto",
                      help="who drafts: draft model, n-gram lookup, nobody (target only), auto")  # fmt: skip
    spec.add_argument("--gamma", type=_gamma, default="auto", help="tokens drafted per step, or 'auto'")
    spec.add_argument("--verify", choices=("token", "block"), default="token",
                      help="acceptance rule when sampling (block: Sun et al. 2024)")  # fmt: skip
    spec.add_argument("--lenience", type=float, default=1.0,
                      help="λ in (0, 1]: accept if u < p/(λq); 1 is exact, less changes output")  # fmt: skip
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    sampling.add_argument("--top-k", type=int, default=0, help="0 = off")
    sampling.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    sampling.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    sampling.add_argument("--seed", type=int, default=None, help="same seed, same text")
    sampling.add_argument("--max-tokens", type=int, default=512, help="default 512")
    sampling.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)"
    )


def add_parsers(subparsers) -> None:
    gen = subparsers.add_parser("generate", help="generate text from a prompt, streamed to stdout")
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text (default: read stdin)")
    source.add_argument("--prompt-file", help="read the prompt from a file")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", help="system message (implies --chat)")
    gen.add_argument("--json", action="store_true", help="print one JSON result object as the last line")
    add_model_flags(gen)
    add_decoding_flags(gen)
    gen.set_defaults(handler=run_generate)

    chat = subparsers.add_parser("chat", help="interactive chat in the terminal")
    chat.add_argument("--system", help="system message")
    add_model_flags(chat)
    add_decoding_flags(chat)
    chat.set_defaults(handler=run_chat)


def settings_from_args(args: argparse.Namespace) -> GenerationSettings:
    return settings_from(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
        lenience=args.lenience,
        verify=args.verify,
    )


def check_decoding_args(args: argparse.Namespace) -> None:
    """Reject bad values before loading gigabytes of model."""
    settings_from_args(args)
    if isinstance(args.gamma, int) and args.gamma < 0:
        raise EdgespecError(f"gamma must be >= 0 (got {args.gamma})")
    if isinstance(args.gamma, int) and args.gamma >= args.ctx:
        raise EdgespecError(f"gamma {args.gamma} does not fit in a context of {args.ctx} tokens")
    if args.ctx < 16:
        raise EdgespecError(f"context length must be at least 16 tokens (got {args.ctx})")
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")


def runtime_options(args: argparse.Namespace, max_gamma: int = DEFAULT_MAX_GAMMA) -> RuntimeOptions:
    """The runtime the model flags (``add_model_flags``) ask for."""
    return RuntimeOptions(
        n_ctx=args.ctx,
        n_gpu_layers=args.n_gpu_layers,
        n_gpu_layers_draft=args.n_gpu_layers_draft,
        threads=args.threads,
        rollback=args.rollback,
        max_gamma=max(max_gamma, 1),
        verbose=args.verbose,
    )


def load(args: argparse.Namespace) -> EdgeSpec:
    max_gamma = args.gamma if isinstance(args.gamma, int) and args.gamma > 0 else DEFAULT_MAX_GAMMA
    needs_draft = args.drafter in ("model", "auto") and args.draft not in ("", "none")
    return EdgeSpec(args.target, args.draft if needs_draft else None, runtime_options(args, max_gamma))


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        text = args.prompt
    elif args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise EdgespecError(f"prompt file not found: {args.prompt_file}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgespecError(f"cannot read prompt file {args.prompt_file}: {exc}") from None
    elif sys.stdin.isatty():
        raise EdgespecError("no prompt: give --prompt TEXT, --prompt-file FILE, or pipe text on stdin")
    else:
        text = sys.stdin.read()
    if not text.strip():
        raise EdgespecError("the prompt is empty")
    return text


def run_generate(args: argparse.Namespace) -> int:
    check_decoding_args(args)
    prompt = read_prompt(args)
    lm = load(args)
    chat = args.chat or bool(args.system)
    tokens = lm.prompt_tokens(prompt, chat=chat, system=args.system)
    done = None
    for event in lm.stream(tokens, settings_from_args(args), drafter=args.drafter, gamma=args.gamma):
        if isinstance(event, Token) and not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
    assert done is not None
    if args.json:
        print(json.dumps(done.as_dict(), ensure_ascii=False))
    else:
        sys.stdout.write(done.tail + "\n")
        print(summary_line(done), file=sys.stderr)
    return 0


def summary_line(done: Done) -> str:
    s = done.stats
    return (
        # One "tok/s" for both figures: scripts and tests count answers by it.
        f"[{s.tokens} tokens, decode {s.decode_tokens_per_second:.1f} / "
        f"end-to-end {s.tokens_per_second:.1f} tok/s, τ {s.tau:.2f}, "
        f"accepted {s.accepted}/{s.drafted} ({100 * s.acceptance_rate:.0f}%), "
        f"ttft {s.ttft_s:.2f} s, stop: {done.stop_reason}]"
    )


def run_chat(args: argparse.Namespace) -> int:
    check_decoding_args(args)
    lm = load(args)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print(f"edgespec chat — target {lm.target.name}, draft {lm.draft.name if lm.draft else 'none'}. "
          "Empty line or Ctrl-D to quit; /clear starts over.", file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = input("you> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/clear":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        done = None
        try:
            for event in lm.stream(
                messages, settings_from_args(args), drafter=args.drafter, gamma=args.gamma
            ):
                if isinstance(event, Token):
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Done):
                    done = event
        except KeyboardInterrupt:
            lm.stop()
            print("\n[stopped]", file=sys.stderr)
            messages.pop()
            continue
        except EdgespecError as exc:
            print(f"\nedgespec: error: {exc}", file=sys.stderr)
            messages.pop()
            continue
        assert done is not None
        sys.stdout.write(done.tail + "\n")
        print(summary_line(done), file=sys.stderr)
        messages.append({"role": "assistant", "content": done.text})

"""``edgespec generate`` and ``edgespec chat``.

Both share one set of flags (models, runtime, drafter, sampling). ``generate --json``
prints one JSON object as the last line of stdout: the contract other tools rely on.
The prompt is the command's words (``edgespec generate "text"``), ``--prompt``,
``--prompt-file`` or stdin. Drafter and γ are checked by ``decoding.choice``, the one
check the API, the server and the app share. ``--prediction FILE`` is the request's
predicted output (a file the answer revises: what the app's canvas sends as well), so an
edit the app made can be reproduced here exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from pathlib import Path

from edgespec.api import EdgeSpec, RuntimeOptions, check_prompt_text, settings_from
from edgespec.cli.rpc_flags import add_rpc_flags
from edgespec.decoding.choice import DEFAULT_DRAFTER, DEFAULT_GAMMA, MAX_GAMMA, check_choice
from edgespec.decoding.drafters import AUTO, CHOICE_HELP, CHOICES, REGISTRY
from edgespec.decoding.events import Done, Token
from edgespec.decoding.request import GenerationSettings
from edgespec.errors import EdgespecError
from edgespec.models.recommend import total_memory_bytes
from edgespec.runtime import rpc
from edgespec.runtime.prompt_cache import GIB, CacheOptions


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a help text with line breaks keeps them: the
    drafter list reads as a table, an indented row wrapping under its description."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        if "\n" not in text:
            return super()._split_lines(text, width)
        lines: list[str] = []
        for line in text.splitlines():
            name = re.match(r" +\S+ +", line)
            hang = " " * (name.end() if name else 0)
            lines.extend(textwrap.wrap(line, width, subsequent_indent=hang) or [""])
        return lines


def _drafter_help() -> str:
    width = max(len(name) for name in CHOICES)
    rows = "\n".join(f"  {name:<{width}}  {CHOICE_HELP[name]}" for name in CHOICES)
    # argparse fills help texts in with "%": a description's own "%" must stay one.
    return f"who drafts (default: {DEFAULT_DRAFTER}):\n{rows}".replace("%", "%%")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models and runtime")
    models.add_argument(
        "--target", default="default", help="catalog name or GGUF path (default: the default target)"
    )
    models.add_argument(
        "--draft", default="default", help="catalog name or GGUF path (default: the default draft)"
    )
    models.add_argument("--ctx", type=int, default=0,
                        help="context length in tokens per conversation (default 0: what the model "
                             "was trained for, bounded by this machine's memory; never more than it was "
                             "trained for)")  # fmt: skip
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
    models.add_argument("--cache-ram", type=float, default=None, metavar="GIB",
                        help="host memory for idle conversations' KV states, so a returning one "
                             "reads only its new tokens (default where a server or app runs: a "
                             "quarter of this machine's memory, at most 8; 0 turns it off)")  # fmt: skip
    models.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="also keep those states on disk, so a restart answers a returning "
                             "conversation warm")  # fmt: skip
    add_rpc_flags(models)


def add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    spec = parser.add_argument_group("speculation")
    # Plain strings here: decoding.choice checks them, with the same words as the server.
    spec.add_argument("--drafter", default=DEFAULT_DRAFTER, metavar="NAME", help=_drafter_help())
    spec.add_argument("--gamma", default=DEFAULT_GAMMA, metavar="N",
                      help=f"tokens drafted per step: 'auto' (default: the controller picks per step) "
                      f"or 0..{MAX_GAMMA}")  # fmt: skip
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
    shaping = parser.add_argument_group("penalties, structured output, log-probabilities")
    shaping.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2] (default 0: off)")
    shaping.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2] (default 0: off)")
    shaping.add_argument("--repeat-penalty", type=float, default=1.0, help="llama.cpp's (default 1: off)")
    shaping.add_argument(
        "--repeat-last-n", type=int, default=64, help="tokens the penalties look back (default 64)"
    )
    shaping.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS (-100..100) to token ID's logit (repeatable; -100 bans it)",
    )
    shaping.add_argument("--json-schema", metavar="FILE", help="answer with JSON values of this JSON schema")
    shaping.add_argument("--grammar", metavar="FILE", help="answer in this GBNF grammar (llama.cpp's format)")
    shaping.add_argument(
        "--logprobs",
        type=int,
        metavar="N",
        help="with --json: each token's log-probability and the N most likely tokens there (0-20)",
    )


def add_parsers(subparsers) -> None:
    gen = subparsers.add_parser(
        "generate",
        help="generate text from a prompt, streamed to stdout",
        description='Generate text from a prompt: edgespec generate "text" (or --prompt TEXT, '
        "--prompt-file FILE, or text piped on stdin).",
        formatter_class=HelpFormatter,
    )
    # The words of the command are the prompt, as a newcomer first types it; --prompt
    # stays for scripts and for prompts that start with "-".
    gen.add_argument(
        "words", nargs="*", metavar="PROMPT", help="prompt text (words joined by spaces; quoted: as is)"
    )
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text (default: the PROMPT words, else stdin)")
    source.add_argument("--prompt-file", help="read the prompt from a file")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", help="system message (implies --chat)")
    gen.add_argument("--json", action="store_true", help="print one JSON result object as the last line")
    gen.add_argument("--prediction", metavar="FILE",
                     help="the text the answer is expected to be, mostly (a file to revise: "
                          "OpenAI's Predicted Outputs): the copy drafters propose from it; the "
                          "answer stays exactly the target's (give --max-tokens room for it)")  # fmt: skip
    add_model_flags(gen)
    add_decoding_flags(gen)
    gen.set_defaults(handler=run_generate)

    chat = subparsers.add_parser(
        "chat", help="interactive chat in the terminal", formatter_class=HelpFormatter
    )
    chat.add_argument("--system", help="system message")
    add_model_flags(chat)
    add_decoding_flags(chat)
    chat.set_defaults(handler=run_chat)


def _logit_bias(items: list[str]) -> dict[int, float]:
    bias = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise EdgespecError(f"--logit-bias takes ID=BIAS, such as 1234=-100 (got {item!r})") from None
        if not sep:
            raise EdgespecError(f"--logit-bias takes ID=BIAS, such as 1234=-100 (got {item!r})")
    return bias


def _read(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgespecError(f"{flag}: cannot read {path}: {exc}") from None


def _schema(path: str | None) -> dict | None:
    text = _read(path, "--json-schema")
    if text is None:
        return None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise EdgespecError(f"--json-schema: {path} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise EdgespecError(f"--json-schema: {path} must hold a JSON object (a schema)")
    return schema


def settings_from_args(args: argparse.Namespace) -> GenerationSettings:
    if args.logprobs is not None and not args.json:
        raise EdgespecError("--logprobs needs --json: log-probabilities are reported in the JSON result")
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
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        logit_bias=_logit_bias(args.logit_bias),
        json_schema=_schema(args.json_schema),
        grammar=_read(args.grammar, "--grammar"),
        logprobs=args.logprobs,
    )


def _loads_draft(args: argparse.Namespace) -> bool:
    """Whether the draft model is loaded: only where the drafter may use it."""
    if args.draft in ("", "none"):
        return False
    return args.drafter == AUTO or (args.drafter in REGISTRY and REGISTRY[args.drafter].needs_model)


def check_decoding_args(args: argparse.Namespace) -> GenerationSettings:
    """Reject bad values before loading gigabytes of model, and return the answers'
    settings, made (and checked) once; ``args.drafter`` and ``args.gamma`` become the
    checked values (γ an int unless 'auto'). What needs the model (``--logit-bias``'s
    token ids) the request builder checks once it is loaded."""
    settings = settings_from_args(args)
    check_ctx(args.ctx)
    args.drafter, args.gamma = check_choice(args.drafter, args.gamma, has_draft=_loads_draft(args))
    # A draft must leave room in the context for the token after it.
    if isinstance(args.gamma, int) and args.ctx and args.gamma >= args.ctx:
        raise EdgespecError(f"gamma {args.gamma} does not fit in a context of {args.ctx} tokens")
    if args.threads is not None and args.threads < 1:
        raise EdgespecError(f"threads must be >= 1 (got {args.threads})")
    if args.system is not None:
        utf8_text(args.system, "--system")
    for stop in args.stop:
        utf8_text(stop, "--stop")
    return settings


def utf8_text(text: str, what: str) -> str:
    """``text`` as given when UTF-8 can carry it; a clear error otherwise.

    Python reads arguments and stdin that are not UTF-8 with one lone surrogate for each
    byte it cannot decode, and no tokenizer takes those."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise EdgespecError(
            f"{what} is not UTF-8 text ({bad} at character {exc.start + 1}); "
            "convert it first, e.g. with iconv -t UTF-8"
        ) from None
    return text


def cache_options(args: argparse.Namespace, *, serving: bool) -> CacheOptions:
    """The prompt cache ``--cache-ram`` and ``--cache-dir`` ask for. A server or the app
    gets one by default; a one-shot ``generate`` only with a directory to keep it in."""
    ram = args.cache_ram
    if ram is None:
        ram = default_cache_gib() if serving or args.cache_dir else 0.0
    if ram < 0:
        raise EdgespecError(f"--cache-ram must be >= 0 GiB (got {ram:g})")
    directory = Path(args.cache_dir).expanduser() if args.cache_dir else None
    if directory is not None:
        _usable_directory(directory)
    return CacheOptions(ram_bytes=int(ram * GIB), directory=directory)


def _usable_directory(directory: Path) -> None:
    """Made if need be and writable, or one line naming why not, before any model loads."""
    if directory.exists() and not directory.is_dir():
        raise EdgespecError(f"--cache-dir: {directory} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgespecError(f"--cache-dir: cannot make {directory}: {exc.strerror}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise EdgespecError(f"--cache-dir: {directory} is not writable")


def default_cache_gib() -> float:
    """A quarter of this machine's memory, at most 8 GiB (llama-server's own default)."""
    total = total_memory_bytes()
    return min(8.0, total / 4 / GIB) if total else 2.0


def check_ctx(ctx: int) -> None:
    if ctx != 0 and ctx < 16:
        raise EdgespecError(f"context length must be at least 16 tokens, or 0 for the model's (got {ctx})")


def rpc_options(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The workers and the split ``--rpc`` and ``--tensor-split`` ask for, each worker reached
    and greeted now: a worker that is down is one line naming it, before any model loads."""
    split = rpc.parse_split(args.tensor_split) if args.tensor_split is not None else ()
    if not args.rpc:
        if split:
            raise EdgespecError("--tensor-split splits the target over workers: give them with --rpc")
        return (), ()
    endpoints = rpc.parse_endpoints(args.rpc)
    rpc.library()  # this build has the RPC backend, or one line saying how to get it
    for endpoint in endpoints:
        rpc.check_worker(endpoint)
    return endpoints, split


def runtime_options(
    args: argparse.Namespace, max_gamma: int = MAX_GAMMA, *, serving: bool = False, parallel: int = 1
) -> RuntimeOptions:
    """The runtime the model flags (``add_model_flags``) ask for, with ``parallel`` answers
    decoding at once."""
    endpoints, split = rpc_options(args)
    return RuntimeOptions(
        rpc=endpoints,
        tensor_split=split,
        n_ctx=args.ctx,
        n_gpu_layers=args.n_gpu_layers,
        n_gpu_layers_draft=args.n_gpu_layers_draft,
        threads=args.threads,
        rollback=args.rollback,
        max_gamma=max(max_gamma, 1),
        verbose=args.verbose,
        cache=cache_options(args, serving=serving),
        parallel=parallel,
        engine_thread=serving,  # a server's answers are read from many threads
    )


def load(args: argparse.Namespace) -> EdgeSpec:
    # A fixed γ bounds every verification: the logits buffer is sized to it.
    max_gamma = args.gamma if isinstance(args.gamma, int) and args.gamma > 0 else MAX_GAMMA
    draft = args.draft if _loads_draft(args) else None
    return EdgeSpec(args.target, draft, runtime_options(args, max_gamma))


def read_prompt(args: argparse.Namespace) -> str:
    if args.words and (args.prompt is not None or args.prompt_file):
        flag = "--prompt" if args.prompt is not None else "--prompt-file"
        raise EdgespecError(
            f"two prompts: {' '.join(args.words)!r} and {flag}; give one "
            f"(edgespec generate 'text', or --prompt 'text')"
        )
    if args.words:
        text = " ".join(args.words)
    elif args.prompt is not None:
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
        raise EdgespecError(
            "no prompt: give it as edgespec generate 'text', --prompt-file FILE, or pipe text on stdin"
        )
    else:
        text = sys.stdin.read()
    check_prompt_text(text)  # the API's own rule, before any model loads
    return utf8_text(text, "the prompt")


def run_generate(args: argparse.Namespace) -> int:
    settings = check_decoding_args(args)
    prompt = read_prompt(args)
    # Read before the model loads: a missing file is one line, not minutes of loading first.
    prediction = _read(args.prediction, "--prediction")
    lm = load(args)
    chat = args.chat or bool(args.system)
    tokens = lm.prompt_tokens(prompt, chat=chat, system=args.system)
    done = None
    scored: list[dict] = []
    stream = lm.stream(tokens, settings, drafter=args.drafter, gamma=args.gamma, prediction=prediction)
    for event in stream:
        if isinstance(event, Token) and not args.json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Token) and event.logprob is not None:
            scored.append({"token": event.token, "logprob": event.logprob, "top": event.top_logprobs})
        elif isinstance(event, Done):
            done = event
    assert done is not None
    if args.json:
        result = done.as_dict()
        if args.logprobs is not None:
            result["logprobs"] = scored
        print(json.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write(done.tail + "\n")
        print(summary_line(done), file=sys.stderr)
    return 0


def summary_line(done: Done) -> str:
    """One line of figures; "—" where a figure has nothing to stand on (τ of an answer
    that ended at its first token: no target pass followed it)."""
    s = done.stats
    decode = f"{s.decode_tokens_per_second:.1f}" if s.decode_tokens_per_second > 0 else "—"
    tau = f"{s.tau:.2f}" if s.target_passes else "—"
    drafted = (
        f"accepted {s.accepted}/{s.drafted} ({100 * s.acceptance_rate:.0f}%)"
        if s.drafted
        else "nothing drafted"
    )
    return (
        # One "tok/s" for both figures: scripts and tests count answers by it.
        f"[{s.tokens} token{'' if s.tokens == 1 else 's'}, decode {decode} / "
        f"end-to-end {s.tokens_per_second:.1f} tok/s, τ {tau}, {drafted}, "
        f"ttft {s.ttft_s:.2f} s, stop: {done.stop_reason}]"
    )


def run_chat(args: argparse.Namespace) -> int:
    settings = check_decoding_args(args)
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
        try:
            utf8_text(line, "that line")
        except EdgespecError as exc:
            print(f"edgespec: error: {exc}", file=sys.stderr)
            continue
        messages.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        done = None
        answer = None
        try:
            request = lm.request(messages, settings, drafter=args.drafter, gamma=args.gamma)
            answer = lm.submit(request)
            for event in answer.events():
                if isinstance(event, Token):
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Done):
                    done = event
        except KeyboardInterrupt:
            if answer is not None:
                answer.stop()
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

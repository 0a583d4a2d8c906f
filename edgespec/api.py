"""The Python API: load a model pair once, generate many times.

    from edgespec import EdgeSpec

    lm = EdgeSpec()                                   # the default pair, pulled if needed
    done = lm.generate("Write a haiku about caches", chat=True, max_tokens=64)
    print(done.text, done.stats.tau)
    for event in lm.stream("def quicksort(xs):", drafter="ngram", gamma=4):
        ...                                           # Token / Step / Done events
    answer = lm.submit(lm.request("Explain caches", chat=True))  # the live answer
    ...                                               # answer.stop() from any thread
    for event in answer.events(): ...
    reading = lm.read_ahead(lm.prompt_prefix_tokens(history, attached))  # while the question is typed
    reading.progress()                                # (tokens read, of all)

Models are resolved like everywhere else (a path, a cached catalog name, the hub, the
package registry); the pair is checked for vocabulary compatibility before anything runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from edgespec.decoding.auto import PairState
from edgespec.decoding.choice import DEFAULT_DRAFTER, DEFAULT_GAMMA, MAX_GAMMA, check_choice, make_policy
from edgespec.decoding.engine import Engine
from edgespec.decoding.events import Done, Event
from edgespec.decoding.generation import Generation
from edgespec.decoding.grammar import GrammarSpec, compile_grammar, json_object_grammar, schema_grammar
from edgespec.decoding.penalties import DEFAULT_LAST_N, Penalties
from edgespec.decoding.policy import Policy
from edgespec.decoding.read_ahead import ReadAhead
from edgespec.decoding.request import GenerationSettings, Request
from edgespec.decoding.runner import Deliver
from edgespec.decoding.sampling import SamplingParams
from edgespec.decoding.slots import Occupancy
from edgespec.decoding.slots import QueueFull as QueueFull  # what a front end's limit raises
from edgespec.errors import EdgespecError, RequestError
from edgespec.models import catalog
from edgespec.models.pairing import choose_draft
from edgespec.models.resolve import resolve
from edgespec.runtime.chat_template import chat_tokens, render
from edgespec.runtime.compat import check_pair, precheck
from edgespec.runtime.messages import check_conversation, normalise_messages
from edgespec.runtime.model import LoadOptions, Model, init_backend
from edgespec.runtime.prompt_cache import CacheOptions, PromptCache
from edgespec.runtime.tokens import common_prefix

DEFAULT = "default"
T = TypeVar("T")


DEFAULT_MAX_GAMMA = MAX_GAMMA
# Where a message being typed ends in its rendering (``prompt_prefix_tokens``): text no
# message holds, whose characters no template changes.
_CUT = "\u2063edgespec-read-ahead-cut\u2063"
# Texts that may follow where the typing stopped, one of each kind the tokenizer splits text
# into (letters, digits, punctuation, spaces, line breaks): the tokens every one of them
# leaves alone are the prompt's, whatever is typed next.
_PROBES = ("a", " a", "A", "1", " 1", ".", ",", " ", "\n", "\n\n", "\u00e9", "\u4e2d")
# Tokens dropped before the last one every probe kept: what a longer text typed next could
# still merge with (a word it continues).
PREFIX_MARGIN = 4


@dataclass(frozen=True)
class RuntimeOptions:
    n_ctx: int = 0  # per answer; 0: what the target was trained for, bounded by memory
    parallel: int = 1  # answers decoding at once, each in its own sequence of n_ctx
    # Every model call on one engine thread: for front ends whose answers are read from
    # several threads (a server, the app); always so with parallel > 1.
    engine_thread: bool = False
    n_gpu_layers: int = -1
    n_gpu_layers_draft: int = -1
    threads: int | None = None
    rollback: str = "auto"
    max_gamma: int = DEFAULT_MAX_GAMMA
    verbose: bool = False
    # Idle conversations' KV states, in memory and optionally on disk (off by default
    # here; ``serve`` and the app turn it on with a budget from free memory).
    cache: CacheOptions = field(default_factory=CacheOptions)
    # The target split over this machine and other machines' workers (``runtime/rpc.py``):
    # their HOST:PORT, and the proportions, this machine's first (empty: by free memory).
    # The draft model stays here: its passes must not pay the network.
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()


class EdgeSpec:
    """A target model, an optional draft model, and the engine that joins them."""

    def __init__(
        self,
        target: str = DEFAULT,
        draft: str | None = DEFAULT,
        options: RuntimeOptions = RuntimeOptions(),
        *,
        quiet: bool = False,
    ):
        if options.max_gamma < 1:
            raise EdgespecError("max gamma must be at least 1")
        if options.parallel < 1:
            raise EdgespecError(f"parallel answers must be at least 1 (got {options.parallel})")
        init_backend(options.verbose)
        target_ref = resolve(catalog.default_name("target") if target == DEFAULT else target, quiet=quiet)
        draft_ref = None
        # Which draft a target named alone got, in one line (empty when a draft was named).
        self.draft_note = ""
        if draft == DEFAULT:
            # A draft of the same vocabulary when one is at hand, else context drafting:
            # never an error. The default target finds the default draft this way.
            choice = choose_draft(target_ref, quiet=quiet)
            draft_ref, self.draft_note = choice.draft, choice.note
            if target != DEFAULT and not quiet:
                print(f"edgespec: {choice.note}", file=sys.stderr, flush=True)
        elif draft:
            draft_ref = resolve(draft, quiet=quiet)
        if draft_ref is not None:
            precheck(target_ref.name, target_ref.path, draft_ref.name, draft_ref.path)
        base = LoadOptions(
            n_ctx=options.n_ctx,
            n_threads=options.threads,
            max_outputs=options.max_gamma + 1,
            rollback=options.rollback,
            n_seq=options.parallel,
        )
        self.options = options
        self.target = Model(
            target_ref.path,
            replace(
                base, n_gpu_layers=options.n_gpu_layers, rpc=options.rpc, tensor_split=options.tensor_split
            ),
            name=target_ref.name,
        )
        if not quiet:
            note_context_cap(self.target, options.n_ctx)
        self.draft: Model | None = None
        if draft_ref is not None:
            self.draft = Model(
                draft_ref.path, replace(base, n_gpu_layers=options.n_gpu_layers_draft), name=draft_ref.name
            )
            check_pair(self.target, self.draft)
        self.engine = Engine(self.target, self.draft, threaded=options.engine_thread or options.parallel > 1)
        self.prompt_cache: PromptCache | None = None
        if options.cache.ram_bytes > 0 or options.cache.directory is not None:
            self.prompt_cache = PromptCache(options.cache)
            self.prompt_cache.attach(*(m for m in (self.target, self.draft) if m is not None))
        # Held, no answer runs on the pair (each other one leases a slot of the engine's).
        self.lock = self.engine.slots.lock
        self._controller: PairState | None = None

    def controller_state(self, *, quiet: bool = False) -> PairState:
        """The adaptive controller's knowledge of this pair (cost model, acceptance
        statistics), created on first use: loaded from the profile on disk, and what it
        lacks measured now (a progress bar unless ``quiet``). Call it after loading to
        keep the measurement out of the first answer."""
        if self._controller is None:
            with self.lock:  # never time anything while a generation runs
                # Measured on the thread the answers' decodes run on (see ``Turns``).
                prepare = partial(
                    PairState.prepare,
                    self.target,
                    self.draft,
                    self.engine.max_gamma + 1,
                    quiet=quiet,
                    notify=lambda note: print(note, file=sys.stderr),
                )
                self._controller = self.engine.turn.run(prepare)
                self.engine.turn.weigh = self._controller.costs.target.estimate
                self.engine.turn.observe_shared = self._controller.learn_shared_decode
        return self._controller

    # -- prompts ------------------------------------------------------------------------

    def prompt_tokens(
        self,
        prompt: str | list[dict[str, Any]],
        *,
        chat: bool = False,
        system: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Token ids for a raw prompt, or for chat messages rendered with the model's
        template (a string with ``chat=True`` becomes one user message). ``tools`` (an
        OpenAI tools list) and template switches (Qwen3's ``enable_thinking``) go to the
        template; messages may carry assistant ``tool_calls`` and ``tool`` results."""
        if isinstance(prompt, str):
            check_prompt_text(prompt)
            if not chat:
                return self.target.tokenize(prompt, add_special=True)
            prompt = [{"role": "user", "content": prompt}]
        messages = normalise_messages(prompt)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        check_conversation(messages)
        return chat_tokens(self.target, messages, tools=tools, **template_kwargs)

    def prompt_prefix_tokens(
        self,
        messages: list[dict[str, Any]],
        partial_user: str,
        *,
        system: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """The first tokens of the prompt ``messages`` will have once a user message that
        begins with ``partial_user`` is added (the files attached to a question not typed
        yet): what ``read_ahead`` reads. They are cut where ``partial_user`` ends, less the
        tokens that what is typed after it could merge with, so the final prompt
        (``prompt_tokens(messages + [user message], chat=True, ...)``, the same ``system``,
        ``tools`` and template switches) starts with them."""
        whole = normalise_messages([*messages, {"role": "user", "content": partial_user + _CUT}])
        if system:
            whole.insert(0, {"role": "system", "content": system})
        check_conversation(whole)
        text = render(self.target, whole, tools=tools, **template_kwargs)
        at = text.find(_CUT)
        if at < 0:
            raise EdgespecError("the chat template does not show the message as typed: nothing to read ahead")
        text = text[:at]
        # As ``chat_tokens`` tokenizes the whole rendering: special tokens parsed, a BOS the
        # template wrote not added twice.
        bos = self.target.token_text(self.target.bos) if self.target.bos >= 0 else ""
        add_bos = self.target.adds_bos and not (bos and text.startswith(bos))
        tokens = self.target.tokenize(text, add_special=add_bos, parse_special=True)
        kept = min(
            common_prefix(tokens, self.target.tokenize(text + probe, add_special=add_bos, parse_special=True))
            for probe in _PROBES
        )
        return tokens[: max(0, kept - PREFIX_MARGIN)]

    # -- generation ---------------------------------------------------------------------

    def _policy(self, drafter: str, gamma: int | str) -> Policy:
        """The policy for a checked request's (drafter, γ): see ``edgespec.decoding.choice``."""
        return make_policy(
            drafter,
            gamma,
            loaded=self.engine.drafters,
            max_gamma=self.engine.max_gamma,
            pair_state=self.controller_state,
        )

    def request(
        self,
        prompt: str | list[dict[str, Any]] | list[int],
        settings: GenerationSettings | None = None,
        *,
        drafter: object = DEFAULT_DRAFTER,
        gamma: object = DEFAULT_GAMMA,
        chat: bool = False,
        system: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        prediction: str | None = None,
        **sampling: Any,
    ) -> Request:
        """One validated request: the one place every front end turns what it was asked
        into what the engine runs. ``prompt`` is text (``chat=True``: one user message),
        chat messages, or token ids; ``sampling`` keywords (temperature, top_k, top_p,
        min_p, seed, max_tokens, stop, lenience, verify, the penalties, logit_bias,
        logprobs, grammar, json_schema, json_object: see ``settings_from``) build the
        settings when none are given. ``prediction`` is the text the answer is expected to
        be (OpenAI's Predicted Outputs): the copy drafters propose from it; the answer
        stays exactly the target's. A refusal is a ``RequestError`` naming the field:
        here what needs the loaded target, in ``GenerationSettings`` the rest."""
        settings = settings or settings_from(**sampling)
        settings.penalties.check_tokens(self.target.n_vocab)
        if prediction:
            settings = replace(
                settings, prediction=tuple(self.target.tokenize(prediction, add_special=False))
            )
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            tokens = list(prompt)
            n_vocab = self.target.n_vocab
            if any(not isinstance(t, int) or not 0 <= t < n_vocab for t in tokens):
                raise RequestError(f"prompt token ids must be in [0, {n_vocab})", "prompt")
        else:
            tokens = self.prompt_tokens(prompt, chat=chat, system=system, tools=tools)
        if len(tokens) >= self.target.n_ctx:  # said before a cost profile is measured
            raise RequestError(
                f"the prompt is {len(tokens)} tokens but the context holds {self.target.n_ctx}; "
                "shorten it or raise --ctx",
                "messages" if chat or _is_messages(prompt) else "prompt",
                "context_length_exceeded",
            )
        drafter, gamma = check_choice(
            drafter, gamma, has_draft=self.draft is not None, max_gamma=self.engine.max_gamma
        )
        return Request(tuple(tokens), settings, drafter, gamma)

    def submit(
        self,
        request: Request,
        *,
        owner: str | None = None,
        deliver: Deliver | None = None,
        limit: int | None = None,
    ) -> Generation:
        """The one way every front end asks for an answer: ``request`` (from ``request``)
        queued for a slot of the pair's loop, as the live answer it returns. Its ``stop()``
        ends it (and no other answer) from any thread, waiting or running; ``owner`` (an
        app tab, a connection) is whose it is, for ``stop_answers``. Its events are read
        with ``answer.events()``, or, given ``deliver``, handed to it from the pair's loop
        in lists, the last ending with ``decoding.runner.END`` or an exception (a front end
        with an event loop of its own: no thread waits). ``answer.ahead``: the answers
        ahead of it; ``limit``: at most that many may wait, else ``QueueFull``.
        Without an engine thread and ``deliver`` the answer is queued, and runs in the
        reader's thread, on the first read of its events."""
        policy = self._policy(request.drafter, request.gamma)
        answer = self.engine.start(request, policy, owner=owner, deliver=deliver)
        if deliver is not None or self.threaded:
            answer.enqueue(limit)
        return answer

    def answers(self, owner: str | None = None) -> list[Generation]:
        """The answers running or waiting for a slot (``owner``'s only, when given)."""
        return self.engine.slots.answers(owner)  # type: ignore[return-value]  # (generations)

    def occupancy(self) -> Occupancy:
        """How many slots the pair has, how many answers hold one and how many wait: what a status
        line and ``/metrics`` show."""
        return self.engine.slots.occupancy()

    def stop_answers(self, owner: str | None = None) -> int:
        """End the answers running or waiting (``owner``'s only: an app tab's Stop ends its
        own answer, never another front end's); how many there were."""
        answers = self.answers(owner)
        for answer in answers:
            answer.stop()
        return len(answers)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no answer holds a slot (within ``timeout`` seconds); whether none does."""
        return self.engine.slots.wait_idle(timeout)

    def end_answers(self, error: BaseException) -> int:
        """End every answer running or waiting with ``error`` handed to its reader, each
        once, and every call waiting on the pair's loop: for a loop that will not come back
        from the pass it is in (a lost worker of a split target). How many answers ended."""
        return self.engine.end_answers(error)

    def call(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)`` on the pair's loop, between two rounds (every model call on the
        pair is made there: an embedding's batches); its exception is raised here."""
        return self.engine.turn.run(call, *args)

    @property
    def threaded(self) -> bool:
        """Whether the pair's loop runs on an engine thread of its own."""
        return self.engine.turn.threaded

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters this pair can have, by name."""
        return self.engine.drafters

    def stream(
        self,
        prompt: str | list[dict[str, Any]] | list[int],
        settings: GenerationSettings | None = None,
        **request: Any,
    ) -> Iterator[Event]:
        """Stream events for one generation: ``request`` keywords as ``request`` takes them."""
        yield from self.submit(self.request(prompt, settings, **request)).events()

    def generate(self, prompt, settings: GenerationSettings | None = None, **kwargs) -> Done:
        done = None
        for event in self.stream(prompt, settings, **kwargs):
            if isinstance(event, Done):
                done = event
        assert done is not None
        return done

    def read_ahead(self, tokens: list[int], owner: str | None = None) -> ReadAhead:
        """Read ``tokens``, the beginning of a prompt still being written
        (``prompt_prefix_tokens``), into the pair's cache below every answer, a batch at a
        time: while an answer runs or waits it reads nothing (the batch in progress stops
        as the answer arrives, and the slot it reads in is taken back), and it goes on once
        the pair is idle. A later answer whose prompt starts with them reads only the
        rest, and answers as it would have without. What the pair holds already counts as
        read at once. With an engine thread this returns at once; without one, the
        reading runs here, to its end. A second read-ahead of the same ``owner`` (None is
        one) stops the first; whatever either read stays as cache."""
        n_vocab = self.target.n_vocab
        tokens = list(tokens)
        if any(not isinstance(t, int) or not 0 <= t < n_vocab for t in tokens):
            raise RequestError(f"token ids must be in [0, {n_vocab})", "tokens")
        if len(tokens) >= self.target.n_ctx:
            raise RequestError(
                f"{len(tokens)} tokens to read ahead, but the context holds {self.target.n_ctx}",
                "tokens",
                "context_length_exceeded",
            )
        reading = self.engine.read_ahead(tokens, owner)
        self.engine.turn.background(reading)
        return reading

    def cached_tokens(self, tokens: list[int]) -> int:
        """How many of ``tokens``' first tokens the pair holds (in a slot or its prompt
        cache): a prompt that starts with them reads only the rest."""
        return self.engine.slots.cached(list(tokens))

    def start_afresh(self) -> None:
        """Empty every sequence of both models and forget the conversations the drafters
        remember (the ``suffix`` index): the state a new process starts in, which a
        benchmark's runs each stand for. (The prompt cache, where one is on, stays.)"""
        with self.lock:
            for model in (m for m in (self.target, self.draft) if m is not None):
                model.empty_all()
            self.engine.shared.suffixes.clear()

    def close(self, timeout: float = 60.0) -> None:
        """End the answers still open on this pair, and free the models once the running
        one has let go of them (within ``timeout`` seconds; else they are left loaded)."""
        self.stop_answers()
        self.engine.stop_reading()
        if self._controller is not None:
            self._controller.check_costs()
        if not self.lock.acquire(timeout=timeout):
            return
        try:
            if self.prompt_cache is not None:
                self.prompt_cache.close()  # keeps what the models hold, where states go to disk
                self.prompt_cache = None
        finally:
            self.lock.release()
        self.engine.turn.close()
        for model in (self.draft, self.target):
            if model is not None:
                model.close()


def settings_from(
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    seed: int | None = None,
    max_tokens: int = 256,
    stop: tuple[str, ...] | list[str] = (),
    lenience: float = 1.0,
    verify: str = "token",
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repeat_penalty: float = 1.0,
    repeat_last_n: int = DEFAULT_LAST_N,
    logit_bias: dict[int, float] | None = None,
    logprobs: int | None = None,
    grammar: str | GrammarSpec | None = None,
    json_schema: dict | None = None,
    json_object: bool = False,
) -> GenerationSettings:
    """Settings from keywords. Penalties follow llama-server (see
    ``edgespec.decoding.penalties``); ``logit_bias`` maps token ids to a bias in
    [-100, 100]; ``logprobs`` asks for each token's log-probability and that many of the
    most likely tokens at its position (0-20; None: none). At most one of ``grammar`` (GBNF
    text), ``json_schema`` (answers are JSON values of that schema) and ``json_object``
    (any JSON object) constrains the answer; JSON is written compact."""
    constraint = constraint_from(grammar, json_schema, json_object)
    return GenerationSettings(
        sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p),
        seed=seed,
        max_tokens=max_tokens,
        stop=tuple(stop),
        lenience=lenience,
        verify=verify,
        penalties=Penalties(
            presence=presence_penalty,
            frequency=frequency_penalty,
            repeat=repeat_penalty,
            last_n=repeat_last_n,
            logit_bias=tuple(sorted((logit_bias or {}).items())),
        ),
        logprobs=logprobs,
        grammar=constraint,
    )


def note_context_cap(target: Model, asked: int) -> None:
    """One line on stderr when the context asked for is beyond what the target was trained
    for. The target is loaded with its trained length at most (past it a model's answers
    come apart), and a user who asked for more must not believe it has more."""
    if target.n_ctx_train > 0 and asked > target.n_ctx_train:
        print(
            f"edgespec: note: a context of {asked:,} tokens is more than {target.name} was trained "
            f"for; using {target.n_ctx:,}",
            file=sys.stderr,
            flush=True,
        )


def check_prompt_text(text: str) -> None:
    """The one rule on a prompt given as text: something besides white space."""
    if not text.strip():
        raise RequestError("the prompt is empty", "prompt")


def _is_messages(prompt: object) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)


def constraint_from(
    grammar: str | GrammarSpec | None,
    json_schema: dict | None,
    json_object: bool,
    *,
    model: Model | None = None,
) -> GrammarSpec | None:
    """The grammar an answer must follow, from the one way it was given (or None): the one
    builder, for every front end. ``model``: the vocabulary GBNF is checked against, which
    token references (``<|im_end|>``) need; the server passes its target."""
    given = {"grammar": grammar, "json_schema": json_schema, "json_object": json_object or None}
    one_constraint([name for name, value in given.items() if value is not None])
    if isinstance(grammar, GrammarSpec):
        return grammar
    if grammar is not None:
        if not isinstance(grammar, str):  # a JSON body may hold anything
            raise RequestError("'grammar' must be a GBNF grammar (a string)", "grammar")
        return compile_grammar(grammar, model=model)
    if json_schema is not None:
        return GrammarSpec(schema_grammar(json_schema))
    if json_object:
        return GrammarSpec(json_object_grammar())
    return None


def one_constraint(given: list[str]) -> None:
    """The one rule on constraints: at most one shapes an answer. ``given`` names the
    fields that were set, in the front end's own words (the server's are its wire's)."""
    if len(given) > 1:
        raise RequestError(f"give one constraint, not {' and '.join(given)}", given[1])

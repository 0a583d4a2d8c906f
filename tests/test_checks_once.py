"""Each check in one place: every front end (the CLI's flags, the server's request body, the
app's controls) refuses a bad γ with the words of the one γ parser
(``decoding.choice.parse_gamma``), a bad lenience with those of the one lenience check
(``decoding.acceptance.check_lenience``), and builds a grammar constraint with the one
builder (``api.constraint_from``). No model is loaded: the front ends' own parsing runs
before any model is needed."""

from __future__ import annotations

import pytest

from edgespec.api import constraint_from, settings_from
from edgespec.cli.generate import check_decoding_args
from edgespec.cli.main import build_parser
from edgespec.decoding import choice
from edgespec.decoding.acceptance import check_lenience
from edgespec.decoding.choice import DEFAULT_DRAFTER, MAX_GAMMA, check_choice, parse_gamma
from edgespec.decoding.generation import LiveControl
from edgespec.errors import EdgespecError, RequestError
from edgespec.server import fields, schemas
from edgespec.server.errors import ApiError
from edgespec.ui import views
from edgespec.ui.handlers import ChatHandlers

BAD_GAMMAS = [MAX_GAMMA + 1, -1, "x"]
BAD_LENIENCES = [0.0, 1.5, -2.0, float("nan")]
# The app's settings panel, in SETTING_NAMES order, good but for what a test sets.
APP_SETTINGS = {
    "drafter": "auto",
    "gamma": "auto",
    "verify": "token",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "seed": "",
    "max_tokens": 16,
    "lenience": 1.0,
}


def refusal(check, *args, **kwargs) -> EdgespecError:
    with pytest.raises(EdgespecError) as caught:
        check(*args, **kwargs)
    assert "\n" not in str(caught.value)  # one line, as every refusal
    return caught.value


def gamma_words(value: object) -> str:
    error = refusal(parse_gamma, value)
    assert isinstance(error, RequestError) and error.param == "gamma"
    return str(error)


def cli_args(*flags: str):
    return build_parser().parse_args(["generate", "--prompt", "hi", *flags])


# -- γ -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", BAD_GAMMAS)
def test_the_cli_refuses_a_bad_gamma_in_the_one_parsers_words(value):
    error = refusal(check_decoding_args, cli_args("--gamma", str(value)))
    assert str(error) == gamma_words(str(value))


@pytest.mark.parametrize("value", [*BAD_GAMMAS, 2.5, True])
def test_the_server_hands_gamma_to_the_builder_and_its_words_back(value):
    """The body's γ reaches the request builder as sent (no parser of the server's own);
    the builder's refusal is the server's 400, its words and field unchanged."""
    sent = schemas._or({"gamma": value}, "gamma")
    assert sent is value
    with pytest.raises(RequestError) as caught:
        check_choice(DEFAULT_DRAFTER, sent, has_draft=False)  # what lm.request runs
    answer = schemas._refusal(caught.value, schemas.CHAT, "max_tokens")
    assert isinstance(answer, ApiError)
    assert answer.status == 400 and answer.param == "gamma"
    assert answer.message == gamma_words(sent)


@pytest.mark.parametrize("value", BAD_GAMMAS)
def test_the_app_refuses_a_typed_gamma_in_the_one_parsers_words(value):
    assert views.parse_gamma is choice.parse_gamma  # what the app's handlers call
    assert str(refusal(views.parse_gamma, str(value))) == gamma_words(value)


def test_the_apps_gamma_choices_are_a_part_of_what_the_parser_allows():
    """The app's control offers short drafts only; each is a γ the one parser takes."""
    parsed = [views.parse_gamma(value) for value in views.GAMMA_CHOICES]
    assert parsed[0] == "auto"
    assert all(isinstance(g, int) and 0 <= g <= MAX_GAMMA for g in parsed[1:])


def test_one_limit_and_one_set_of_words():
    assert (
        gamma_words(MAX_GAMMA + 1)
        == f"gamma {MAX_GAMMA + 1} is more than the {MAX_GAMMA} tokens verified in one pass at most"
    )
    assert gamma_words(-1) == f"gamma must be 'auto' or from 0 to {MAX_GAMMA} (got -1)"
    assert gamma_words("x") == "gamma must be 'auto' or a whole number (got 'x')"
    assert parse_gamma(" auto ") == "auto" and parse_gamma("16") == 16 and parse_gamma(MAX_GAMMA) == MAX_GAMMA


# -- lenience ------------------------------------------------------------------------------


def lenience_words(value: float) -> str:
    error = refusal(check_lenience, value)
    assert isinstance(error, RequestError) and error.param == "lenience"
    return str(error)


@pytest.mark.parametrize("value", BAD_LENIENCES)
def test_the_cli_refuses_a_bad_lenience_in_the_one_checks_words(value):
    assert str(refusal(check_decoding_args, cli_args("--lenience", str(value)))) == lenience_words(value)


@pytest.mark.parametrize("value", BAD_LENIENCES)
def test_the_server_refuses_a_bad_lenience_in_the_one_checks_words(value):
    """The server checks that the body's lenience is a number; what it may be, the
    settings the request builder makes from it."""
    sent = schemas._typed({"lenience": value}, "lenience", schemas._is_number, "a number", 1.0)
    assert str(refusal(settings_from, lenience=sent)) == lenience_words(value)


@pytest.mark.parametrize("value", BAD_LENIENCES)
def test_the_app_refuses_a_bad_lenience_in_the_one_checks_words(value):
    options = ChatHandlers._options(list({**APP_SETTINGS, "lenience": value}.values()))
    assert str(refusal(settings_from, **options)) == lenience_words(value)
    # The slider moved while an answer runs: its live control checks alike.
    assert str(refusal(LiveControl().set_lenience, value)) == lenience_words(value)


# -- grammar constraints -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "keywords"),
    [
        ({"grammar": 'root ::= "yes" | "no"'}, {"grammar": 'root ::= "yes" | "no"'}),
        ({"json_schema": {"type": "integer"}}, {"json_schema": {"type": "integer"}}),
        ({"response_format": {"type": "json_object"}}, {"json_object": True}),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "boolean"}}}},
            {"json_schema": {"type": "boolean"}},
        ),
    ],
)
def test_the_server_builds_a_constraint_with_the_one_builder(body, keywords):
    want = constraint_from(**{"grammar": None, "json_schema": None, "json_object": False, **keywords})
    assert fields.constraint(body, None) == want


def test_a_grammar_that_is_not_text_is_refused_alike():
    words = str(refusal(constraint_from, 42, None, False))
    with pytest.raises(ApiError) as caught:
        fields.constraint({"grammar": 42}, None)
    assert caught.value.message == words and caught.value.param == "grammar"

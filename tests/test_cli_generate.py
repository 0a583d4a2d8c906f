"""`edgespec generate` and `edgespec chat`: the command-line contract, through the real
command and the real default models (bad input is refused before any model loads)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, run_cli
from test_models_cli import one_error_line

from edgespec.cli.generate import summary_line
from edgespec.decoding.choice import MAX_GAMMA
from edgespec.decoding.drafters import CHOICE_HELP, CHOICES
from edgespec.decoding.events import Done, Stats

QUICK = ["--max-tokens", "12", "--ctx", "512"]


@pytest.mark.needs_models
def test_generate_json_contract():
    result = run_cli(
        "generate", "--prompt", "def add(a, b):", "--json", "--drafter", "model", "--gamma", "4", *QUICK
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(record) == {"text", "token_ids", "stop_reason", "stop_sequence", "stats"}
    assert record["text"] and len(record["token_ids"]) == record["stats"]["tokens"] <= 12
    assert record["stop_reason"] in ("max_tokens", "eos")
    stats = record["stats"]
    for key in (
        "target_passes",
        "drafted",
        "accepted",
        "acceptance_rate",
        "tau",
        "tokens_per_second",
        "ttft_s",
    ):
        assert key in stats
    assert set(stats["time_s"]) == {"prefill", "draft", "verify", "other"}
    assert stats["drafted"] > 0


@pytest.mark.needs_models
def test_generate_streams_text_and_reads_stdin_and_files(tmp_path):
    streamed = run_cli("generate", "--chat", "--prompt", "Say hello in French.", *QUICK)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout.strip() and "tok/s" in streamed.stderr
    piped = run_cli("generate", "--drafter", "none", *QUICK, stdin="The capital of France is")
    assert piped.returncode == 0 and piped.stdout.strip()
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("The capital of France is")
    from_file = run_cli("generate", "--drafter", "none", "--prompt-file", str(prompt_file), *QUICK)
    assert from_file.stdout == piped.stdout  # greedy: same prompt, same text
    # The prompt as the command's words, unquoted as a newcomer types it: the same text.
    words = run_cli(
        "generate", "The", "capital", "of", "France", "is", "--drafter", "none", "--gamma", "0", *QUICK
    )
    assert words.returncode == 0, words.stderr
    assert words.stdout == piped.stdout


def test_help_lists_every_drafter_and_the_defaults():
    result = run_cli("generate", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines: compare words
    assert "PROMPT" in text and 'edgespec generate "text"' in text
    assert "who drafts (default: auto)" in text
    for name in CHOICES:
        assert f"{name} {' '.join(CHOICE_HELP[name].split())}" in text, name
    assert f"'auto' (default: the controller picks per step) or 0..{MAX_GAMMA}" in text
    chat = run_cli("chat", "--help")
    assert all(CHOICE_HELP[name].split()[0] in chat.stdout for name in CHOICES)


@pytest.mark.needs_models
def test_chat_session_keeps_context(tmp_path):
    script = "My name is Ada. Reply with one word: OK.\nWhat is my name? Answer with one word.\n\n"
    result = run_cli("chat", "--max-tokens", "16", "--ctx", "1024", stdin=script)
    assert result.returncode == 0, result.stderr
    assert "Ada" in result.stdout.split("you> ")[-1] or "Ada" in result.stdout
    assert result.stderr.count("tok/s") == 2  # one stats line per answer


@pytest.mark.needs_models
def test_chat_one_token_answer_has_no_tau():
    # One token comes from the prefill alone: no target pass follows it, so τ and the
    # decode rate have nothing to stand on.
    args = ["--drafter", "none", "--gamma", "0", "--max-tokens", "1", "--ctx", "512"]
    # A line that is not UTF-8 is named and skipped; the chat goes on.
    result = run_piped("chat", *args, stdin=b"caf\xe9\nSay yes.\n\n")
    assert result.returncode == 0, result.stderr
    assert "that line is not UTF-8 text (byte 0xe9 at character 4)" in result.stderr
    assert "Traceback" not in result.stderr
    line = next(ln for ln in result.stderr.splitlines() if "tok/s" in ln)
    assert line.startswith("[1 token, decode — / end-to-end ")
    assert "τ —" in line and "nothing drafted" in line and "τ 0.00" not in line


def test_summary_line_says_only_what_was_measured():
    one = summary_line(
        Done(text="x", tail="", stats=Stats(tokens=1, wall_s=0.5, ttft_s=0.5), stop_reason="max_tokens")
    )
    assert "τ —" in one and "decode —" in one and "nothing drafted" in one
    stats = Stats(tokens=9, target_passes=4, drafted=8, accepted=6, wall_s=2.0, ttft_s=0.4)
    many = summary_line(Done(text="x", tail="", stats=stats, stop_reason="eos"))
    assert "[9 tokens, decode 5.0 / end-to-end 4.5 tok/s, τ 2.00, accepted 6/8 (75%)" in many


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "   \n"], "the prompt is empty"),
        (["--prompt", "hi", "--gamma", "-1"], f"gamma must be 'auto' or from 0 to {MAX_GAMMA} (got -1)"),
        (["--prompt", "hi", "--gamma", "100"], f"gamma 100 is more than the {MAX_GAMMA} tokens"),
        (["--prompt", "hi", "--gamma", "5000", "--ctx", "256"], f"the {MAX_GAMMA} tokens"),
        (["--prompt", "hi", "--gamma", "40", "--ctx", "32"], "does not fit in a context of 32"),
        (["--prompt", "hi", "--gamma", "many"], "gamma must be 'auto' or a whole number (got 'many')"),
        (["--prompt", "hi", "--drafter", "model", "--draft", "none"], "needs a draft model"),
        (["hi", "--prompt", "there"], "two prompts"),
        (["--prompt", "hi", "--temperature", "-0.5"], "temperature must be >= 0"),
        (["--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["--prompt", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--prompt", "hi", "--lenience", "0"], "lenience must be in (0, 1]"),
        (["--prompt", "hi", "--lenience", "-2"], "lenience must be in (0, 1]"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file not found"),
        (["hi", "--prediction", "/nonexistent/p.txt"], "--prediction: cannot read /nonexistent/p.txt"),
        (["--prompt", "hi", "--max-tokens", "0"], "max tokens must be at least 1"),
        (["--prompt", "hi", "--drafter", "psychic"], "unknown drafter 'psychic'; choose one of auto,"),
        # Bytes that are not UTF-8 reach Python as lone surrogates ("\udce9" is byte 0xe9).
        (["caf\udce9 au lait"], "the prompt is not UTF-8 text (byte 0xe9 at character 4)"),
        (["--system", "\udcff", "hi"], "--system is not UTF-8 text (byte 0xff"),
        (["--stop", "x\udcff", "hi"], "--stop is not UTF-8 text (byte 0xff at character 2)"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragment):
    one_error_line(run_cli("generate", *args), fragment)


def run_piped(*args: str, stdin: bytes) -> subprocess.CompletedProcess[str]:
    """The real command with ``stdin`` as bytes, which ``run_cli``'s text mode cannot send."""
    command = [sys.executable, "-m", "edgespec", *args]
    ran = subprocess.run(command, input=stdin, capture_output=True, cwd=REPO)
    return subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.decode(), ran.stderr.decode())


def test_a_piped_prompt_that_is_not_utf8_is_one_line():
    one_error_line(run_piped("generate", stdin=b"caf\xe9\n"), "the prompt is not UTF-8 text (byte 0xe9")


def test_chat_checks_drafter_and_gamma_alike():
    one_error_line(run_cli("chat", "--gamma", "100", stdin=""), str(MAX_GAMMA))
    one_error_line(run_cli("chat", "--drafter", "psychic", stdin=""), "unknown drafter")


@pytest.mark.needs_models
def test_prompt_longer_than_the_context():
    one_error_line(run_cli("generate", "--ctx", "256", "--prompt", "word " * 400), "context holds")


@pytest.mark.needs_models
def test_context_limit_is_a_stop_reason():
    # llama.cpp grants at least 256 positions; a long prompt fills most of them, read far
    # faster than an answer decodes them.
    prompt = "Continue this count to 500, one number per line: " + " ".join(map(str, range(1, 61)))
    result = run_cli("generate", "--ctx", "128", "--max-tokens", "2000", "--json", "--drafter", "ngram",
                     "--prompt", prompt, "--chat")  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["stop_reason"] == "context_full"


def test_a_prediction_that_is_not_utf8_is_one_line(tmp_path):
    predicted = tmp_path / "predicted.txt"
    predicted.write_bytes(b"caf\xe9\n")
    one_error_line(
        run_cli("generate", "--prompt", "hi", "--prediction", str(predicted)),
        f"--prediction: cannot read {predicted}",
        "utf-8",
    )


@pytest.mark.needs_models
def test_a_prediction_speeds_the_copy_but_never_changes_the_answer(tmp_path):
    """Greedy: with a predicted output the answer is token for token the one without it,
    whether the prediction is right (the copy drafter's proposals are accepted) or wrong."""
    question = "Rewrite with 'cat' for 'dog': The quick brown fox jumps over the lazy dog."
    prompt = ["--chat", "--prompt", question]
    quick = ["--json", "--max-tokens", "24", "--ctx", "512"]

    def answer(*flags: str) -> dict:
        result = run_cli("generate", *prompt, *quick, *flags)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])

    plain = answer("--drafter", "none", "--gamma", "0")
    assert plain["stats"]["prediction_tokens"] == 0 and plain["token_ids"]
    right = tmp_path / "right.txt"
    right.write_text(plain["text"], encoding="utf-8")
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("A slow red hen walks under the busy bridge, then sleeps.", encoding="utf-8")
    runs = {}
    for path in (right, wrong):
        runs[path.name] = answer("--drafter", "copy", "--gamma", "4", "--prediction", str(path))
        predicted = runs[path.name]
        assert (predicted["text"], predicted["token_ids"]) == (plain["text"], plain["token_ids"]), path.name
        assert predicted["stats"]["prediction_tokens"] > 0
    # The right prediction was drafted from and held: most of the answer is made of it.
    assert runs["right.txt"]["stats"]["accepted"] > 0
    assert runs["right.txt"]["stats"]["prediction_accepted"] >= plain["stats"]["tokens"] // 2

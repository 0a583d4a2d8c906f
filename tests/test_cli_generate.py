"""`edgespec generate` and `edgespec chat`: the command-line contract, through the real
command and the real default models."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_models_cli import one_error_line

QUICK = ["--max-tokens", "12", "--ctx", "512"]


def test_generate_json_contract():
    result = run_cli(
        "generate", "--prompt", "def add(a, b):", "--json", "--drafter", "model", "--gamma", "4", *QUICK
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(record) == {"text", "token_ids", "stop_reason", "stats"}
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


def test_chat_session_keeps_context(tmp_path):
    script = "My name is Ada. Reply with one word: OK.\nWhat is my name? Answer with one word.\n\n"
    result = run_cli("chat", "--max-tokens", "16", "--ctx", "1024", stdin=script)
    assert result.returncode == 0, result.stderr
    assert "Ada" in result.stdout.split("you> ")[-1] or "Ada" in result.stdout
    assert result.stderr.count("tok/s") == 2  # one stats line per answer


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "   \n"], "the prompt is empty"),
        (["--prompt", "hi", "--gamma", "-1"], "gamma must be >= 0"),
        (["--prompt", "hi", "--gamma", "5000", "--ctx", "256"], "does not fit"),
        (["--prompt", "hi", "--gamma", "many"], "gamma must be a number"),
        (["--prompt", "hi", "--temperature", "-0.5"], "temperature must be >= 0"),
        (["--prompt", "hi", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["--prompt", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--prompt", "hi", "--lenience", "0"], "lenience must be in (0, 1]"),
        (["--prompt", "hi", "--lenience", "-2"], "lenience must be in (0, 1]"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file not found"),
        (["--prompt", "hi", "--max-tokens", "0"], "max tokens must be at least 1"),
        (["--prompt", "hi", "--drafter", "psychic"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragment):
    one_error_line(run_cli("generate", *args), fragment)


def test_prompt_longer_than_the_context():
    one_error_line(run_cli("generate", "--ctx", "256", "--prompt", "word " * 400), "context holds")


def test_context_limit_is_a_stop_reason():
    result = run_cli("generate", "--ctx", "256", "--max-tokens", "2000", "--json", "--drafter", "ngram",
                     "--prompt", "Count from 1 to 500, one number per line.", "--chat")  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["stop_reason"] == "context_full"

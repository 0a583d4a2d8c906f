"""TextStream on hand-made token pieces: UTF-8 split across tokens, stop strings that
span tokens, and what is released when."""

from __future__ import annotations

from edgespec.decoding.textstream import TextStream

FLAMINGO = "🦩".encode()  # four bytes


def stream(pieces: list[bytes], stops=()) -> tuple[list[str], TextStream]:
    ts = TextStream(lambda i: pieces[i], stops)
    out = []
    for i in range(len(pieces)):
        out.append(ts.push(i))
        if ts.stopped:
            break
    return out, ts


def test_split_character_is_released_whole():
    out, ts = stream([b"a ", FLAMINGO[:2], FLAMINGO[2:3], FLAMINGO[3:], b"!"])
    assert out == ["a ", "", "", "🦩", "!"]
    assert ts.finish() == "" and ts.text == "a 🦩!"


def test_unfinished_character_at_the_end_is_dropped():
    out, ts = stream([b"ok ", FLAMINGO[:3]])
    assert out == ["ok ", ""]
    assert ts.finish() == "" and ts.text == "ok "


def test_stop_string_spanning_tokens_is_held_then_cut():
    out, ts = stream([b"1, 2", b", 1", b"2", b", 13", b", 14"], stops=["12, 13"])
    assert ts.stopped
    assert "".join(out) == "1, 2, " and ts.text == "1, 2, "


def test_held_text_released_when_it_cannot_be_a_stop():
    out, ts = stream([b"ab", b"c", b"d"], stops=["cx"])
    assert out == ["ab", "", "cd"]
    assert not ts.stopped and ts.finish() == ""


def test_held_prefix_released_at_finish():
    out, ts = stream([b"hello <", b"/"], stops=["</end>"])
    assert "".join(out) == "hello "
    assert ts.finish() == "</" and ts.text == "hello </"

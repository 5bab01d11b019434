import json

import numpy as np
import pytest

from tokenseam.vocab import Vocabulary, VocabularyError
from tokenseam.vocab.gguf import read_gguf_metadata

TEXTS = [
    "Hello, world!",
    "안녕하세요.",
    "😊📚😊",
    "def calculate_total(x):\n    return x",
    "中华人民共和国",
    "http://example.com/a?b=1",
    "  leading and trailing  ",
    "\\frac{a}{b}",
]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_every_normal_token_matches_llama_cpp_piece(name, vocabs, tokenizers):
    vocab, tok = vocabs[name], tokenizers[name]
    assert vocab.size == tok.n_vocab
    bad = [
        i
        for i in range(vocab.size)
        if not vocab.is_special[i] and tok.piece(i, False) != vocab.token_bytes[i]
    ]
    assert bad == []


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("text", TEXTS)
def test_detokenize_equals_concatenated_bytes(name, text, vocabs, tokenizers):
    vocab, tok = vocabs[name], tokenizers[name]
    ids = tok.encode(text)
    assert tok.decode(ids) == vocab.decode_bytes(ids) == text.encode()


def test_gemma_byte_fallback_tokens_are_single_bytes(gemma3_vocab):
    idx = [i for i, t in enumerate(gemma3_vocab.token_text) if t.startswith("<0x") and len(t) == 6]
    assert len(idx) == 256
    assert sorted(gemma3_vocab.token_bytes[i] for i in idx) == [bytes([b]) for b in range(256)]


def test_smollm2_single_byte_tokens_cover_utf8(smollm2_vocab):
    # Byte-level BPE keeps a token for every byte that valid UTF-8 text can contain (SmolLM2 dropped a few
    # ASCII control bytes and the bytes that never occur in UTF-8).
    singles = {b[0] for b in smollm2_vocab.token_bytes if len(b) == 1}
    assert set(range(0x80, 0xC0)) <= singles and set(range(0x20, 0x7F)) <= singles
    assert set(range(0xC2, 0xF1)) <= singles


def test_special_tokens_flagged(smollm2_vocab, gemma3_vocab):
    s = smollm2_vocab
    assert s.is_special[s.token_text.index("<|im_end|>")] and 2 in s.eos_token_ids
    g = gemma3_vocab
    assert g.is_special[g.token_text.index("<eos>")] and g.is_special[g.token_text.index("<end_of_turn>")]
    assert g.token_text.index("<end_of_turn>") in g.eos_token_ids
    assert not g.is_special[g.token_bytes.index(b" the")]


def test_trie_prefix_range_matches_scan(smollm2_vocab):
    v = smollm2_vocab
    for prefix in [b"http", b":", b"\xe2", b" the", b"\xff", b"zzzzzz"]:
        got = set(v.trie.tokens_with_prefix(prefix).tolist())
        want = {i for i, b in enumerate(v.token_bytes) if b.startswith(prefix) and not v.is_special[i]}
        assert got == want, prefix
    assert {i for _, i in v.trie.prefixes_of(b"http")} >= {
        v.token_bytes.index(b"h"),
        v.token_bytes.index(b"http"),
    }


def test_mask_words_and_fingerprint(smollm2_vocab, gemma3_vocab):
    assert smollm2_vocab.mask_words == 49152 // 32
    assert gemma3_vocab.mask_words == 262144 // 32
    assert smollm2_vocab.fingerprint != gemma3_vocab.fingerprint


def test_hf_tokenizer_json_bytelevel(tmp_path):
    from tokenseam.vocab.vocabulary import gpt2_unicode_to_byte

    inv = {b: c for c, b in gpt2_unicode_to_byte().items()}
    vocab = {"".join(inv[b] for b in piece): i for i, piece in enumerate([b"a", b" b", b"\n", "é".encode()])}
    data = {
        "model": {"type": "BPE", "vocab": vocab},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 4, "content": "<|end|>", "special": True}],
    }
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(data))
    v = Vocabulary.from_hf_tokenizer_json(p)
    assert v.token_bytes == [b"a", b" b", b"\n", "é".encode(), b"<|end|>"]
    assert v.is_special.tolist() == [False, False, False, False, True]
    assert v.eos_token_ids == {4}


def test_hf_tokenizer_json_sentencepiece(tmp_path):
    data = {
        "model": {"type": "Unigram", "vocab": [["<unk>", 0], ["\u2581hi", -1], ["<0x0A>", -2]]},
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True}],
    }
    p = tmp_path / "tokenizer.json"
    p.write_text(json.dumps(data))
    v = Vocabulary.from_hf_tokenizer_json(p)
    assert v.token_bytes[1:] == [b" hi", b"\n"]


@pytest.mark.parametrize(
    "content", [b"", b"GGUF", b"NOTAGGUF" * 10, b"GGUF\x03\x00\x00\x00" + b"\x00" * 8 + b"\xff" * 8]
)
def test_malformed_gguf_is_a_clear_error(tmp_path, content):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(VocabularyError):
        Vocabulary.from_gguf(p)


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(VocabularyError, match="cannot open"):
        read_gguf_metadata(tmp_path / "nope.gguf")
    with pytest.raises(VocabularyError):
        Vocabulary.from_hf_tokenizer_json(tmp_path / "nope.json")
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(VocabularyError):
        Vocabulary.from_hf_tokenizer_json(tmp_path / "t.json")


def test_empty_vocabulary_rejected():
    with pytest.raises(VocabularyError):
        Vocabulary([], np.zeros(0, dtype=bool), kind="gpt2")


def test_tokenizer_of_a_closed_backend_raises_instead_of_crashing(model_paths):
    from tokenseam.engine import BackendConfig, LlamaCppBackend

    b = LlamaCppBackend(model_paths["smollm2"], BackendConfig(n_ctx=128, n_seq=1, prefix_cache_tokens=0))
    tok = b.tokenizer
    assert tok.encode("hi")
    b.close()
    with pytest.raises(VocabularyError, match="closed"):
        tok.encode("hi")


def test_derived_tables_are_built_once_per_vocabulary_even_from_many_threads(smollm2_vocab):
    import threading

    from tokenseam.vocab import Vocabulary

    calls = []

    def build():
        calls.append(1)
        return object()

    got = []
    threads = [
        threading.Thread(target=lambda: got.append(smollm2_vocab.derived("test.table", build)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(g) for g in got}) == 1
    other = Vocabulary([b"a", b"b"], np.zeros(2, dtype=bool), "gpt2")
    assert other.derived("test.table", build) is not got[0]  # per vocabulary, not per name

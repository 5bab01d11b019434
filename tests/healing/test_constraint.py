"""HealingConstraint and HealedGrammarConstraint: masks equal the brute-force allowed sets, state advances."""

from __future__ import annotations

import numpy as np
import pytest

from tokenseam.constraint import Constraint, allocate_token_bitmask, bitmask_to_bool
from tokenseam.healing import HealedGrammarConstraint, HealingConstraint, HealingError, all_allowed_mask

MODELS = ["smollm2", "gemma3"]
REMOVED = [b":", b" ", b"http", b"\n    ", "共和".encode(), b"\xe5", b"_", b"zzqqxx"]


def _brute(vocab, rem):
    tb, sp = vocab.token_bytes, vocab.is_special
    return np.array(
        [bool(b) and not sp[i] and (b.startswith(rem) or rem.startswith(b)) for i, b in enumerate(tb)]
    )


def _mask(c, vocab):
    out = allocate_token_bitmask(vocab.size)
    c.fill_mask(out)
    return bitmask_to_bool(out, vocab.size)


@pytest.mark.parametrize("model", MODELS)
def test_mask_equals_brute_force(model, vocabs):
    vocab = vocabs[model]
    for rem in REMOVED:
        c = HealingConstraint(vocab, rem)
        assert isinstance(c, Constraint)
        got = _mask(c, vocab)
        want = _brute(vocab, rem)
        assert (got == want).all(), (rem, np.flatnonzero(got != want)[:10])
        assert got.any()  # every byte string is reachable: single-byte tokens exist in both vocabularies


@pytest.mark.parametrize("model", MODELS)
def test_prefix_then_extension(model, vocabs):
    vocab = vocabs[model]
    rem = b"\n    "
    c = HealingConstraint(vocab, rem)
    nl = vocab.trie.tokens_equal(b"\n")[0]
    wrong = vocab.trie.tokens_equal(b"x")[0]
    assert c.accept(wrong) is False and c.remaining == rem  # rejected tokens do not move the state
    assert c.accept(sorted(vocab.eos_token_ids)[0]) is False  # no stopping before the removed bytes
    assert c.accept(nl) and c.is_active() and c.remaining == b"    "
    assert _mask(c, vocab).sum() == _brute(vocab, b"    ").sum()
    ext = max(vocab.trie.tokens_with_prefix(b"    "), key=lambda i: len(vocab.token_bytes[i]))
    assert len(vocab.token_bytes[ext]) > 4
    assert c.accept(int(ext))
    assert not c.is_active() and not c.is_finished()
    assert c.overflow == vocab.token_bytes[ext][4:]
    assert c.output_ids == [nl, int(ext)]


@pytest.mark.parametrize("model", MODELS)
def test_after_healing_everything_is_allowed(model, vocabs):
    vocab = vocabs[model]
    c = HealingConstraint(vocab, b":")
    assert c.accept(vocab.trie.tokens_equal(b":")[0])
    assert not c.is_active() and c.overflow == b""
    got = _mask(c, vocab)
    want = ~vocab.is_special.copy()
    for e in vocab.eos_token_ids:
        want[e] = True
    assert (got == want).all()
    assert (bitmask_to_bool(all_allowed_mask(vocab), vocab.size) == want).all()
    assert c.accept(sorted(vocab.eos_token_ids)[0])


def test_empty_removed_bytes_is_inactive(vocabs):
    c = HealingConstraint(vocabs["smollm2"], b"")
    assert not c.is_active()


@pytest.mark.parametrize("bad", [":", None, 3, [58]])
def test_removed_bytes_must_be_bytes(bad, vocabs):
    with pytest.raises(HealingError, match="removed_bytes must be bytes"):
        HealingConstraint(vocabs["smollm2"], bad)


def test_out_of_range_token_is_rejected(vocabs):
    c = HealingConstraint(vocabs["smollm2"], b":")
    assert c.accept(-1) is False and c.accept(10**9) is False and c.is_active()


# ---------------------------------------------------------------- grammar composition
def test_grammar_sees_only_text_after_removed_bytes(vocabs, fake_matcher):
    vocab = vocabs["smollm2"]
    m = fake_matcher(vocab, r"[a-z]*")  # the completion the user receives must be lowercase letters
    c = HealedGrammarConstraint(vocab, b" ", m)
    assert isinstance(c, Constraint) and c.is_active() and c.healing.is_active()
    got = _mask(c, vocab)
    heal = _brute(vocab, b" ")
    assert not (got & ~heal).any()  # never outside the healing set
    tb = vocab.token_bytes
    allowed = np.flatnonzero(got)
    assert vocab.trie.tokens_equal(b" ")[0] in allowed
    for i in allowed:
        rest = tb[i][1:]
        assert tb[i] == b" " or (rest.isalpha() and rest.islower() and rest.isascii()), tb[i]
    the = vocab.trie.tokens_equal(b" the")[0]
    assert the in allowed
    assert vocab.trie.tokens_equal(b" The")[0] not in allowed
    assert vocab.trie.tokens_equal(b"  ")[0] not in allowed
    assert c.accept(vocab.trie.tokens_equal(b" The")[0]) is False
    assert c.accept(the)
    assert m.accepted == [b"the"]
    assert not c.healing.is_active() and c.is_active()  # healing is over; the grammar still restricts
    # After healing the mask is the matcher's own.
    assert (_mask(c, vocab) == bitmask_to_bool(_fill(m, vocab), vocab.size)).all()


def test_grammar_sees_removed_bytes(vocabs, fake_matcher):
    vocab = vocabs["smollm2"]
    m = fake_matcher(vocab, r" ?[0-9]*")  # the grammar covers the whole generated stream
    c = HealedGrammarConstraint(vocab, b" ", m, grammar_sees_removed=True)
    got = _mask(c, vocab)
    want = _brute(vocab, b" ") & bitmask_to_bool(_fill(m, vocab), vocab.size)
    assert (got == want).all() and got.any()
    space = vocab.trie.tokens_equal(b" ")[0]
    assert c.accept(space) and m.accepted == [b" "] and not c.healing.is_active()
    one = vocab.trie.tokens_equal(b"1")[0]
    assert c.accept(one) and m.accepted == [b" ", b"1"]
    assert c.accept(vocab.trie.tokens_equal(b"x")[0]) is False


def test_grammar_matcher_interface_is_checked(vocabs):
    with pytest.raises(HealingError, match="accept_bytes"):
        HealedGrammarConstraint(vocabs["smollm2"], b" ", object())


def _fill(m, vocab):
    out = allocate_token_bitmask(vocab.size)
    m.fill_next_token_bitmask(out)
    return out


def test_with_the_real_grammar_matcher(vocabs):
    grammar = pytest.importorskip("tokenseam.grammar")
    vocab = vocabs["smollm2"]
    compiled = grammar.GrammarCompiler(vocab).compile_regex("[a-z]+")
    m = grammar.GrammarMatcher(compiled)
    c = HealedGrammarConstraint(vocab, b" ", m)
    got = _mask(c, vocab)
    assert not (got & ~_brute(vocab, b" ")).any()
    the, cap = vocab.trie.tokens_equal(b" the")[0], vocab.trie.tokens_equal(b" The")[0]
    assert got[the] and not got[cap]
    assert c.accept(cap) is False
    assert c.accept(the) and not c.healing.is_active() and c.is_active()
    # The grammar consumed "the" only (the space belonged to the prompt): it now allows more letters or EOS.
    after = _mask(c, vocab)
    assert after[vocab.trie.tokens_equal(b"ory")[0]] and not after[the]
    assert any(after[e] for e in vocab.eos_token_ids)


@pytest.mark.parametrize("model", MODELS)
def test_excess_token_ids_match_a_direct_lookup(model, vocabs):
    from tokenseam.healing import prepare_vocabulary
    from tokenseam.healing.constraint import excess_token_ids

    vocab = vocabs[model]
    prepare_vocabulary(vocab)
    trie, tb = vocab.trie, vocab.token_bytes
    for rem in [b" ", b":", b"\n", b"http", b" t", b"\xe5", b"\x00", b"in", b"zzqqxx"]:
        got = excess_token_ids(vocab, rem)
        lo, hi = trie.prefix_range(rem)
        assert len(got) == hi - lo
        for k, b in enumerate(trie.sorted_bytes[lo:hi]):
            rest = b[len(rem) :]
            if not rest:
                assert got[k] == -2
            elif trie.tokens_equal(rest):
                assert got[k] >= 0 and tb[got[k]] == rest, (rem, b)
            else:
                assert got[k] == -1, (rem, b)


def test_request_constraint_picks_the_stack(vocabs):
    from tokenseam.grammar import GrammarCompiler, GrammarMatcher
    from tokenseam.healing import request_constraint

    vocab = vocabs["smollm2"]
    compiled = GrammarCompiler(vocab).compile_regex("[a-z]+")
    assert request_constraint(vocab) is None
    assert request_constraint(vocab, reasoning_end="</think>") is None  # reasoning only delays a grammar
    healing = request_constraint(vocab, removed=b" ")()
    assert type(healing) is HealingConstraint and healing.remaining == b" "
    plain = request_constraint(vocab, compiled)()
    assert type(plain) is GrammarMatcher and plain.is_active()
    healed = request_constraint(vocab, compiled, b" ")()
    assert type(healed) is HealedGrammarConstraint and healed.is_active() and healed.healing.is_active()
    thinking = request_constraint(vocab, compiled, reasoning_end="</think>")()
    free = _mask(thinking, vocab)
    assert free[vocab.trie.tokens_equal(b" The")[0]]  # free text until the tag
    factory = request_constraint(vocab, compiled)
    assert factory() is not factory()  # one constraint per choice

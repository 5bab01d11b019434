"""The turn memory's bookkeeping: answers per prompt, the byte budget, tenants kept apart."""

from __future__ import annotations

import pytest

from tokenseam.engine.turn_memory import MAX_PER_PROMPT, TurnMemory, make_answer

PIECES = [b"<e>", b"He", b"llo", b" w", b"orld", b"\xec\x95", b"\x88"]  # 5+6: one Korean character
SPECIAL = [True, False, False, False, False, False, False]


def answer(ids, removed=(), lead=b""):
    return make_answer(ids, PIECES, SPECIAL, removed, lead)


def test_an_answer_stops_at_the_end_of_turn_and_matches_whole_ids():
    a = answer([1, 2, 3, 4, 0, 0])
    assert list(a.ids) == [1, 2, 3, 4] and a.data == b"Hello world"
    assert a.matched(b"xxHello world<e>", 2) == 4
    assert a.matched(b"xxHello wor", 2) == 3  # " w" + "orld" is cut: up to " w"
    assert a.matched(b"xxHelp", 2) == 1
    assert a.matched(b"xxBye", 2) == 0
    assert answer([0]) is None and list(answer([1, 0]).ids) == [1]  # the end of turn is left out
    assert answer([1, 2], removed=(9,), lead=b"X") is None  # the ids must start with healing's bytes
    assert answer([1, 2], removed=(9,), lead=b"He").lead == b"He"


def test_a_special_id_inside_an_answer_is_kept_with_no_bytes():
    """The client's text does not show a special id the model generated mid-answer; the ids come back with it
    when the text around it does, and not at the end of a shorter match (it goes with what follows it)."""
    a = answer([1, 0, 2, 3, 4, 0])
    assert list(a.ids) == [1, 0, 2, 3, 4] and a.data == b"Hello world" and list(a.ends) == [2, 2, 5, 7, 11]
    assert a.matched(b"xxHello world", 2) == 5
    assert a.matched(b"xxHe", 2) == 1  # "He" and then the special: the special is left to what follows
    assert a.matched(b"xxHelp", 2) == 1
    assert a.matched(b"xxHello", 2) == 3
    assert answer([0, 1, 2]) is not None and list(answer([0, 1, 2]).ids) == [0, 1, 2]
    assert answer([0, 0]) is None


def test_tenants_and_prompts_key_apart():
    m = TurnMemory(1 << 20)
    k_a, k_b = m.key("a", b"prompt"), m.key("b", b"prompt")
    assert k_a != k_b and m.key("a", b"prompt") == k_a and m.key("", b"prompt") not in (k_a, k_b)
    assert m.key("a", b"x\x00y") != m.key("a\x00x", b"y")
    m.put(k_a, answer([1, 2]))
    assert m.get(k_a) and not m.get(k_b)


def test_answers_per_prompt_are_bounded_and_the_budget_holds():
    m = TurnMemory(1 << 20)
    k = m.key("", b"p")
    for i in range(MAX_PER_PROMPT + 3):
        m.put(k, answer([1, 2, 3][: 1 + i % 3] + [4] * i))
    assert len(m.get(k)) == MAX_PER_PROMPT
    m.put(k, answer([1, 2]))
    m.put(k, answer([1, 2]))  # the same answer twice is kept once
    assert sum(list(a.ids) == [1, 2] for a in m.get(k)) == 1
    small = TurnMemory(2000)
    for i in range(200):
        small.put(small.key("", str(i).encode()), answer([1, 2, 3, 4] * 5))
        assert small.bytes_held <= 2000
    assert small.evictions > 0 and len(small) < 200
    assert small.get(small.key("", b"199")) and not small.get(small.key("", b"0"))
    huge = TurnMemory(100)
    huge.put(huge.key("", b"p"), answer([1, 2, 3, 4] * 50))  # bigger than the whole budget: not kept
    assert len(huge) == 0 and huge.bytes_held == 0
    with pytest.raises(ValueError):
        TurnMemory(-1)

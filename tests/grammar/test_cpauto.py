"""The code point automata the JSON Schema front end builds (complements, counts), against their definitions."""

import random

import numpy as np
import pytest

from tokenseam.grammar import cpauto
from tokenseam.grammar.ir import Chars, Repeat, Seq

accepts = cpauto.accepts


def literal_set(words: list[str]) -> cpauto.CPNFA:
    """A deterministic trie automaton accepting exactly `words` (the reference `not_words` is checked against)."""
    dfa = cpauto.CPNFA()
    dfa.add()
    children: list[dict[int, int]] = [{}]
    for w in words:
        s = 0
        for ch in w:
            c = ord(ch)
            if c not in children[s]:
                t = dfa.add()
                children.append({})
                children[s][c] = t
                dfa.edges[s].append((c, c, t))
            s = children[s][c]
        dfa.finals.add(s)
    for s in range(dfa.size):
        dfa.edges[s].sort()
    return dfa


ALPHABET = 'ab\u00e9"\\\U0001f600\x00'


@pytest.mark.parametrize("seed", range(4))
def test_not_words_is_the_complement_of_the_word_set(seed):
    rnd = random.Random(seed)
    for _ in range(100):
        words = [
            "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 4))) for _ in range(rnd.randint(0, 5))
        ]
        fast = cpauto.not_words(words)
        slow = cpauto.complement(literal_set(words))
        probes = words + [
            "".join(rnd.choice(ALPHABET + "c") for _ in range(rnd.randint(0, 5))) for _ in range(40)
        ]
        for w in probes:
            assert accepts(fast, w) == accepts(slow, w) == (w not in words), (words, w)
        assert not cpauto.is_empty(fast)


@pytest.mark.parametrize("seed", range(3))
def test_not_words_numbers_its_trie_as_the_words_are_inserted(seed):
    # The trie comes from a kernel (cpkernels.word_trie); its states must be the reference trie's, numbered in
    # the same order, so that the byte NFA built from it does not change. Many words sharing prefixes fill the
    # kernel's table past its first probes.
    rnd = random.Random(seed)
    alphabet = ALPHABET + "cdxyz\ud800\udfff"
    words = [
        "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 9))) for _ in range(rnd.randint(1, 300))
    ]
    words += rnd.sample(words, min(5, len(words)))
    a = cpauto.not_words(words)
    ref = literal_set(words)
    assert a.sink == ref.size
    assert a.ends == ref.finals
    assert a.children == [
        {c: t for c, _, t in sorted(ref.edges[s], key=lambda e: e[2])} for s in range(ref.size)
    ]
    assert a.finals == set(range(a.sink + 1)) - ref.finals
    assert a.universal_states == set(range(a.sink + 1))


def test_not_words_refuses_a_trie_past_the_state_cap(monkeypatch):
    from tokenseam.grammar.errors import GrammarError

    monkeypatch.setattr(cpauto, "MAX_NFA_STATES", 50)
    assert cpauto.not_words(["a" * 48]).sink == 49
    with pytest.raises(GrammarError, match="too large"):
        cpauto.not_words(["a" * 49])
    with pytest.raises(GrammarError, match="too large"):
        cpauto.not_words(["x" * 30, "y" * 30])


@pytest.mark.parametrize(
    "words",
    [[], [""], ["a"], ["\x00", "\x00b"], ["ab", "ac", "b"], ["\ud7ff\ue000", "\U0010ffff"], ["\ud800x"]],
)
def test_not_words_rows_come_grouped_as_the_byte_nfa_groups_them(words):
    # The byte NFA lowers an automaton's rows grouped by target (nfa._by_target); not_words hands them over
    # grouped, in the same order, so lowering it skips the grouping.
    from tokenseam.grammar.nfa import _by_target

    a = cpauto.not_words(words)
    assert a.by_target is not None
    for q in range(a.size):
        want = _by_target(a.edges[q], {})
        assert list(a.by_target[q].items()) == list(want.items()), (words, q)
    cpauto.trim(a)
    assert a.by_target is None  # trimming rewrites rows: the grouping is computed afresh


def test_not_words_never_accepts_a_surrogate():
    a = cpauto.not_words(["x"])
    for s in range(a.size):
        for lo, hi, _ in a.edges[s]:
            assert hi < 0xD800 or lo > 0xDFFF


def test_is_empty_after_product():
    digits = cpauto.determinize(cpauto.from_ir(Repeat(Chars(((0x30, 0x39),)), 1, None)))
    letters = cpauto.determinize(cpauto.from_ir(Seq((Chars(((0x61, 0x7A),)),))))
    assert cpauto.is_empty(cpauto.product(digits, letters))
    assert not cpauto.is_empty(cpauto.product(digits, cpauto.not_words(["1", "2"])))


PATTERNS = [
    "a+b*",
    "(ab|ba)*c?",
    "[a-c]{2,4}",
    "\\w+\\.x",
    "[^a]b",
    "é+|ab",
    "(a|b)*abb",
    "[ab]*a[ab]{2}",
    "x?y?z?",
    "[^ @]+@[^ @.]+",
]


@pytest.mark.parametrize("seed", range(3))
def test_determinize_and_product_match_python_re(seed):
    import re

    from tokenseam.grammar.regex import parse_regex

    rnd = random.Random(seed)
    alphabet = "abcxyz.@é \\"
    dfas = {p: cpauto.determinize(cpauto.from_ir(parse_regex(p))) for p in PATTERNS}
    for _ in range(40):
        p, q = rnd.choice(PATTERNS), rnd.choice(PATTERNS)
        both = cpauto.product(dfas[p], dfas[q])
        for _ in range(30):
            w = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6)))
            mp = re.fullmatch(p, w) is not None
            mq = re.fullmatch(q, w) is not None
            assert accepts(dfas[p], w) == mp, (p, w)
            assert accepts(both, w) == (mp and mq), (p, q, w)


@pytest.mark.parametrize(
    "pattern,word",
    [
        ("^abc$", "abc"),
        ("^(ab)c$", "abc"),
        ("^$", ""),
        ("^a+$", None),
        ("^a|b$", None),
        ("abc", None),
        ("^a[bc]$", None),
    ],
)
def test_single_word(pattern, word):
    from tokenseam.grammar.regex import parse_regex

    d = cpauto.determinize(cpauto.from_ir(parse_regex(pattern, search=True, dialect="ecma")))
    assert cpauto.single_word(d) == word
    if word is not None:  # Python's `$` also matches before a final newline: two words
        d = cpauto.determinize(cpauto.from_ir(parse_regex(pattern, search=True, dialect="python")))
        assert cpauto.single_word(d) is None and cpauto.accepts(d, word) and cpauto.accepts(d, word + "\n")


def _universal_oracle(a: cpauto.CPNFA, q: int) -> bool:
    """Every string of safe characters keeps some path from q alive (can still reach a final state): a search
    over the reachable state sets, one representative character per run of code points all edges treat alike."""
    from tokenseam.grammar.ir import SAFE_RANGES

    live = [d is not None for d in cpauto.dist_to_final(a)]
    cuts = {lo for lo, _ in SAFE_RANGES} | {hi + 1 for _, hi in SAFE_RANGES}
    for row in a.edges:
        for lo, hi, _ in row:
            cuts.update((lo, hi + 1))
    reps = [c for c in sorted(cuts) if any(lo <= c <= hi for lo, hi in SAFE_RANGES)]
    start = cpauto._closure(a, {q})
    seen = {start}
    todo = [start]
    while todo:
        s = todo.pop()
        if not any(live[x] for x in s):
            return False
        for c in reps:
            nxt = cpauto._closure(a, {t for x in s for lo, hi, t in a.edges[x] if lo <= c <= hi})
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return True


def _random_node(rnd: random.Random, depth: int = 0):
    from tokenseam.grammar.ir import ANY_RANGES, SAFE_RANGES, Alt, complement, intersect

    if depth > 3 or rnd.random() < 0.3:
        return Chars(
            rnd.choice(
                [
                    ANY_RANGES,
                    SAFE_RANGES,
                    intersect(SAFE_RANGES, complement(((0x61, 0x61),))),
                    ((0x61, 0x61),),
                    ((0x62, 0x63),),
                    ((0x80, 0x10FFFF),),
                    ((0x20, 0x7E),),
                ]
            )
        )
    kind = rnd.randrange(3)
    items = tuple(_random_node(rnd, depth + 1) for _ in range(rnd.randint(1, 3)))
    if kind == 0:
        return Seq(items)
    if kind == 1:
        return Alt(items)
    return Repeat(items[0], rnd.randint(0, 2), rnd.choice([None, 3]))


@pytest.mark.parametrize("seed", range(3))
def test_universal_states_match_their_definition(seed):
    """Exact on deterministic automata; on nondeterministic ones a subset (sound: never a state that could die)."""
    rnd = random.Random(seed)
    for _ in range(40):
        nfa = cpauto.from_ir(_random_node(rnd))
        dfa = cpauto.determinize(nfa)
        got = cpauto.universal(dfa)
        assert got == {q for q in range(dfa.size) if _universal_oracle(dfa, q)}
        for q in cpauto.universal(nfa):
            assert _universal_oracle(nfa, q)
        bounded = cpauto.count(nfa, 0, 3)  # marked empty without the search
        assert bounded.universal_states == set()
        assert not any(_universal_oracle(bounded, q) for q in range(bounded.size))
    words = ["".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 4))) for _ in range(6)]
    a = cpauto.not_words(words)
    assert cpauto.universal(a) == a.universal_states == set(range(a.size))
    assert not cpauto.universal(literal_set(words))


def _safe_reps(a: cpauto.CPNFA) -> list[int]:
    """One safe character per run of code points that every edge of `a` and SAFE_RANGES treat alike."""
    from tokenseam.grammar.ir import SAFE_RANGES

    cuts = {lo for lo, _ in SAFE_RANGES} | {hi + 1 for _, hi in SAFE_RANGES}
    for row in a.edges:
        for lo, hi, _ in row:
            cuts.update((lo, hi + 1))
    return [c for c in sorted(cuts) if any(lo <= c <= hi for lo, hi in SAFE_RANGES)]


def _alive_depth(a: cpauto.CPNFA, q: int, cap: int) -> int:
    """The largest k <= cap such that every string of at most k safe characters keeps some path from q alive
    (-1 if q itself cannot finish): a search over the reachable state sets, level by level."""
    live = [d is not None for d in cpauto.dist_to_final(a)]
    reps = _safe_reps(a)
    level = {cpauto._closure(a, {q})}
    for depth in range(cap + 1):
        if any(not any(live[x] for x in s) for s in level):
            return depth - 1
        level = {
            cpauto._closure(a, {t for x in s for lo, hi, t in a.edges[x] if lo <= c <= hi})
            for s in level
            for c in reps
        }
    return cap


@pytest.mark.parametrize("seed", range(3))
def test_safe_budgets_match_their_definition(seed):
    """A state's safe-text budget (the characters of any safe text it stays alive on, when not any number):
    exact on deterministic automata, a lower bound on nondeterministic ones; `safe_states` gives both sets
    from one analysis, as `universal` and `safe_budgets` give them apart."""
    from tokenseam.grammar.regex import parse_regex

    rnd = random.Random(seed)
    cap = cpauto.SAFE_BUDGET_CAP
    nodes = [_random_node(rnd) for _ in range(30)]
    nodes += [parse_regex(r"^(?:\S+\s+){0,3}\S+$", search=True, where="test", dialect="json-schema")]
    seen_budget = False
    for node in nodes:
        nfa = cpauto.from_ir(node)
        exact = node is nodes[-1]  # the word-count pattern: exact on its NFA too, epsilon closures and all
        for a in (cpauto.determinize(nfa), nfa):
            univ, budgets = cpauto.safe_states(a)
            fresh = cpauto.from_ir(node) if a is nfa else cpauto.determinize(cpauto.from_ir(node))
            assert cpauto.universal(fresh) == univ and cpauto.safe_budgets(fresh) == budgets
            for q in range(a.size):
                depth = _alive_depth(a, q, cap)
                if a is nfa and not exact:  # sound: never more than the state stays alive on
                    assert budgets.get(q, 0) <= max(depth, 0)
                elif q not in univ:
                    assert budgets.get(q, 0) == max(depth, 0)
            seen_budget = seen_budget or bool(budgets)
    assert seen_budget


def _covers_by_definition(ranges) -> bool:
    """Nothing of ir.SAFE_RANGES is left once every range of `ranges` is cut out of it (range by range)."""
    from tokenseam.grammar.ir import SAFE_RANGES

    left = list(SAFE_RANGES)
    for lo, hi in ranges:
        left = [p for a, b in left for p in ((a, min(b, lo - 1)), (max(a, hi + 1), b)) if p[0] <= p[1]]
    return not left


@pytest.mark.parametrize("seed", range(3))
def test_covers_safe_matches_its_definition(seed):
    """ir.covers_safe (one pass over the merged ranges) against the definition, on range sets built around the
    edges of the safe ranges: gaps of one code point, overlaps, unsorted input, the whole range."""
    from tokenseam.grammar.ir import MAX_CP, SAFE_RANGES, covers_safe

    rnd = random.Random(seed)
    edges = sorted({p for a, b in SAFE_RANGES for p in (a - 1, a, a + 1, b - 1, b, b + 1)} | {0, MAX_CP})
    found = {True: 0, False: 0}
    for _ in range(3000):
        if rnd.random() < 0.5:
            # The safe ranges with some left out, split or widened: just covering or just not.
            rs = []
            for a, b in SAFE_RANGES:
                r = rnd.random()
                if r < 0.03:
                    continue
                if r < 0.1 and a < b:
                    m = rnd.randint(a, b - 1)
                    rs += [(a, m), (m + 1 + (rnd.random() < 0.5), b)]
                else:
                    rs.append((max(0, a - rnd.randint(0, 2)), min(MAX_CP, b + rnd.randint(0, 2))))
            rnd.shuffle(rs)
        else:
            rs = []
            for _ in range(rnd.randint(1, 6)):
                a, b = rnd.choice(edges), rnd.choice(edges)
                rs.append((max(0, min(a, b)), min(MAX_CP, max(a, b))))
        expect = _covers_by_definition(rs)
        found[expect] += 1
        assert covers_safe(rs) == expect, rs
        assert covers_safe(tuple(rs)) == expect
    assert found[True] > 100 and found[False] > 100


KERNEL_PATTERNS = PATTERNS + [
    r"^[0-9a-zA-Z_-]{1,255}$",
    r"^[A-Fa-f\d]{24}$",
    r"^(https?:\/\/)?([\da-z\.-]+)\.([a-z\.]{2,6})([\/\w \.-]*)*\/?$",
    r"^\w+@\w+\.com$",
    r"(a|b)*abb(a|b){6}",
    r"[^\d\s]{3,40}x",
]


def _same_automaton(a: cpauto.CPNFA, b: cpauto.CPNFA) -> None:
    assert (a.size, a.start, a.finals) == (b.size, b.start, b.finals)
    assert a.edges == b.edges and a.eps == b.eps


@pytest.mark.parametrize("dialect", ["ecma", "python", "json-schema"])
def test_determinize_kernel_makes_the_reference_automaton(dialect, monkeypatch):
    # The numba subset construction numbers states and orders rows as the Python one does, state for state,
    # on small automata too (the size at which determinize hands over to numba lowered to 0 here).
    from tokenseam.grammar.regex import parse_regex

    monkeypatch.setattr(cpauto, "KERNEL_MIN_STATES", 0)
    rnd = random.Random(dialect)
    nfas = [cpauto.from_ir(parse_regex(p, search=True, dialect=dialect)) for p in KERNEL_PATTERNS]
    for _ in range(20):  # unions and counts of them: epsilon edges, overlapping rows
        a, b = rnd.sample(nfas, 2)
        nfas.append(cpauto.from_ir(Repeat(Seq((Chars(((97, 98),)),)), 0, 3)))
        u = cpauto.CPNFA()
        s = u.add()
        for part in (a, b):
            off = u.size
            for _ in range(part.size):
                u.add()
            u.eps[s].append(off + part.start)
            for q in range(part.size):
                u.edges[off + q] = [(lo, hi, off + t) for lo, hi, t in part.edges[q]]
                u.eps[off + q] = [off + t for t in part.eps[q]]
            u.finals |= {off + f for f in part.finals}
        nfas.append(u)
    from tokenseam.grammar.errors import GrammarError

    def outcome(fn, nfa):
        try:
            return fn(nfa)
        except GrammarError as exc:
            return str(exc)

    refused = 0
    for nfa in nfas:
        fast, ref = outcome(cpauto.determinize, nfa), outcome(cpauto._determinize, nfa)
        if isinstance(ref, str):
            assert fast == ref
            refused += 1
        else:
            _same_automaton(fast, ref)
    assert refused < len(nfas) // 4


def test_determinize_kernel_refusals(monkeypatch):
    from tokenseam.grammar.errors import GrammarError
    from tokenseam.grammar.regex import parse_regex

    monkeypatch.setattr(cpauto, "KERNEL_MIN_STATES", 0)
    nfa = cpauto.from_ir(parse_regex("(a|b)*a(a|b){12}"))  # 2^13 subsets
    with pytest.raises(GrammarError, match="more than 4000 automaton states"):
        cpauto.determinize(nfa)
    # Past the work cap the kernel stops and the Python construction makes the automaton.
    monkeypatch.setattr(cpauto.cpkernels, "WORK_CAP", 50)
    called = []
    ref = cpauto._determinize
    monkeypatch.setattr(cpauto, "_determinize", lambda n, m=4000: called.append(1) or ref(n, m))
    small = cpauto.from_ir(parse_regex("(a|b)*abb"))
    _same_automaton(cpauto.determinize(small), ref(small))
    assert called


def test_determinize_kernel_is_loaded_with_the_types_of_its_calls():
    # warm_up loads the one compiled version every call uses: no request compiles another.
    from tokenseam.grammar import cpkernels
    from tokenseam.grammar.regex import parse_regex

    cpkernels.warm_up()
    cpauto.determinize(cpauto.from_ir(parse_regex(r"[0-9a-z]{1,80}", search=True)))
    assert len(cpkernels.determinize_kernel.signatures) == 1


def test_word_rows_kernels_are_loaded_with_the_types_of_their_calls():
    from tokenseam.grammar import cpkernels
    from tokenseam.grammar.json_schema import schema_to_grammar
    from tokenseam.grammar.nfa import build_nfa

    cpkernels.warm_up()
    nfa = build_nfa(schema_to_grammar({"properties": {"kind": {}, "spec": {}}}, property_order="any"))
    assert nfa.e_chunks
    assert len(cpkernels.word_rows.signatures) == 1
    assert len(cpkernels.place_word_rows.signatures) == 1


def _frozen(nfa) -> tuple:
    """An NFA's states, rows (each state's edges in the order added) and universal states."""
    nfa.freeze_rows()
    rows = (nfa.edges.off, nfa.edges.data, nfa.eps.off, nfa.eps.data)
    return (nfa.n, *(a.tolist() for a in rows), sorted(nfa.universal))


@pytest.mark.parametrize("seed", range(8))
def test_word_rows_kernel_writes_the_rows_of_the_loop(seed):
    # cpkernels.word_rows lowers a trie of keys written as themselves; embed_words' loop is the reference. Same
    # states, same rows in the same order, same budget charged; with the lists a library recording reads too.
    # Odd seeds add characters the kernel leaves to the loop (escaped, multi-byte).
    from tokenseam.grammar import cpkernels
    from tokenseam.grammar.budget import compile_budget
    from tokenseam.grammar.ir import EMPTY, Grammar
    from tokenseam.grammar.nfa import _Builder

    rng = random.Random(seed)
    plain, other = "abyzAZ09 !#[]^_`{|}~-\x7e", 'é"\\\x01\x7f\U0001f600'
    words = ["".join(rng.choices(plain, k=rng.randint(0, 12))) for _ in range(rng.randint(0, 40))]
    words += rng.sample(words, min(3, len(words)))  # repeated words
    words += [w[:2] for w in words[:3]]  # prefixes of others
    if seed % 2:
        words.append("k" + rng.choice(other))
    used = []
    for kernel, recording in ((False, False), (True, False), (True, True)):
        with compile_budget(None, None, None) as budget:
            trie = cpauto.not_words(words)
            before = budget.size_used
            b = _Builder(Grammar({"root": EMPTY}, "root"))
            if recording:
                b.rule_log = []
            end = b.embed_words(trie, b.nfa.add(), True, None, kernel=kernel)
            assert bool(b.nfa.e_chunks) == (kernel and not recording and seed % 2 == 0)
            used.append((budget.size_used - before, end, _frozen(b.nfa)))
    assert used[0] == used[1] == used[2]
    rows, _, units = cpkernels.word_rows(
        np.array(trie.parent, np.int32), np.array(trie.code, np.int32), np.zeros(trie.sink, np.uint8)
    )
    assert (units < 0) == (seed % 2 == 1)


@pytest.mark.parametrize("order", ["schema", "any"])
def test_words_complement_embeds_from_its_trie_as_from_its_rows(order, monkeypatch):
    # "Any key but the declared ones" is lowered from its trie (embed_words) without making its code point
    # rows; the byte NFA is the one the rows give, state for state. Names with escaped and multi-byte
    # characters, shared prefixes, a name that is a prefix of another, and objects nested.
    from tokenseam.grammar import nfa as nfamod
    from tokenseam.grammar.json_schema import schema_to_grammar

    inner = {"type": "object", "properties": {"a": {"type": "null"}, "ab": {"type": "null"}}}
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "api": inner,
            'q"\\\x01': {"type": "boolean"},
            "é日本\U0001f600": {"type": "integer"},
            "": {"type": "null"},
        },
        "required": ["api"],
    }

    def build():
        return _frozen(nfamod.build_nfa(schema_to_grammar(schema, property_order=order)))

    words = nfamod._Builder.embed_words
    tries = []
    monkeypatch.setattr(
        nfamod._Builder, "embed_words", lambda self, a, *rest: tries.append(a) or words(self, a, *rest)
    )
    from_trie = build()
    assert len(tries) >= 2
    real = nfamod._Builder.embed
    calls = []

    def from_rows(self, a, s, esc, end):
        if type(a) is cpauto.WordsComplement:
            calls.append(a.edges)  # the rows made: embed lowers them
        return real(self, a, s, esc, end)

    monkeypatch.setattr(nfamod._Builder, "embed", from_rows)
    assert build() == from_trie
    assert len(calls) >= 2


def test_complement_of_a_counted_class_and_of_a_complement():
    # complement reuses one row's gaps for every state reading the same ranges (a counted class has 255 such
    # states): the language is still exactly the strings the automaton refuses.
    from tokenseam.grammar.regex import parse_regex

    dfa = cpauto.determinize(cpauto.from_ir(parse_regex("^[0-9a-z_-]{1,255}$", search=True)))
    comp = cpauto.complement(dfa)
    for w in ["", "a", "a" * 255, "a" * 256, "ab-9", "aB", "a b", "\U0001f600", "é" * 3, "_" * 254 + "A"]:
        assert accepts(comp, w) != accepts(dfa, w), w
    again = cpauto.complement(comp)
    for w in ["", "x", "x" * 255, "x" * 256, "x\n"]:
        assert accepts(again, w) == accepts(dfa, w), w


@pytest.mark.parametrize("words", [[], ["a"]])
def test_product_with_every_string_is_the_other_automaton(words):
    # "Any key but these" with no words is every string: the product is the other operand, not a copy.
    from tokenseam.grammar.regex import parse_regex

    dfa = cpauto.determinize(cpauto.from_ir(parse_regex("^x[0-9]{1,3}$", search=True)))
    everything = cpauto.not_words(words)
    for both in (cpauto.product(everything, dfa), cpauto.product(dfa, everything)):
        assert (both is dfa) == (not words)
        for w in ["", "a", "x", "x1", "x123", "x1234", "xa"]:
            assert accepts(both, w) == (accepts(dfa, w) and w not in words), w
    if not words:
        assert cpauto.product(everything, everything) is everything


def test_determinize_kernel_on_rows_whose_target_sets_recur(monkeypatch):
    # The kernel takes an interval's state from the interval before it when their target sets are the same;
    # sets of the same size with other members, sets that grow and shrink, and one target split by gaps must
    # still come out as the reference makes them.
    monkeypatch.setattr(cpauto, "KERNEL_MIN_STATES", 0)
    nfa = cpauto.CPNFA()
    for _ in range(6):
        nfa.add()
    nfa.edges[0] = [(97, 97, 1), (98, 98, 2), (99, 99, 1), (100, 102, 1), (101, 101, 3), (104, 104, 1)]
    nfa.edges[0] += [(105, 106, 2), (106, 107, 3), (108, 108, 2), (110, 0x10FFFF, 4)]
    nfa.edges[1] = [(120, 120, 5)]
    nfa.edges[2] = [(121, 121, 5)]
    nfa.edges[3] = [(120, 121, 5)]
    nfa.edges[4] = [(48, 57, 4), (65, 70, 4), (97, 102, 4), (122, 122, 5)]
    nfa.eps[2] = [4]
    nfa.finals = {5}
    nfa.start = 0
    _same_automaton(cpauto.determinize(nfa), cpauto._determinize(nfa))


def test_few_states_with_many_edges_go_to_the_kernel(monkeypatch):
    # `\w` in Python's reading: a handful of states with hundreds of ranges each is determinized in numba.
    from tokenseam.grammar import cpkernels
    from tokenseam.grammar.regex import parse_regex

    calls = []
    kernel = cpkernels.determinize_kernel
    monkeypatch.setattr(cpkernels, "determinize_kernel", lambda *a: calls.append(1) or kernel(*a))
    wide = cpauto.from_ir(parse_regex(r"^\w+$", search=True, dialect="python"))
    narrow = cpauto.from_ir(parse_regex(r"^[a-z]+$", search=True, dialect="python"))
    assert wide.size < cpauto.KERNEL_MIN_STATES and narrow.size < cpauto.KERNEL_MIN_STATES
    _same_automaton(cpauto.determinize(wide), cpauto._determinize(wide))
    assert calls == [1]
    cpauto.determinize(narrow)
    assert calls == [1]


def test_shared_ascii_characters_lower_as_the_general_path_lowers_them(monkeypatch):
    # The byte NFA writes a shared node of a printable ASCII character as one edge at once (ir.PLAIN_BYTE);
    # without that table the general path lowers it. Same states and rows either way, inside a JSON string
    # (quote and backslash escaped there) and outside, with the last character ending in the caller's state.
    from tokenseam.grammar import nfa as nfa_mod
    from tokenseam.grammar.ir import Escaped, Grammar, alt, lit, seq
    from tokenseam.grammar.nfa import build_nfa

    text = 'a"\\b~ 9'
    g = Grammar({"root": alt(seq(lit(text), Escaped(lit(text)), lit("é")), Escaped(lit('x"')))}, "root")
    fast = _frozen(build_nfa(g))
    monkeypatch.setattr(nfa_mod, "PLAIN_BYTE", {})
    monkeypatch.setattr(nfa_mod, "PLAIN_BYTE_IN_STRING", {})
    assert _frozen(build_nfa(g)) == fast


def test_layout_rows_kernel_writes_the_rows_of_the_reference():
    # The inner rows of each whitespace run (nfa._Builder.layout) are written at the freeze by a kernel from
    # (a, e, indent) triples; nfa.layout_rows_into is the reference it must match, row for row.
    from tokenseam.grammar import cpkernels
    from tokenseam.grammar.nfa import layout_rows_into

    rng = random.Random(3)
    triples = [(rng.randrange(0, 10_000), rng.randrange(0, 10_000), rng.random() < 0.5) for _ in range(200)]
    edges, eps = cpkernels.layout_rows(np.array([x for t in triples for x in t], np.int32))
    want_edges: list[int] = []
    want_eps: list[int] = []
    for a, e, indent in triples:
        layout_rows_into(want_edges, want_eps, a, e, indent)
    assert edges.tolist() == want_edges and eps.tolist() == want_eps
    empty = cpkernels.layout_rows(np.zeros(0, np.int32))
    assert empty[0].size == 0 and empty[1].size == 0


@pytest.mark.parametrize("chunk", [True, False])
def test_fresh_target_template_makes_what_escapes_and_high_state_make(chunk):
    # A not_words sink's escapes and multi-byte forms are copied from a template (CodePointEdges.into_fresh):
    # the same states, rows and shared entries as escapes() then high_state() into a target nothing leads
    # into yet, after other states exist; the edges as an array chunk or on the list.
    from tokenseam.grammar.nfa import _SINK_SETS, ByteNFA
    from tokenseam.grammar.utf8 import CodePointEdges

    def made(use_template):
        nfa = ByteNFA()
        cpe = CodePointEdges(nfa)
        nfa.add_many(40)
        cpe.lower(((0x41, 0x5A), (0x2028, 0x2029)), 3, 7, True)  # other shared states, other targets
        target = nfa.add()
        if use_template:
            cpe.listed = not chunk
            got = cpe.into_fresh(*_SINK_SETS, target)
        else:
            got = cpe.escapes(_SINK_SETS[0], target), cpe.high_state(_SINK_SETS[1], target)
        again = cpe.escapes(_SINK_SETS[0], target), cpe.high_state(_SINK_SETS[1], target)
        cpe.lower(((0x100, 0x10FFFF),), 1, target, True)  # (reuses the target's tail states)
        assert again == got
        nfa.freeze_rows()
        return got, nfa.n, _frozen(nfa), sorted(cpe.tails.items())

    assert made(True) == made(False)


@pytest.mark.parametrize("listed", [False, True])
@pytest.mark.parametrize("kept", [True, False])
def test_high_state_into_a_fresh_target_copies_what_it_would_write(monkeypatch, kept, listed):
    # The multi-byte forms into a target no shared tail state leads into yet are copied from a template; into
    # a target that has them, written edge by edge; with no template kept (FRESH_KEPT reached), edge by edge
    # too. The same states, rows and shared entries as writing every one, in each case: with the copies'
    # edges written at the freeze, all copies of a template at once, or on the lists (`listed`, as while a
    # library body is recorded).
    from tokenseam.grammar import utf8
    from tokenseam.grammar.nfa import _SINK_SETS, ByteNFA
    from tokenseam.grammar.utf8 import CodePointEdges

    sets = [
        ((0x80, 0x7FF),),
        ((0x100, 0xD7FF), (0xE000, 0x10FFFF)),
        ((0x10000, 0x10FFFF),),
        ((0x3B1, 0x3C9),),
    ]

    def made(reference):
        nfa = ByteNFA()
        cpe = CodePointEdges(nfa)
        cpe.listed = listed
        nfa.add_many(5)
        targets = [nfa.add() for _ in range(3)]
        got = []
        for k, high in enumerate(sets * 2):
            e = targets[k % 3]
            if reference:
                got.append(cpe.high_cache.get((high, e)) or cpe._lower_high(high, e))
            else:
                got.append(cpe.high_state(high, e))
        sink = nfa.add()
        if reference:
            got.append((cpe.escapes(_SINK_SETS[0], sink), cpe._lower_high(_SINK_SETS[1], sink)))
        else:
            got.append(cpe.into_fresh(*_SINK_SETS, sink))
        nfa.freeze_rows()
        return got, _frozen(nfa), sorted(cpe.tails.items()), sorted(cpe.high_cache.items())

    monkeypatch.setattr(utf8, "_FRESH", {})
    if not kept:
        monkeypatch.setattr(utf8, "FRESH_KEPT", 0)
    assert made(False) == made(True)
    assert bool(utf8._FRESH) == kept
    if kept and not listed:  # (the copies went through the freeze's batch: nothing of them on the lists)
        nfa = ByteNFA()
        cpe = CodePointEdges(nfa)
        cpe.high_state(sets[0], nfa.add())
        cpe.high_state(sets[0], nfa.add())
        assert not nfa.e and [len(f) for _, _, f, _ in nfa.fresh.values()] == [2]

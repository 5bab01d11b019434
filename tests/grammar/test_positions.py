"""Masks of stack-independent positions (local state + parent stack, escaping tokens resolved per parent)
checked token by token against a plain simulation of the pushdown NFA with full stacks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tokenseam.grammar import GrammarMatcher


def _oracle_start(auto):
    configs, acc, esc = auto.closure(auto.nfa.rule_start[0], 0)
    assert not esc
    return set(configs), acc


def _oracle_step(auto, configs, data: bytes):
    acc = False
    for b in data:
        nxt: set = set()
        acc = False
        for q, st in configs:
            for t in {t for lo, hi, t in auto.nfa.edges[q] if lo <= b <= hi}:
                cs, a, esc = auto.closure(t, st)
                assert not esc  # real stacks never reach the local bottom
                nxt.update(cs)
                acc = acc or a
        configs = nxt
        if not configs and not acc:
            return set(), False
    return configs, acc


def _indent_ok(data: bytes, limit: int | None) -> bool:
    """Every run of spaces/tabs after a raw newline is within the grammar's indentation limit."""
    return limit is None or all(len(x) - len(x.lstrip(b" \t")) <= limit for x in data.split(b"\n")[1:])


def _sample(vocab, seed: int) -> list[int]:
    """Tokens around structure (quotes, brackets, commas, colons, whitespace) plus a random spread."""
    rng = np.random.default_rng(seed)
    tb = vocab.token_bytes
    structural = [
        i
        for i in range(vocab.size)
        if not vocab.is_special[i] and tb[i] and any(ch in tb[i] for ch in b'"{}[],: \n')
    ]
    rest = [i for i in range(vocab.size) if not vocab.is_special[i] and tb[i]]
    pick = rng.choice(structural, size=min(1500, len(structural)), replace=False).tolist()
    pick += rng.choice(rest, size=500, replace=False).tolist()
    return sorted(set(pick))


def _check(compiled, vocab, text: str, cuts: list[int], seed: int = 0, sample=None) -> None:
    m = GrammarMatcher(compiled)
    auto = m._auto
    data = text.encode("utf-8")
    tokens = (sample or _sample)(vocab, seed)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    configs, acc = _oracle_start(auto)
    done = 0
    for cut in cuts:
        assert m.accept_bytes(data[done:cut])
        configs, acc = _oracle_step(auto, configs, data[done:cut])
        assert configs or acc
        done = cut
        assert m.is_accepting() == acc, (text[:cut], acc)
        m.fill_next_token_bitmask(out)
        bits = out.view(np.uint32)
        for tid in tokens:
            got = bool((bits[tid >> 5] >> (tid & 31)) & 1)
            c2, a2 = _oracle_step(auto, configs, vocab.token_bytes[tid])
            want = (bool(c2) or a2) and _indent_ok(data[:cut] + vocab.token_bytes[tid], auto.indent_limit)
            assert got == want, (text[:cut], vocab.token_bytes[tid], got, want)


DOC = '{"a": [1, {"b": "x\\"y", "c": [[], {}]}, "s"], "d": {"e": {"f": null}}, "g": -1.5e3}'


def _cuts(text: str) -> list[int]:
    """Positions right after each structural byte and inside strings and numbers."""
    data = text.encode()
    return sorted({k + 1 for k, ch in enumerate(data) if ch in b'{[,:"' or k % 7 == 0})


@pytest.mark.parametrize(
    "schema,doc",
    [
        ({}, DOC),  # any JSON: a recursive rule, tokens escaping through called frames
        (
            {
                "type": "object",
                "additionalProperties": {"$ref": "#"},
                "properties": {"a": {"type": "array", "maxItems": 20, "items": {}}, "g": {"type": "number"}},
            },
            '{"a": [1, {"b": "x"}, [[2]], "s"], "g": -1.5e3, "d": {"e": {"f": {}}, "h": {}}}',
        ),
        # Indented layout: positions inside indentation runs, filtered by the run length so far.
        ({}, json.dumps(json.loads(DOC), indent=2)),
    ],
)
def test_positions_match_full_stack_simulation(compiler, smollm2_vocab, schema, doc):
    _check(compiler.compile_json_schema(schema), smollm2_vocab, doc, _cuts(doc))


def test_bounded_strings_in_bounded_arrays(compiler, smollm2_vocab):
    schema = {
        "type": "array",
        "maxItems": 15,
        "items": {
            "type": "object",
            "properties": {"k": {"type": "string", "maxLength": 14}},
            "required": ["k"],
            "additionalProperties": False,
        },
    }
    doc = json.dumps([{"k": "abcdefghijklmn"[: (3 * i) % 15]} for i in range(14)])
    cuts = _cuts(doc)[::3]
    _check(compiler.compile_json_schema(schema), smollm2_vocab, doc, cuts, seed=1)


def test_recursive_gbnf(compiler, smollm2_vocab):
    g = compiler.compile_gbnf(
        'root ::= list\nlist ::= "(" (item (" " item)*)? ")"\nitem ::= list | [a-z]+ | "\\"" [^"]* "\\""\n'
    )
    text = '((ab (c "x y") ()) ("q" (((z)))))'
    _check(g, smollm2_vocab, text, list(range(1, len(text))), seed=2)


def _sample_with_text(vocab, seed: int) -> list[int]:
    """The structural sample plus tokens of whole non-ASCII characters and tokens mixing them with quotes."""
    tb = vocab.token_bytes
    rng = np.random.default_rng(seed)
    multi = [i for i in range(vocab.size) if not vocab.is_special[i] and tb[i] and max(tb[i]) >= 0x80]
    return sorted(
        set(_sample(vocab, seed)) | set(rng.choice(multi, size=min(1500, len(multi)), replace=False).tolist())
    )


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
def test_string_bodies_taken_whole_match_simulation(vocabs, vocab_name):
    """String bodies are walked with the safe-sink shortcut (a token of whole safe characters is taken as soon
    as the walk reaches such a state); masks still match the full-stack simulation, multi-byte text included."""
    from tokenseam.grammar import GrammarCompiler
    from tokenseam.grammar.localbuild import SAFE_SINK

    vocab = vocabs[vocab_name]
    compiler = GrammarCompiler(vocab)
    schema = {"type": "object", "properties": {"t": {"type": "string"}, "n": {"type": "integer"}}}
    doc = json.dumps({"t": 'héllo 日本語 😀 "q" \\ end', "n": 3, "zé": "ü"}, ensure_ascii=False)
    g = compiler.compile_json_schema(schema)
    _check(g, vocab, doc, _cuts(doc), seed=3, sample=_sample_with_text)
    auto = g.automaton
    assert (auto.flags[: auto.num_states] & SAFE_SINK).any()
    # A loop over ASCII and Latin-1 only is no sink: wider characters must still be refused.
    latin = compiler.compile_gbnf('root ::= "\\"" [^"\\\\\\x00-\\x1f\\u0100-\\U0010FFFF]* "\\""')
    _check(latin, vocab, '"abc é"', [1, 3, 5], seed=4, sample=_sample_with_text)
    m = GrammarMatcher(latin)
    assert m.accept_bytes(b'"ab') and not m.accept_bytes("日".encode())
    assert not (latin.automaton.flags[: latin.automaton.num_states] & SAFE_SINK).any()


def test_safe_from_marks_whole_safe_characters():
    from tokenseam.grammar.tables import _safe_from

    toks = [
        b"abc",
        b'a"bc',
        b"x\\y",
        "é日😀".encode(),
        b"ab\xe6\x97",
        b"\xa5ab",
        b"a\nb",
        b"\xed\xa0\x80z",
        b"",
        b"\x7f",
        "a\u0085b".encode(),  # the four code points the dialects disagree on are not safe (ir.SAFE_RANGES)
        "\u2028xy".encode(),
        "x\u2029".encode(),
        "\ufeffé".encode(),
        "\u2027\u202a\ufefe\uff00".encode(),  # their neighbours are
    ]
    data = np.frombuffer(b"".join(toks), dtype=np.uint8)
    offs = np.cumsum([0] + [len(t) for t in toks]).astype(np.int64)
    got = _safe_from(data, offs).tolist()
    assert got == [0, 2, 2, 0, 4, 1, 2, 3, 0, 1, 3, 3, 4, 3, 0]
    # The table and the grammar side (ir.SAFE_RANGES) leave out the same code points.
    from tokenseam.grammar.ir import SAFE_RANGES, UNSAFE_CODE_POINTS

    for cp in UNSAFE_CODE_POINTS:
        one = np.frombuffer(chr(cp).encode(), dtype=np.uint8)
        assert _safe_from(one, np.array([0, len(one)], dtype=np.int64)).tolist() == [len(one)]
        assert not any(lo <= cp <= hi for lo, hi in SAFE_RANGES)


def test_indent_runs_match_their_definition(smollm2_vocab):
    from tokenseam.grammar.compiler import token_table

    table = token_table(smollm2_vocab)
    table.indent_filters(40)
    lead, inner, longest = table._indent_runs
    wants = []
    for t, b in enumerate(smollm2_vocab.token_bytes):
        if smollm2_vocab.is_special[t]:
            continue
        assert lead[t] == len(b) - len(b.lstrip(b" \t")), b
        want = max((len(x) - len(x.lstrip(b" \t")) for x in b.split(b"\n")[1:]), default=0)
        assert inner[t] == want, b
        wants.append(want)
    assert longest == max(wants) > 0


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
def test_long_counted_strings_match_simulation(vocabs, vocab_name):
    """Mask walks read counters clamped far from their bounds (a long maxLength string body then loops on
    itself); masks near and far from both bounds still match the simulation with exact counters."""
    from tokenseam.grammar import GrammarCompiler

    vocab = vocabs[vocab_name]
    g = GrammarCompiler(vocab).compile_json_schema(
        {
            "type": "object",
            "properties": {"s": {"type": "string", "minLength": 150, "maxLength": 300}},
            "required": ["s"],
            "additionalProperties": False,
        }
    )
    body = ("abc dé 日本 " * 40)[:299]
    doc = json.dumps({"s": body}, ensure_ascii=False)
    data = doc.encode()
    start = data.index(b'"s": "') + 6
    chars = [start + len(body[:k].encode()) for k in (0, 1, 60, 140, 149, 150, 151, 200, 280, 290, 298, 299)]
    _check(g, vocab, doc, chars + [len(data) - 1, len(data)], seed=5, sample=_sample_with_text)


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
def test_universal_states_take_safe_tokens_whole(vocabs, vocab_name):
    """From a state where any string-safe text stays alive (extra keys, `.*`-like patterns, free strings; up to
    the characters left in a maxLength string) the mask takes every string-safe token that fits without
    walking it: masks equal the full walk's over the whole vocabulary, and the full-stack simulation on a
    sample."""
    from tokenseam.grammar import GrammarCompiler

    vocab = vocabs[vocab_name]
    schema = {
        "type": "object",
        "properties": {
            "format": {"type": "string", "pattern": "^zip|tar$"},
            "name": {"type": "string"},
            "short": {"type": "string", "maxLength": 40},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+-.*$"}},
        },
        "required": ["format"],
    }
    doc = json.dumps(
        {
            "format": "a tar",
            "name": 'é "x" 日本',
            "short": "a few words, then é 日本 and more words",
            "tags": ["ab-cd", "x-"],
            "extra key": 1,
        },
        ensure_ascii=False,
    )
    fast = GrammarCompiler(vocab).compile_json_schema(schema)
    slow = GrammarCompiler(vocab, python_builder=True).compile_json_schema(schema)
    assert fast.automaton.nfa.universal
    slow.automaton.nfa.universal = set()
    slow.automaton.nfa.counted_body = {}
    _check(fast, vocab, doc, _cuts(doc), seed=6, sample=_sample_with_text)
    data = doc.encode()
    ma, mb = GrammarMatcher(fast), GrammarMatcher(slow)
    oa = np.zeros(vocab.mask_words, dtype=np.int32)
    ob = oa.copy()
    done = 0
    for cut in list(range(1, len(data) + 1)):
        assert ma.accept_bytes(data[done:cut]) and mb.accept_bytes(data[done:cut])
        done = cut
        ma.fill_next_token_bitmask(oa)
        mb.fill_next_token_bitmask(ob)
        assert np.array_equal(oa, ob), data[:cut]
    # The shortcut was taken: some masks were made from states with a universal configuration.
    auto = fast.automaton
    assert any(q in auto.nfa.universal for kc in fast.masks._local_info for q, _ in auto._configs(kc))
    budgets = {int(auto.budget[kc]) for kc in fast.masks._local_info}
    assert any(0 < b < 1 << 30 for b in budgets)  # and from the counted maxLength body


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
def test_patterns_under_a_length_bound_take_safe_tokens_whole(vocabs, vocab_name):
    """A `pattern` string with a `maxLength` is one pattern automaton under a counter. A pattern state alive on
    any string-safe text (`a.*`), or on any up to a length (a word-count pattern: one word left per ...), gets a
    safe-text budget of the smaller of that and the characters left, and its masks take the safe tokens that
    fit without walking them. Masks equal those of an automaton without these budgets at every byte, up to both
    bounds of the word pattern (all ten words, 48 of 50 characters), and the full-stack simulation on a
    sample."""
    from tokenseam.grammar import GrammarCompiler

    vocab = vocabs[vocab_name]
    schema = {
        "type": "object",
        "properties": {
            "words": {"type": "string", "pattern": "^(?:\\S+\\s+){0,9}\\S+$", "maxLength": 50},
            "any": {"type": "string", "pattern": "^a.*$", "maxLength": 300},
        },
        "required": ["words", "any"],
        "additionalProperties": False,
    }
    doc = json.dumps(
        {"words": "one two three four five six seven eight nine ten", "any": "a" + "x y é 日本 " * 4},
        ensure_ascii=False,
    )
    fast = GrammarCompiler(vocab).compile_json_schema(schema)
    slow = GrammarCompiler(vocab, python_builder=True).compile_json_schema(schema)
    nfa = fast.automaton.nfa
    assert nfa.counted_budget and set(nfa.counted_body) - set(nfa.counted_budget)  # word states; `a.*`
    slow.automaton.nfa.counted_body = {}
    slow.automaton.nfa.counted_budget = {}
    data = doc.encode()
    ma, mb = GrammarMatcher(fast), GrammarMatcher(slow)
    oa = np.zeros(vocab.mask_words, dtype=np.int32)
    ob = oa.copy()
    for cut in range(1, len(data) + 1):
        assert ma.accept_bytes(data[cut - 1 : cut]) and mb.accept_bytes(data[cut - 1 : cut])
        ma.fill_next_token_bitmask(oa)
        mb.fill_next_token_bitmask(ob)
        assert np.array_equal(oa, ob), data[:cut]
    # The budgets were used: masks made from states whose configurations are budgeted pattern states.
    auto = fast.automaton
    used = [kc for kc in fast.masks._local_info if any(q in nfa.counted_body for q, _ in auto._configs(kc))]
    assert used and auto.budget[used[0]] > 0
    _check(fast, vocab, doc, _cuts(doc), seed=8, sample=_sample_with_text)


def test_counters_of_long_loop_bodies_clamp_early(compiler, smollm2_vocab):
    """A counted loop whose body takes many bytes (objects under maxItems) moves at most once or twice per
    token, so its counter is clamped close to its bounds: items past the first few reuse their masks instead of
    walking the vocabulary again per index. Masks still match the simulation near the bound."""
    schema = {
        "type": "array",
        "maxItems": 40,
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "kind": {"enum": ["a", "bb"]}},
            "required": ["name", "kind"],
            "additionalProperties": False,
        },
    }
    g = compiler.compile_json_schema(schema)
    items = [json.dumps({"name": f"n{i}", "kind": "a" if i % 2 else "bb"}) for i in range(40)]
    m = GrammarMatcher(g)
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    counts = []
    for k, item in enumerate(items):
        for ch in ("[" if k == 0 else ", ") + item:
            m.fill_next_token_bitmask(out)
            assert m.accept_bytes(ch.encode())
        counts.append(len(g.masks._local_info))
    assert counts[30] == counts[5]  # no walk per item index in between
    doc = "[" + ", ".join(items) + "]"
    tail = doc.rindex("{")
    _check(g, smollm2_vocab, doc, [1, 30, tail - 2, tail + 1, len(doc) - 1, len(doc)], seed=7)


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
@pytest.mark.parametrize(
    "kind,grammar,doc",
    [
        ("schema", {}, DOC),  # recursion: calls and rule ends inside the walk
        (
            "schema",
            {
                "type": "array",
                "maxItems": 6,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "name": {"type": "string", "maxLength": 30},
                        "tags": {"type": "array", "items": {"enum": ["a", "bé", "c d"]}},
                    },
                    "required": ["id"],
                },
            },
            json.dumps(
                [{"id": 1, "name": "x é 日本", "tags": ["bé", "a"]}, {"id": -20, "tags": []}, {"id": 3}],
                ensure_ascii=False,
            ),
        ),  # counters: clamped rows
        (
            "schema",
            {"type": "object", "additionalProperties": {"$ref": "#"}},
            json.dumps({"a": {"b": {}, "c x": {"d": {}}}, "e": {}}, indent=2),
        ),
        (
            "gbnf",
            'root ::= list\nlist ::= "(" (item (" " item)*)? ")"\nitem ::= list | [a-z]+ | "\\"" [^"]* "\\""\n',
            '((ab (c "x y") ()) ("q" (((z)))))',
        ),
        ("regex", r"(ab|a[^x]{2,5}z)+\d{3}", "abazzzzabacdz123"),
        (
            "schema",
            {
                "type": "array",
                "maxItems": 20,
                "items": {"type": "string", "maxLength": 30, "pattern": "^[a-zé]+( [a-z日本]+)*$"},
            },
            json.dumps(["ab", "cdé 日本 x", "xyz", "qq", "a b c d e f"], ensure_ascii=False),
        ),  # counters with guards
        (
            "regex",
            r"(a|bc){13,}x{2,40}y{0,3}",
            "aaaaaaabcbcbcbcbcbcabcxxxxxxxxxxxxxxxxxxxy",
        ),  # a counter without a max
    ],
)
def test_walk_builds_the_states_python_builds(vocabs, vocab_name, kind, grammar, doc):
    """The walk builds missing transitions itself (localbuild.fill); masks equal those of an automaton whose
    every state is built in Python, over the whole vocabulary at every byte of a document."""
    _compare_builders(vocabs[vocab_name], kind, grammar, doc)


def test_mask_walks_build_counter_states_in_numba(monkeypatch, smollm2_vocab):
    """Closures that push, bump, guard or pop a counter are built inside the walk too (clamped there):
    no mask of an automaton with counters hands a transition back to Python."""
    from tokenseam.grammar import GrammarCompiler
    from tokenseam.grammar.automaton import Automaton

    g = GrammarCompiler(smollm2_vocab).compile_json_schema(
        {"type": "array", "minItems": 2, "maxItems": 20, "items": {"type": "string", "maxLength": 30}}
    )
    assert g.automaton.has_counters
    in_mask = [False]
    python_fills = []
    fill = Automaton.fill

    def counting_fill(self, sid, c):
        if in_mask[0]:
            python_fills.append((sid, c))
        return fill(self, sid, c)

    monkeypatch.setattr(Automaton, "fill", counting_fill)
    m = GrammarMatcher(g)
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    for ch in '["ab", "c d é", "x"]':
        in_mask[0] = True
        m.fill_next_token_bitmask(out)
        in_mask[0] = False
        assert m.accept_bytes(ch.encode())
    assert m.is_accepting()
    assert python_fills == []


@pytest.mark.parametrize(
    "schema,doc",
    [
        ({}, DOC),  # recursion: positions in several call frames
        # counter frames in the parts' local stacks
        (
            {
                "type": "object",
                "patternProperties": {
                    "^[0-9a-zA-Z_-]{1,255}$": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "maxLength": 300}, "b": {"type": "number"}},
                    }
                },
            },
            json.dumps({"key1": {"a": "x y é", "b": 123}, "key_2": {"b": -1.5}, "k": {}}, ensure_ascii=False),
        ),
    ],
)
def test_split_and_escapes_in_numba_match_python(smollm2_vocab, schema, doc):
    """A position whose configurations sit in several call frames is split into one mask key per frame by
    localbuild.group_by_frame, and where a local state's escapes lead on a real stack is found by
    localbuild.escape_target; along a document, every split equals its Python twin's and every escape target
    `_escape_target_py`'s, state for state."""
    from tokenseam.grammar import GrammarCompiler

    g = GrammarCompiler(smollm2_vocab).compile_json_schema(schema)
    m = GrammarMatcher(g)
    out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    for ch in doc:
        m.fill_next_token_bitmask(out)
        assert m.accept_bytes(ch.encode())
    auto = g.automaton
    made = {k: v for k, v in g.masks._frame_group_memo.items() if v is not None}
    assert len(made) >= 3
    for (kc, p), parts in made.items():
        assert sorted(g.masks._group_by_frame_py(kc, p)) == sorted(parts)
    assert len(auto._escape_memo) >= 3
    for (s, p, clamp), (k2, p2, acc2) in auto._escape_memo.items():
        k, q, acc, _ = auto.pairs[auto._escape_target_py(s, p)[2]]
        assert (auto.clamped(k) if k >= 0 and clamp else k, q, acc) == (k2, p2, acc2)


# An array of objects with a bounded string: counters, clamped in walks and real in commits.
COUNTED_OBJECTS = (
    {
        "type": "array",
        "maxItems": 6,
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 30}, "n": {"type": "integer"}},
        },
    },
    json.dumps([{"name": "x é 日本", "n": 12}, {"n": -3}, {}], ensure_ascii=False),
)


@pytest.mark.parametrize(
    "schema,doc",
    [
        ({}, DOC),
        COUNTED_OBJECTS,
    ],
)
def test_walk_builder_grows_its_arrays(monkeypatch, smollm2_vocab, schema, doc):
    """Every array of the walk's builder starting with one row: each is grown (and the hash tables rebuilt)
    many times while walks are under way; masks are unchanged."""
    from tokenseam.grammar import localbuild

    monkeypatch.setattr(localbuild, "START_ROWS", 1)
    _compare_builders(smollm2_vocab, "schema", schema, doc)


@pytest.mark.parametrize(
    "kind,grammar,doc",
    [
        ("schema", {}, DOC),  # calls, rule ends and deep stacks
        ("schema", *COUNTED_OBJECTS),  # counters: clamped stacks
        ("regex", r"(ab|a[^x]{2,5}z)+\d{3}", "abazzzzabacdz123"),
    ],
)
def test_walk_builder_hands_back_what_outgrows_its_scratch(monkeypatch, smollm2_vocab, kind, grammar, doc):
    """The numba builders allocate nothing: they work in one set of scratch arrays, and leave to Python what
    would outgrow it. With scratch room for two closure configurations, three local states and one stack frame,
    Python builds most states in the middle of walks and commits; masks still equal the Python builder's, and
    numba still built some states."""
    from tokenseam.grammar import localbuild
    from tokenseam.grammar.automaton import Automaton

    handed_back = []
    fill = Automaton.fill

    def counting_fill(self, sid, c):
        if not self.python_builder:
            handed_back.append((sid, c))
        return fill(self, sid, c)

    monkeypatch.setattr(Automaton, "fill", counting_fill)
    tiny = localbuild.Scratch(closure=2, local=3, chain=1)
    monkeypatch.setattr(localbuild, "_SCRATCH", tiny)
    _compare_builders(smollm2_vocab, kind, grammar, doc)
    assert handed_back  # Python built what numba could not
    assert tiny.meta[localbuild.SC_EPOCH] > 0  # and numba computed closures in the tiny scratch


def test_builder_sort_and_chain_stay_in_their_arrays():
    """localbuild's own sort (numba's allocates) sorts and deduplicates like numpy at every size, both the
    insertion and the heap path; `_chain` reports a stack deeper than its array instead of writing past it."""
    from tokenseam.grammar import localbuild

    rng = np.random.default_rng(3)
    for n in [0, 1, 2, 5, 16, 17, 40, 1000]:
        for _ in range(20):
            a = rng.integers(-50, 50, size=n + 3).astype(np.int64)
            head, tail = a[:n].copy(), a[n:].copy()
            u = localbuild._uniq(a, n)
            assert a[:u].tolist() == np.unique(head).tolist()
            assert np.array_equal(a[n:], tail)  # nothing past n touched
    a = rng.integers(0, 1 << 40, size=500).astype(np.int64)
    want = np.unique(a)
    assert a[: localbuild._uniq(a, 500)].tolist() == want.tolist()
    # stacks: 2 <- 3 <- 4 <- 5 (parent in column 1), roots 0 and 1
    stk = np.array([[0, 0, 0], [0, 1, 0], [7, 1, 0], [7, 2, 0], [7, 3, 0], [7, 4, 0]], dtype=np.int64)
    chain = np.empty(4, np.int64)
    assert localbuild._chain(5, -1, stk, chain) == (4, 1)
    assert chain.tolist() == [5, 4, 3, 2]
    assert localbuild._chain(5, 3, stk, chain) == (2, 3)
    assert localbuild._chain(5, -1, stk, np.empty(3, np.int64)) == (-1, 2)


def test_automaton_rows_grow_in_place_unless_held(compiler):
    """The transition rows grow in place when nothing else holds them, and are copied when something does (the
    holder keeps the old rows intact); either way the old rows are kept and the new ones are UNKNOWN."""
    from tokenseam.grammar.localbuild import UNKNOWN

    auto = compiler.compile_json_schema(
        {"type": "array", "items": {"type": "string", "maxLength": 40}}
    ).automaton
    assert auto.clamped_trans is not None
    n = auto.trans.shape[0]
    before = auto.trans.copy(), auto.clamped_trans.copy()
    ids = id(auto.trans), id(auto.clamped_trans)
    auto._grow(2 * n)
    assert (id(auto.trans), id(auto.clamped_trans)) == ids  # grown in place
    held = auto.trans
    auto._grow(4 * n)
    assert auto.trans is not held and held.shape[0] == 2 * n  # copied: the holder's rows untouched
    for rows, old in zip((auto.trans, auto.clamped_trans), before, strict=True):
        assert rows.shape[0] == 4 * n
        assert np.array_equal(rows[:n], old) and (rows[n:] == UNKNOWN).all()


def test_builders_hold_the_gil_for_their_shared_scratch():
    """The builders share one Scratch per process, which is safe only while no two run at once: none may
    release the GIL (nogil) or run in parallel."""
    import numba

    from tokenseam.grammar import localbuild

    builders = [f for f in vars(localbuild).values() if isinstance(f, numba.core.registry.CPUDispatcher)]
    assert len(builders) > 20
    for f in builders:
        assert not f.targetoptions.get("nogil") and not f.targetoptions.get("parallel"), f.__name__


def _compare_builders(vocab, kind, grammar, doc, **options) -> None:
    """The numba and the Python builder give the same masks at every byte of `doc` (options: of a schema)."""
    from tokenseam.grammar import GrammarCompiler
    from tokenseam.grammar.localbuild import M_STACKS

    def compile_one(python_builder: bool):
        c = GrammarCompiler(vocab, python_builder=python_builder)
        if kind == "schema":
            return c.compile_json_schema(grammar, **options)
        return c.compile_gbnf(grammar) if kind == "gbnf" else c.compile_regex(grammar)

    fast, slow = compile_one(False), compile_one(True)
    ma, mb = GrammarMatcher(fast), GrammarMatcher(slow)
    oa = np.zeros(vocab.mask_words, dtype=np.int32)
    ob = oa.copy()
    data = doc.encode()
    for cut in range(len(data) + 1):
        if cut:
            assert ma.accept_bytes(data[cut - 1 : cut]) and mb.accept_bytes(data[cut - 1 : cut])
        ma.fill_next_token_bitmask(oa)
        mb.fill_next_token_bitmask(ob)
        assert np.array_equal(oa, ob), data[:cut]
    assert ma.is_accepting() and mb.is_accepting()
    auto = fast.automaton
    assert auto._numba_states and not slow.automaton._numba_states
    if kind != "regex":
        assert auto._fast.meta[M_STACKS] > 2  # frames pushed (by either side)


def test_commit_memo_gives_the_positions_of_a_fresh_run(monkeypatch, smollm2_vocab, tokenizers):
    """Commits are memoised per (position, bytes); a memo that keeps starting over (two entries) and the
    default one reach the same positions and masks on every token, over two requests of the same schema."""
    from tokenseam.grammar import GrammarCompiler, automaton

    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 12}},
        },
    }
    doc = json.dumps(
        [{"id": 1, "name": "ab"}, {"id": 22, "name": "ab"}, {"id": 1, "name": "é x"}], ensure_ascii=False
    )
    toks = tokenizers["smollm2"].encode(doc)
    runs = []
    for limit in (2, automaton.STEP_MEMO_ENTRIES):
        monkeypatch.setattr(automaton, "STEP_MEMO_ENTRIES", limit)
        compiled = GrammarCompiler(smollm2_vocab).compile_json_schema(schema)
        trace = []
        for _ in range(2):
            m = GrammarMatcher(compiled)
            out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
            for t in toks:
                m.fill_next_token_bitmask(out)
                trace.append((m._state, out.tobytes()))
                assert m.accept_token(t)
            assert m.is_accepting()
        assert 0 < len(compiled.automaton._step_memo) <= limit
        runs.append(trace)
    assert runs[0] == runs[1]


def test_nfa_rows_flat_and_read_only():
    from tokenseam.grammar.flatrows import FlatRows

    edges = [[(1, 2, 3), (5, 5, 0)], [], [(0, 255, 2)]]
    eps = [[2], [], [0, 1]]
    fe, fp = FlatRows(edges, 3), FlatRows(eps, 1)
    assert len(fe) == 3 and [list(r) for r in fe] == edges and [list(r) for r in fp] == eps
    assert fe.lists() == edges and fp.lists() == eps  # every row at once, as the same lists
    assert fe.off.tolist() == [0, 2, 2, 3] and fp.data.tolist() == [2, 0, 1]
    assert fe[1] == () and fe[0] is fe[0]  # a row is made once
    with pytest.raises(IndexError):
        fe[-1]
    with pytest.raises(IndexError):
        fe[3]
    with pytest.raises(TypeError):
        fe[0] = []


def test_nfa_edges_kept_flat_while_built_come_out_per_state_in_order():
    """ByteNFA keeps its edges as flat lists while it is built; frozen, each state's row holds its edges in the
    order they were added, whatever came between them. replace_rows (the rare rewrite after the freeze)
    takes rows as lists."""
    from tokenseam.grammar.nfa import ByteNFA

    nfa = ByteNFA()
    first = nfa.add_many(4)
    assert first == 0 and nfa.size == 4 and nfa.edges is None and nfa.eps is None
    for e in [
        (2, 0x61, 0x61, 3),
        (0, 0x20, 0x7E, 1),
        (2, 0x30, 0x39, 0),
        (1, 0x80, 0xBF, 2),
        (0, 0x0A, 0x0A, 0),
    ]:
        nfa.e += e
    for p in [(3, 1), (0, 2), (3, 0), (0, 3)]:
        nfa.ep += p
    nfa.freeze_rows()
    rows = [[(0x20, 0x7E, 1), (0x0A, 0x0A, 0)], [(0x80, 0xBF, 2)], [(0x61, 0x61, 3), (0x30, 0x39, 0)], []]
    assert [list(r) for r in nfa.edges] == rows
    assert [list(r) for r in nfa.eps] == [[2, 3], [], [], [1, 0]]
    assert nfa.edges.off.tolist() == [0, 2, 3, 5, 5] and nfa.edges.data.flags.c_contiguous
    assert nfa.eps.data.flags.c_contiguous and nfa.eps.data.ndim == 1
    nfa.replace_rows(rows[1:] + [[]], [[0], [], [], []])
    assert [list(r) for r in nfa.edges] == rows[1:] + [[]] and nfa.eps[0] == (0,)


def test_flat_rows_grouped_by_a_stable_counting_sort():
    """FlatRows.grouped (the NFA's rows at the freeze, in numba): against a stable sort in numpy, on random
    items with empty states between; no items at all; an item naming a state out of range is refused."""
    from tokenseam.grammar.flatrows import FlatRows

    rng = np.random.default_rng(7)
    for width, n, m in ((4, 50, 400), (2, 50, 400), (4, 1, 3), (2, 7, 0), (4, 3_000, 20_000)):
        items = rng.integers(0, 200, size=(m, width)).astype(np.int32)
        items[:, 0] = rng.integers(0, n, size=m) // 3 * 3  # two states in three stay empty
        rows = FlatRows.grouped(items, n)
        order = np.argsort(items[:, 0], kind="stable")
        assert rows.off.tolist() == [0, *np.cumsum(np.bincount(items[:, 0], minlength=n)).tolist()]
        want = items[order, 1:] if width > 2 else items[order, 1]
        assert rows.data.shape == want.shape and (rows.data == want).all()
        assert len(rows) == n
        assert rows.lists() == [list(rows[q]) for q in range(n)]
        for q in range(min(n, 60)):
            mine = items[items[:, 0] == q]
            assert list(rows[q]) == (
                [tuple(x) for x in mine[:, 1:].tolist()] if width > 2 else mine[:, 1].tolist()
            )
    for bad in (-1, 5):
        with pytest.raises(ValueError, match="out of range"):
            FlatRows.grouped(np.array([[0, 1], [bad, 2]], np.int32), 5)


def test_compiling_leaves_no_reference_cycles(compiler, smollm2_vocab):
    """A compile's intermediate objects (schema compiler, IR, NFA builder) are freed by reference counting
    as soon as it ends: a cycle among them would keep them all for the collector, whose first pass after a
    large compile then took 10-30 ms of the time to first mask."""
    import gc

    from tokenseam.grammar import GrammarCompiler

    schema = {
        "type": "object",
        "properties": {
            "a": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 5}],
                "items": {"enum": ["x", "y"]},
                "maxItems": 4,
            },
            "b": {"$ref": "#"},
            "c": {"type": "string", "pattern": "^[a-z]+$"},
        },
        "required": ["c"],
    }
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        m = GrammarMatcher(GrammarCompiler(smollm2_vocab).compile_json_schema(schema))
        out = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
        for ch in '{"a": [1, "ab", "x"], "c": "q"}':
            m.fill_next_token_bitmask(out)
            assert m.accept_bytes(ch.encode())
        del m
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [
            o
            for o in gc.garbage
            if (getattr(type(o), "__module__", "") or "").startswith("tokenseam.grammar")
            or (callable(o) and (getattr(o, "__module__", "") or "").startswith("tokenseam.grammar"))
        ]
        assert not ours, ours[:5]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


@pytest.mark.parametrize(
    "grammar,text",
    [
        ('root ::= "[" item ("," item)* "]"\nitem ::= root | [a-z]+\n', "[ab,[c,[d]],e]"),
        # counters: commits build the real successors (values not clamped), masks the clamped ones
        (
            'root ::= "[" item ("," item){0,20} "]"\nitem ::= root | [a-z]{1,30}\n',
            "[ab,[c,[d,x,y]],abcdefghijklmnopq,e]",
        ),
    ],
)
def test_commits_build_states_in_the_walks_builder(smollm2_vocab, grammar, text):
    """A commit that meets a transition no mask has built builds it with localbuild.fill, and reaches the
    same positions as when Python builds every state."""
    from tokenseam.grammar import GrammarCompiler

    def run(python_only: bool):
        g = GrammarCompiler(smollm2_vocab, python_builder=python_only).compile_gbnf(grammar)
        m = GrammarMatcher(g)
        trace = []
        auto = g.automaton

        def frames(st):  # stack ids may be numbered apart: compare the frames (return state, counter value)
            out = []
            while st > 1:
                ret, st, value = auto.stacks[st]
                out.append((ret, value))
            return tuple(out), st

        for ch in text:  # no mask is asked for: every transition is built by a commit
            assert m.accept_bytes(ch.encode())
            k, p, acc, _ = auto.pairs[m._state]
            trace.append((sorted((q, frames(st)) for q, st in auto._configs(k)), frames(p), acc))
        return auto, trace

    fast, ta = run(False)
    slow, tb = run(True)
    assert fast._numba_states and not slow._numba_states
    assert ta == tb and ta[-1][2]


def test_warm_up_calls_every_numba_builder(monkeypatch, smollm2_vocab):
    """GrammarCompiler.warm_up (run by `tokenseam serve` at startup and by the benchmark before timing) reaches
    the walk (which builds states inside), the commits' builder, the split by call frame and the escape
    targets, clamped (an automaton with counters) and real, and the state index's updates and rebuild: each
    numba function is loaded before a request needs it. It caches nothing."""
    from tokenseam.grammar import GrammarCompiler, automaton, flatrows, localbuild, masks

    calls = []

    def counting(name, fn):
        def call(*args):
            calls.append((name, args[2] if name in ("fill", "group_by_frame", "escape_target") else None))
            return fn(*args)

        return call

    for module, name in (
        (masks, "walk_esc"),
        (automaton, "fill"),
        (masks, "group_by_frame"),
        (automaton, "escape_target"),
        (localbuild, "index_new"),
        (localbuild, "rehash"),
        (flatrows, "_group"),
    ):
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    compiler = GrammarCompiler(smollm2_vocab)
    compiler.warm_up()
    assert {name for name, _ in calls} == {
        "walk_esc",
        "fill",
        "group_by_frame",
        "escape_target",
        "index_new",
        "rehash",
        "_group",
    }
    assert ("escape_target", True) in calls and (
        "escape_target",
        False,
    ) in calls  # clamped (masks, counters), real
    assert len(compiler._cache) == 0


def test_warm_up_pays_the_one_time_costs_of_a_first_compile(smollm2_vocab):
    """After warm_up, a first schema with a \\d pattern and an enum finds Python's shorthand classes computed
    and jsonschema loaded (each about 50-60 ms when the first request of a process pays it)."""
    import subprocess
    import sys

    code = (
        "import sys; from tokenseam.grammar import GrammarCompiler, regex; from tokenseam.vocab import "
        "load_vocabulary\n"
        "assert 'jsonschema' not in sys.modules and regex.python_classes.cache_info().currsize == 0\n"
        "GrammarCompiler(load_vocabulary('smollm2')).warm_up()\n"
        "assert 'jsonschema' in sys.modules and regex.python_classes.cache_info().currsize == 1\n"
        "print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("max_ws", [40, 0])
def test_layout_lowering_matches_the_general_one(monkeypatch, smollm2_vocab, max_ws):
    """JSON layout whitespace (ir.LAYOUT, LAYOUT_NO_INDENT) is lowered by nfa._Builder.layout, not by walking
    its tree: masks equal the general lowering's at every byte of documents laid out in every allowed way,
    and the same layouts are accepted and refused."""
    from tokenseam.grammar import GrammarCompiler, nfa

    schema = {
        "type": "object",
        "properties": {"a": {"type": "array", "items": {"type": "integer"}}, "b": {"type": "string"}},
        "required": ["a"],
    }
    fast = GrammarCompiler(smollm2_vocab).compile_json_schema(schema, max_ws=max_ws)
    monkeypatch.setattr(nfa, "LAYOUT", object())  # no node is these any more: the general lowering
    monkeypatch.setattr(nfa, "LAYOUT_NO_INDENT", object())
    slow = GrammarCompiler(smollm2_vocab).compile_json_schema(schema, max_ws=max_ws)
    assert (
        fast.automaton.nfa.size + (1 if max_ws else 0) <= slow.automaton.nfa.size
    )  # one state fewer per layout with indentation
    value = {"a": [1, 22], "b": "x y"}
    docs = [
        json.dumps(value),
        json.dumps(value, indent=2),
        json.dumps(value, separators=(",", ":")),
        '{\t"a" :[1 ,\r\n22],\r\n"b":  "x y"}',
        '{"a": [1,   2]}',
        '{"a":\n\t\t[]}',
    ]
    oa = np.zeros(smollm2_vocab.mask_words, dtype=np.int32)
    ob = oa.copy()
    for doc in docs:
        ma, mb = GrammarMatcher(fast), GrammarMatcher(slow)
        for ch in doc:
            ma.fill_next_token_bitmask(oa)
            mb.fill_next_token_bitmask(ob)
            assert np.array_equal(oa, ob), doc
            ta, tb = ma.accept_bytes(ch.encode()), mb.accept_bytes(ch.encode())
            assert ta == tb, doc
            if not ta:
                break
        else:
            assert ma.is_accepting() == mb.is_accepting()
    # three blanks in a row are not layout; an indented line only when indentation is on
    assert not GrammarMatcher(fast).accept_bytes(b'{"a": [1,   2]}')
    assert GrammarMatcher(fast).accept_bytes(b'{"a":\n\t\t[]}') == bool(max_ws)


# Grammars that reach every builder Python calls: recursion (frames, escapes), counters clamped and real, any
# order, indentation, escapes in strings, a recursive GBNF, a regex with a counter.
DIRECT_CASES = [
    ("schema", {}, DOC, {}),
    ("schema", COUNTED_OBJECTS[0], COUNTED_OBJECTS[1], {}),
    (
        "schema",
        {
            "type": "object",
            "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
            "required": ["a"],
        },
        '{\n  "a": 3,\n  "b": "q\\u00e9\\n",\n  "z": [true]\n}',
        {"property_order": "any", "max_ws": 4},
    ),
    (
        "gbnf",
        'root ::= list\nlist ::= "(" (item (" " item)*)? ")"\nitem ::= list | [a-z]+\n',
        "((ab (c)) (((z))))",
        {},
    ),
    ("regex", r"(a|bc){13,}x{2,40}y{0,3}", "aaaaaaabcbcbcbcbcbcabcxxxxxxxxxxy", {}),
]


def _masks_along(vocab, tokenizer, kind, grammar, doc, options) -> list[bytes]:
    """Every mask of a fresh compile along `doc`, byte by byte and then token by token."""
    from tokenseam.grammar import GrammarCompiler

    c = GrammarCompiler(vocab)
    if kind == "schema":
        g = c.compile_json_schema(grammar, **options)
    else:
        g = c.compile_gbnf(grammar) if kind == "gbnf" else c.compile_regex(grammar)
    out = np.zeros(vocab.mask_words, dtype=np.int32)
    seen = []
    m = GrammarMatcher(g)
    for ch in doc.encode():
        m.fill_next_token_bitmask(out)
        seen.append(out.tobytes())
        assert m.accept_bytes(bytes([ch]))
    m = GrammarMatcher(g)
    for tok in tokenizer.encode(doc):
        m.fill_next_token_bitmask(out)
        seen.append(out.tobytes())
        assert m.accept_token(tok)
    return seen


@pytest.mark.parametrize("vocab_name", ["smollm2", "gemma3"])
def test_builders_called_past_the_dispatcher_take_one_set_of_types(
    monkeypatch, vocabs, tokenizers, vocab_name
):
    """The numba builders Python calls go to their compiled entry point, which converts arguments without
    looking at them (localbuild.Direct): safe only while every call passes the same types. With every call
    through numba's dispatcher (CHECK_TYPES), a varied workload calls each builder with one set of argument
    types, and the masks are those of the entry points."""
    from tokenseam.grammar import automaton, localbuild, masks

    vocab, tok = vocabs[vocab_name], tokenizers[vocab_name]
    direct = [automaton.fill, automaton.escape_target, masks.walk_esc, masks.group_by_frame]
    assert all(isinstance(d, localbuild.Direct) for d in direct)
    with monkeypatch.context() as mp:
        mp.setattr(localbuild, "CHECK_TYPES", True)
        for d in direct:
            mp.setattr(d, "entry", None)
            mp.setattr(d, "seen", set())
        checked = [_masks_along(vocab, tok, *case) for case in DIRECT_CASES]
        for d in direct:
            assert d.entry is None
            assert len(d.seen) == 1, (d.fn, d.seen)
            assert next(iter(d.seen)) in d.fn.overloads
    assert [_masks_along(vocab, tok, *case) for case in DIRECT_CASES] == checked
    assert all(d.entry is not None for d in direct)

"""GBNF front end: llama.cpp's grammar format (rules, literals, classes, groups, repeats) to the grammar IR.

Matching is over Unicode code points encoded as UTF-8, as in llama.cpp; `root` is the start rule.
"""

from __future__ import annotations

from .budget import compile_budget, current
from .errors import GrammarError
from .ir import EMPTY, MAX_CP, Chars, Grammar, Node, Ref, Repeat, alt, complement, norm, seq
from .rulegraph import productive

MAX_REPEAT = 100_000
_ESC = {
    "n": 10,
    "r": 13,
    "t": 9,
    "\\": 92,
    '"': 34,
    "[": 91,
    "]": 93,
    "/": 47,
    "-": 45,
    "'": 39,
    "0": 0,
    "f": 12,
    "v": 11,
    "b": 8,
    "a": 7,
    "^": 94,
}


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.budget = current()

    def err(self, msg: str) -> GrammarError:
        line = self.s.count("\n", 0, self.i) + 1
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1) + 1
        return GrammarError(f"GBNF: {msg} at line {line}, column {col}")

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def skip(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while self.i < len(self.s) and (
            self.s[self.i].isalnum() and self.s[self.i].isascii() or self.s[self.i] in "-_"
        ):
            self.i += 1
        if j == self.i:
            raise self.err("expected a rule name")
        return self.s[j : self.i]

    def parse(self) -> dict[str, Node]:
        rules: dict[str, Node] = {}
        self.skip(True)
        while self.i < len(self.s):
            name = self.name()
            self.budget.where = f"rule {name!r}"
            self.skip(False)
            if not self.s.startswith("::=", self.i):
                raise self.err(f"expected '::=' after rule name {name!r}")
            self.i += 3
            self.skip(True)
            body = self.alternates(nested=False)
            if name in rules:
                raise self.err(f"rule {name!r} is defined twice")
            rules[name] = body
            self.skip(False)
            if self.i < len(self.s) and self.s[self.i] not in "\r\n":
                raise self.err(f"unexpected {self.s[self.i]!r}")
            self.skip(True)
        return rules

    def alternates(self, nested: bool) -> Node:
        seqs = [self.sequence(nested)]
        while True:
            save = self.i
            self.skip(True)
            if self.peek() == "|":
                self.i += 1
                self.skip(True)
                seqs.append(self.sequence(nested))
            else:
                self.i = save
                break
        return alt(*seqs) if len(seqs) > 1 else seqs[0]

    def sequence(self, nested: bool) -> Node:
        items: list[Node] = []
        while True:
            self.skip(nested)
            c = self.peek()
            if c is None or c in "|)\r\n":
                break
            if c == '"':
                item = self.literal()
            elif c == "[":
                item = self.char_class()
            elif c == "(":
                self.i += 1
                self.skip(True)
                item = self.alternates(nested=True)
                self.skip(True)
                if self.peek() != ")":
                    raise self.err("expected ')'")
                self.i += 1
            elif c == ".":
                self.i += 1
                item = Chars(norm([(0, MAX_CP)]))
            elif c == "<":
                raise self.err("token references (<...>) are not supported")
            elif c.isalnum() or c in "-_":
                item = Ref(self.name())
            else:
                raise self.err(f"unexpected character {c!r}")
            self.budget.spend(1)
            items.append(self.quantifiers(item))
        if not items:
            return EMPTY
        return seq(*items)

    def quantifiers(self, item: Node) -> Node:
        while True:
            c = self.peek()
            if c == "*":
                item = Repeat(item, 0, None)
            elif c == "+":
                item = Repeat(item, 1, None)
            elif c == "?":
                item = Repeat(item, 0, 1)
            elif c == "{":
                j = self.s.find("}", self.i)
                if j < 0:
                    raise self.err("unterminated '{'")
                body = self.s[self.i + 1 : j].replace(" ", "")
                parts = body.split(",")
                try:
                    if len(parts) == 1:
                        lo = hi = int(parts[0])
                    elif len(parts) == 2:
                        lo = int(parts[0]) if parts[0] else 0
                        hi = int(parts[1]) if parts[1] else None
                    else:
                        raise ValueError
                except ValueError as exc:
                    raise self.err(f"bad repetition {{{body}}}") from exc
                if lo < 0 or (hi is not None and hi < lo):
                    raise self.err(f"bad repetition {{{body}}}")
                if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
                    raise self.err(f"repetition {{{body}}} is too large (limit {MAX_REPEAT})")
                item = Repeat(item, lo, hi)
                self.i = j
            else:
                return item
            self.i += 1

    def char(self) -> int:
        c = self.peek()
        if c is None:
            raise self.err("unexpected end of grammar")
        if c != "\\":
            self.i += 1
            return ord(c)
        self.i += 1
        e = self.peek()
        if e is None:
            raise self.err("trailing backslash")
        self.i += 1
        if e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            h = self.s[self.i : self.i + n]
            if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                raise self.err(f"bad \\{e} escape")
            self.i += n
            v = int(h, 16)
            if v > MAX_CP:
                raise self.err("code point out of range")
            return v
        if e in _ESC:
            return _ESC[e]
        raise self.err(f"unknown escape \\{e}")

    def literal(self) -> Node:
        self.i += 1
        cps = []
        while True:
            c = self.peek()
            if c is None or c in "\r\n":
                raise self.err("unterminated string literal")
            if c == '"':
                self.i += 1
                break
            cps.append(self.char())
        if not cps:
            return EMPTY
        self.budget.spend(1 + len(cps) // 2)  # a node per character
        return seq(*[Chars(norm([(v, v)])) for v in cps])

    def char_class(self) -> Node:
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges = []
        while True:
            c = self.peek()
            if c is None:
                raise self.err("unterminated character class")
            if c == "]":
                self.i += 1
                break
            lo = self.char()
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]":
                self.i += 1
                hi = self.char()
                if hi < lo:
                    raise self.err("character range end before start")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        rs = norm(ranges)
        if negate:
            rs = complement(rs)
        if not rs:
            raise self.err("empty character class")
        self.budget.spend(len(rs))  # a range each, and each is lowered to edges
        return Chars(rs)


def parse_gbnf(text: str, start: str = "root") -> Grammar:
    """Parse a GBNF grammar; undefined rules, a missing start rule and bad syntax raise GrammarError."""
    with compile_budget() as b:
        stage, b.stage = b.stage, "parsing the GBNF grammar"
        try:
            return _parse_gbnf(text, start)
        finally:
            b.stage = stage


def _parse_gbnf(text: str, start: str) -> Grammar:
    rules = _Parser(text).parse()
    if not rules:
        raise GrammarError("GBNF: the grammar defines no rules")
    if start not in rules:
        raise GrammarError(f"GBNF: the grammar has no {start!r} rule")
    g = Grammar(rules, start)
    ok = productive(g)
    if ok.get(start):
        # A rule that can never finish is left out with every alternative that needs it (the language is
        # unchanged); say so, as it is usually a mistake in the grammar. (When the start rule itself never
        # finishes, compiling reports why.)
        for name in rules:
            if not ok[name]:
                g.warnings.append(
                    f"GBNF rule {name!r} can never finish (it has no way out of its recursion), "
                    "so alternatives that use it can never match"
                )
    return g

r"""Regex front end: the regular subset of Python `re` syntax parsed into the grammar IR.

Full-match semantics for `compile_regex`; search semantics (implicit `.*` unless anchored) for JSON Schema.

Two dialects. `python` (compile_regex, guided_regex) gives `\d \w \s` and `.` exactly Python's meaning for str
patterns (Unicode digits, word characters and spaces, taken from the running `re`). `json-schema` (the
`pattern` keyword) must hold for a validator using either ECMA-262 (the specification: ASCII `\d \w`, its own
whitespace set, `.` stopping at every line terminator) or Python `re` (what Python validators use): every
shorthand, `.` and character class accepts exactly the characters both readings accept.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from .budget import current
from .errors import GrammarError
from .ir import (
    EMPTY,
    MAX_CP,
    Chars,
    Node,
    Repeat,
    alt,
    complement,
    intersect,
    norm,
    opt,
    seq,
)

ASCII_DIGIT = ((0x30, 0x39),)
ASCII_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMA-262 WhiteSpace and LineTerminator.
ECMA_SPACE = norm(
    [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ]
)
ANY = norm([(0, MAX_CP)])
MAX_REPEAT = 100_000
DIALECTS = ("python", "json-schema", "ecma")


@functools.cache
def python_classes() -> dict[str, tuple]:
    r"""The code points Python's `re` matches with \d, \w and \s in a str pattern, as ranges (found once per
    process by scanning every code point with `re` itself, about 60 ms)."""
    text = np.arange(MAX_CP + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    return {
        k: tuple((m.start(), m.end() - 1) for m in re.finditer(p, text))
        for k, p in (("d", r"\d+"), ("w", r"\w+"), ("s", r"\s+"))
    }


@functools.cache
def shorthand(letter: str, dialect: str) -> tuple[tuple, tuple]:
    """A shorthand's two readings: (ECMA-262's, Python's) in the json-schema dialect, Python's twice in the
    python dialect, ECMA-262's twice in the ecma dialect. A pattern accepts what both readings of it accept."""
    low = letter.lower()
    py = norm(python_classes()[low])
    if dialect == "python":
        ecma = py
    elif low == "s":
        ecma = ECMA_SPACE
    else:
        ecma = norm(ASCII_DIGIT if low == "d" else ASCII_WORD)
    if dialect == "ecma":
        py = ecma
    if letter.isupper():
        return complement(ecma), complement(py)
    return ecma, py


@functools.cache
def _both(letter: str, dialect: str) -> tuple:
    """What both readings of a shorthand outside a class accept."""
    return intersect(*shorthand(letter, dialect))


# Character classes read so far: (dialect, the class's text from "[" to "]") -> its ranges. A class reads
# nothing past its closing bracket, so the same text reads the same anywhere.
CLASSES: dict[tuple[str, str], tuple] = {}
CLASSES_MAX = 4096


def _class_end(p: str, i: int) -> int | None:
    """Where the class opening at p[i] ends (one past its "]"), for looking it up in CLASSES; None if it does
    not end. A wrong guess only misses the lookup (stored texts come from the parser)."""
    j = i + 1
    if j < len(p) and p[j] == "^":
        j += 1
    first = True
    while j < len(p):
        c = p[j]
        if c == "]" and not first:
            return j + 1
        j += 2 if c == "\\" else 1
        first = False
    return None


def _dot(dialect: str) -> Chars:
    if dialect == "python":
        return Chars(complement(((10, 10),)))
    return Chars(complement(norm([(10, 10), (13, 13), (0x2028, 0x2029)])))  # ECMA's line terminators too


class _Anchor(Node):
    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


class _Shorthand(Chars):
    """A shorthand inside a character class: both readings are kept, as the class is read both ways."""

    __slots__ = ("other",)

    def __init__(self, ecma, python) -> None:
        super().__init__(ecma)
        object.__setattr__(self, "other", python)


SIMPLE_ESC = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "0": 0}


class _Parser:
    def __init__(self, pattern: str, where: str, dialect: str = "python") -> None:
        self.p = pattern
        self.i = 0
        self.where = where
        self.dialect = dialect
        self.budget = current()

    def err(self, msg: str) -> GrammarError:
        return GrammarError(f"{self.where}: {msg} at position {self.i} in regex {self.p!r}")

    def peek(self) -> str | None:
        return self.p[self.i] if self.i < len(self.p) else None

    def parse(self) -> Node:
        node = self.parse_alt()
        if self.i != len(self.p):
            raise self.err("unbalanced ')'")
        return node

    def parse_alt(self) -> Node:
        branches = [self.parse_seq()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.parse_seq())
        return branches[0] if len(branches) == 1 else _AltRaw(branches)

    def parse_seq(self) -> Node:
        items: list[Node] = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            atom = self.parse_atom()
            atom = self.parse_quant(atom)
            self.budget.spend(2)  # the raw node and its IR node
            items.append(atom)
        return _SeqRaw(items)

    def parse_quant(self, atom: Node) -> Node:
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.i += 1
            elif c == "{":
                q = self._try_brace()
                if q is None:
                    return atom
                lo, hi = q
            else:
                return atom
            if isinstance(atom, _Anchor):
                raise self.err("quantifier on an anchor")
            if self.peek() == "?":
                self.i += 1  # lazy quantifiers match the same language
            elif self.peek() == "+":
                raise self.err("possessive quantifiers are not supported")
            atom = Repeat(atom, lo, hi)

    def _try_brace(self) -> tuple[int, int | None] | None:
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1 : j]
        parts = body.split(",")
        if len(parts) > 2 or not all(x.strip().isdigit() or x.strip() == "" for x in parts):
            return None
        if len(parts) == 1:
            if not parts[0].isdigit():
                return None
            lo = hi = int(parts[0])
        else:
            lo = int(parts[0]) if parts[0] else 0
            hi = int(parts[1]) if parts[1] else None
        if hi is not None and hi < lo:
            raise self.err(f"bad repeat {{{body}}}: max < min")
        if lo > MAX_REPEAT or (hi is not None and hi > MAX_REPEAT):
            raise self.err(f"repeat count {{{body}}} is too large (limit {MAX_REPEAT})")
        self.i = j + 1
        return lo, hi

    def parse_atom(self) -> Node:
        c = self.p[self.i]
        if c == "(":
            return self.parse_group()
        if c == "[":
            return self.parse_class()
        if c == ".":
            self.i += 1
            return _dot(self.dialect)
        if c == "^":
            self.i += 1
            return _Anchor("^")
        if c == "$":
            self.i += 1
            return _Anchor("$")
        if c == "\\":
            return self.parse_escape(in_class=False)
        if c in "*+?":
            raise self.err(f"nothing to repeat before {c!r}")
        self.i += 1
        return Chars(((ord(c), ord(c)),))

    def parse_group(self) -> Node:
        self.i += 1
        if self.p.startswith("?", self.i):
            rest = self.p[self.i :]
            if rest.startswith("?:"):
                self.i += 2
            elif rest.startswith("?P<") or (rest.startswith("?<") and not rest.startswith(("?<=", "?<!"))):
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.err("unterminated group name")
                self.i = j + 1
            elif rest.startswith("?#"):
                j = self.p.find(")", self.i)
                if j < 0:
                    raise self.err("unterminated comment")
                self.i = j + 1
                return EMPTY
            elif rest.startswith(("?=", "?!", "?<=", "?<!")):
                raise self.err("lookaround assertions are not supported (not regular)")
            elif rest.startswith("?P="):
                raise self.err("backreferences are not supported (not regular)")
            elif rest.startswith("?("):
                raise self.err("conditional groups are not supported")
            else:
                raise self.err("inline flags and other group extensions are not supported")
        node = self.parse_alt()
        if self.peek() != ")":
            raise self.err("missing ')'")
        self.i += 1
        return _Group(node)

    def parse_escape(self, in_class: bool):
        self.i += 1
        if self.i >= len(self.p):
            raise self.err("trailing backslash")
        c = self.p[self.i]
        self.i += 1
        if c in "dw" and self.dialect == "json-schema" and not in_class:
            return Chars(norm(ASCII_DIGIT if c == "d" else ASCII_WORD))  # Python's reading includes ECMA's
        if c in "dwsDWS":
            ecma, py = shorthand(c, self.dialect)
            return _Shorthand(ecma, py) if in_class else Chars(_both(c, self.dialect))
        if c in SIMPLE_ESC and not (c == "0" and self.peek() is not None and self.peek().isdigit()):
            v = SIMPLE_ESC[c]
            return Chars(((v, v),))
        if c == "b":
            if in_class:
                return Chars(((8, 8),))
            raise self.err("word boundary \\b is not supported")
        if c in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[c]
            h = self.p[self.i : self.i + n]
            if len(h) != n or any(ch not in "0123456789abcdefABCDEF" for ch in h):
                raise self.err(f"bad \\{c} escape")
            self.i += n
            v = int(h, 16)
            if v > MAX_CP:
                raise self.err("code point out of range")
            return Chars(((v, v),))
        if c in "AZ" and not in_class:
            return _Anchor("^" if c == "A" else "Z")
        if c.isdigit():
            raise self.err("backreferences are not supported (not regular)")
        if c.isalpha() and c.isascii():
            raise self.err(f"unsupported escape \\{c}")
        return Chars(((ord(c), ord(c)),))

    def parse_class(self) -> Node:
        """A character class. Its ranges depend on nothing but its text and the dialect, and classes with \\w or
        \\d read in Python's way sort hundreds of ranges (about 1 ms): each is read once per process (CLASSES)."""
        start = self.i
        end = _class_end(self.p, start)
        if end is not None:
            rs = CLASSES.get((self.dialect, self.p[start:end]))
            if rs is not None:
                self.i = end
                self.budget.spend(len(rs))
                return Chars(rs)
        rs = self._parse_class()
        if len(CLASSES) >= CLASSES_MAX:
            CLASSES.clear()
        CLASSES[(self.dialect, self.p[start : self.i])] = rs
        return Chars(rs)

    def _parse_class(self) -> tuple:
        self.i += 1
        negate = False
        if self.peek() == "^":
            negate = True
            self.i += 1
        ranges: list[
            tuple[int, int]
        ] = []  # the class as ECMA-262 reads it (in the python dialect: as Python)
        other: list[tuple[int, int]] = []  # ... and as Python reads it
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.err("unterminated character class")
            c = self.p[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self._class_atom()
            if isinstance(lo, _Shorthand):
                ranges.extend(lo.ranges)
                other.extend(lo.other)
                continue
            if isinstance(lo, Chars):
                lo_v = lo.ranges[0][0]
            else:
                lo_v = lo
            if self.peek() == "-" and self.i + 1 < len(self.p) and self.p[self.i + 1] != "]":
                self.i += 1
                hi = self._class_atom()
                if isinstance(hi, _Shorthand):
                    raise self.err("bad character range")
                if isinstance(hi, Chars):
                    hi_v = hi.ranges[0][0]
                else:
                    hi_v = hi
                if hi_v < lo_v:
                    raise self.err("bad character range (end before start)")
                ranges.append((lo_v, hi_v))
                other.append((lo_v, hi_v))
            else:
                ranges.append((lo_v, lo_v))
                other.append((lo_v, lo_v))
        # What both readings accept: a negated class refuses what either includes.
        rs = complement(norm(ranges + other)) if negate else intersect(norm(ranges), norm(other))
        if not rs:
            raise self.err("empty character class")
        self.budget.spend(len(rs))  # a range each, and each is lowered to edges
        return rs

    def _class_atom(self):
        c = self.p[self.i]
        if c == "\\":
            return self.parse_escape(in_class=True)
        if c == "[" and self.p.startswith("[:", self.i):
            raise self.err("POSIX classes are not supported")
        self.i += 1
        return ord(c)


class _SeqRaw(Node):
    __slots__ = ("items",)

    def __init__(self, items: list[Node]) -> None:
        self.items = items


class _AltRaw(Node):
    __slots__ = ("items",)

    def __init__(self, items: list[Node]) -> None:
        self.items = items


class _Group(Node):
    __slots__ = ("item",)

    def __init__(self, item: Node) -> None:
        self.item = item


def _finish(node: Node, err) -> Node:
    """Convert raw parse nodes to IR; anchors must already have been removed."""
    if isinstance(node, _SeqRaw):
        return seq(*[_finish(x, err) for x in node.items]) if node.items else EMPTY
    if isinstance(node, _AltRaw):
        return alt(*[_finish(x, err) for x in node.items])
    if isinstance(node, _Group):
        return _finish(node.item, err)
    if isinstance(node, Repeat):
        return Repeat(_finish(node.item, err), node.min, node.max)
    if isinstance(node, _Anchor):
        raise err("anchors (^, $, \\A, \\Z) are only supported at the start or end of the pattern")
    return node


def _branches(node: Node) -> list[Node]:
    while isinstance(node, _Group):
        node = node.item
    if isinstance(node, _AltRaw):
        return node.items
    return [node]


def _strip_anchors(branch: Node) -> tuple[Node, bool, str | bool]:
    """Remove a leading ^ and trailing $ of one top-level branch; report which were present (the end anchor as
    "$" or "Z" for \\Z, False for none)."""
    while isinstance(branch, _Group) and not isinstance(branch.item, _AltRaw):
        branch = branch.item
    if not isinstance(branch, _SeqRaw):
        if isinstance(branch, _Anchor):
            return _SeqRaw([]), branch.kind == "^", branch.kind if branch.kind in "$Z" else False
        return branch, False, False
    items = list(branch.items)
    start = end = False
    while items and isinstance(items[0], _Anchor) and items[0].kind == "^":
        items.pop(0)
        start = True
    while items and isinstance(items[-1], _Anchor) and items[-1].kind in "$Z":
        kind = items.pop().kind
        end = "Z" if "Z" in (kind, end) else "$"  # with \Z among them, the match ends at the very end
    if len(items) == 1 and isinstance(items[0], _Group):
        inner, s2, e2 = (
            _strip_anchors(items[0].item)
            if not isinstance(items[0].item, _AltRaw)
            else (items[0], False, False)
        )
        return inner, start or s2, end or e2
    return _SeqRaw(items), start, end


def parse_regex(
    pattern: str,
    search: bool = False,
    where: str = "regex",
    dialect: str = "python",
    python_dollar: bool = True,
) -> Node:
    """Parse `pattern`; with `search` the language is every string containing a match (JSON Schema). See the
    module's note for the dialects. With `python_dollar` False, a python-dialect `$` matches at the end only,
    as ECMA-262's does (schema_strings compares readings with it)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"{where}: regex must be a string, got {type(pattern).__name__}")
    if dialect not in DIALECTS:
        raise ValueError(f"unknown regex dialect {dialect!r}")
    if len(pattern) <= PARSED_MAX_LENGTH:
        try:
            return _parsed(pattern, search, dialect, python_dollar)
        except GrammarError:
            pass  # not kept: parsed again below, for the error message naming `where`
    return _parse(pattern, search, where, dialect, python_dollar)


# Parsed patterns kept for the process (the IR is immutable, so one node serves every grammar that uses it):
# schemas repeat the same patterns and formats in many properties, and across the schemas a server sees.
PARSED_MAX_LENGTH = 2000
PARSED_KEPT = 256


@functools.lru_cache(maxsize=PARSED_KEPT)
def _parsed(pattern: str, search: bool, dialect: str, python_dollar: bool) -> Node:
    return _parse(pattern, search, "regex", dialect, python_dollar)


def clear_caches() -> None:
    """Forget the parsed patterns and character classes kept for the process (a benchmark's cold compile)."""
    _parsed.cache_clear()
    CLASSES.clear()


def _parse(pattern: str, search: bool, where: str, dialect: str, python_dollar: bool) -> Node:
    parser = _Parser(pattern, where, dialect)
    raw = parser.parse()
    err = parser.err
    anyc = Repeat(Chars(ANY), 0, None)
    out = []
    # Python's `$` also matches before a newline that ends the string: re.search("^a$", "a\n") finds "a".
    # ECMA-262's (without the m flag) matches at the end only, as \Z does in Python.
    newline_end = opt(Chars(((10, 10),))) if search and dialect == "python" and python_dollar else EMPTY
    for br in _branches(raw):
        body, s, e = _strip_anchors(br)
        node = _finish(body, err)
        if search:
            node = seq(EMPTY if s else anyc, node, anyc if not e else newline_end if e == "$" else EMPTY)
        out.append(node)
    if len(out) == 1:
        return out[0]
    return alt(*out)

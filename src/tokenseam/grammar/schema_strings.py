"""JSON Schema strings lowered to the grammar IR: the string body (JSON escapes included), `pattern`, the
`format`s that have a pattern, `minLength`/`maxLength`, and the patternProperties key automata."""

from __future__ import annotations

import functools

from . import cpauto
from .errors import GrammarError
from .ir import (
    NOTHING,
    Auto,
    Chars,
    Escaped,
    Node,
    Ref,
    Repeat,
    alt,
    cls,
    largest_repeat,
    lit,
    norm,
    seq,
)
from .library import library_rule
from .nfa import COUNTER_THRESHOLD
from .regex import parse_regex
from .schema_safety import searcher

HEX = cls("0-9a-fA-F")


_YEAR = r"(000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"
_LEAP = r"(\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
# Exact calendar dates (month lengths and leap years), as validators that assert `format` check them.
_DATE = (
    _YEAR
    + r"-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|"
    + _YEAR
    + r"-(0[469]|11)-(0[1-9]|[12]\d|30)|"
    + _YEAR
    + r"-02-(0[1-9]|1\d|2[0-8])|"
    + _LEAP
    + r"-02-29"
)
_TIME = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"

FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "duration": r"P(\d+W|(\d+Y(\d+M)?(\d+D)?|\d+M(\d+D)?|\d+D)(T(\d+H(\d+M)?(\d+S)?|\d+M(\d+S)?|\d+S))?"
    r"|T(\d+H(\d+M)?(\d+S)?|\d+M(\d+S)?|\d+S))",
    "email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
    "hostname": r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
    "ipv4": r"(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}",
    "ipv6": r"([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:|"
    r"([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}|"
    r"([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}|"
    r"([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}|"
    r":((:[0-9a-fA-F]{1,4}){1,7}|:)",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:([A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*",
    # A URI, or a relative reference: its first path segment holds no ":" (RFC 3986 path-noscheme), so it
    # cannot be read as a scheme.
    "uri-reference": r"[A-Za-z][A-Za-z0-9+.-]*:([A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*"
    r"|([A-Za-z0-9\-._~@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*([/?#]([A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)?",
    "json-pointer": r"(/([^~/]|~[01])*)*",
    "relative-json-pointer": r"(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
# Formats the specification defines (validators may assert them): one we cannot express is an error.
STANDARD_FORMATS = {
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
}
FORMATS["date-time"] = "(" + _DATE + ")[Tt]" + _TIME


_HEX4 = alt(seq(cls("0-9a-cA-Ce-fE-F"), HEX, HEX, HEX), seq(cls("dD"), cls("0-7"), HEX, HEX))
# One JSON string character, any encoding (no lone surrogates, so each escape is one code point).
JCHAR = alt(
    Chars(norm([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)])),
    seq(lit("\\"), alt(cls('"\\\\/bfnrt'), seq(lit("u"), _HEX4))),
)

# A pattern or format with only maxLength is unrolled (one automaton copy per length) up to this many states;
# beyond it the length is counted at run time (see nfa._Builder.embed_counted).
UNROLL_LIMIT = 1000


@functools.lru_cache(maxsize=64)
def string_body(mn: int, mx: int | None) -> Node:
    """The called rule of a JSON string of mn..mx characters: its body and closing quote. One object per
    length bound in the process, so the byte NFA builder lowers it once (library.py)."""
    return seq(Repeat(JCHAR, mn, mx), lit('"'))


class StringLowering:
    """The `string` type and the pattern automata of the JSON Schema compiler (json_schema._Compiler)."""

    def string_node(self, mn: int, mx: int | None) -> Node:
        """A JSON string of mn..mx characters: its body and closing quote are one shared called rule."""
        name = f"%str{mn}:{'' if mx is None else mx}"
        if name not in self.rules:
            self.rules[name] = library_rule(string_body(mn, mx))
            self.shared.add(name)
        return seq(lit('"'), Ref(name))

    def t_string(self, s, ptr):
        mn = s.get("minLength", 0)
        mx = s.get("maxLength")
        for key, v in (("minLength", mn), ("maxLength", mx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} at {ptr} must be a non-negative integer")
        if mx is not None and mx < mn:
            return NOTHING
        fmt = s.get("format")
        if fmt is not None and fmt not in FORMATS:
            if fmt in STANDARD_FORMATS:
                self.unsupported(f"format {fmt!r}", ptr)
            else:
                self.warnings.append(f"format {fmt!r} at {ptr} is not enforced (annotation only)")
            fmt = None
        pats = s.get("pattern")
        excluded = s.get("_not_strings")
        not_patterns = s.get("_not_pattern", ())
        if pats is None and fmt is None and not excluded and not not_patterns:
            return self.string_node(mn, mx)
        # The same constraints met again (a pattern or format repeated across a schema's properties) are the
        # same node, its regexes parsed and its automata built once.
        try:
            key = (
                tuple(pats) if isinstance(pats, list) else pats,
                fmt,
                mn,
                mx,
                tuple(excluded) if excluded else None,
                tuple(not_patterns),
            )
            node = self.string_autos.get(key)
        except TypeError:  # (an unhashable value: parse_regex names it below)
            key = node = None
        if node is None:
            # A called rule: the byte NFA copies it at each use when small, and calls one copy of a big one used
            # in several places (a long alternation of codes in two properties).
            node = self._as_rule(self.constrained_string(pats, fmt, mn, mx, excluded, not_patterns, ptr))
            if key is not None:
                self.string_autos[key] = node
        return node

    def constrained_string(self, pats, fmt, mn, mx, excluded, not_patterns, ptr) -> Node:
        """t_string with a pattern, a format FORMATS has, or excluded values."""
        regexes = []
        if pats is not None:
            for p in pats if isinstance(pats, list) else [pats]:
                regexes.append(
                    parse_regex(p, search=True, where=f"pattern at {ptr}/pattern", dialect="json-schema")
                )
        if fmt is not None:
            regexes.append(
                parse_regex(FORMATS[fmt], where=f"format {fmt}", dialect="json-schema")
            )  # ASCII \d
        q = lit('"')
        if excluded:
            # Excluding values forces the json.dumps encoding (no escapes but the required ones), so an escape
            # cannot spell one.
            regexes.append(Auto(cpauto.not_words(excluded)))
        for p in not_patterns:
            # `not {pattern: p}`: a string no reading of p matches (either validator would reject a match).
            regexes.append(Auto(self.pattern_dfa(p, ptr, "either", complement=True)))
        if not regexes:  # (`pattern: []`)
            return self.string_node(mn, mx)
        if len(regexes) == 1 and mn == 0 and mx is None:
            return seq(q, Escaped(regexes[0]), q)  # an Auto inside is escaped the same way
        auto = None
        if len(regexes) == 1:
            auto = regexes[0].auto if isinstance(regexes[0], Auto) else cpauto.from_ir(regexes[0])
        else:
            for r in regexes:
                d = r.auto if isinstance(r, Auto) else cpauto.determinize(cpauto.from_ir(r))
                auto = d if auto is None else cpauto.product(auto, d)
        if mx is not None and (mx + 1) * auto.size > UNROLL_LIMIT and mn < mx // 2:
            # An upper bound on a big automaton: counted at run time rather than copied per length. A lower
            # bound well below it is unrolled first (one copy per length up to mn, the last one looping), and
            # the counter then caps the whole string at mx.
            if mn:
                auto = cpauto.count(auto, mn, None)
            if cpauto.is_empty(auto):
                return NOTHING
            d = cpauto.dist_to_final(auto)[auto.start]
            if d is None or d > mx:
                return NOTHING
            return seq(q, Auto(auto, escape=True, limit=mx), q)
        if mn or mx is not None:
            auto = cpauto.count(auto, mn, mx)
        if cpauto.is_empty(auto):
            return NOTHING
        return seq(q, Auto(auto, escape=True), q)

    def _pattern(self, pattern: str, ptr: str) -> dict:
        r"""A patternProperties regex's readings (search semantics), parsed once per pattern since the same
        patterns recur across a schema's objects; their key automata are built when first asked for
        (`pattern_dfa`). A key is matched by a validator reading the regex as ECMA-262 does or by one reading
        it as Python's `re` does, and the readings differ (`.`, `$`, `\d`, `\w`, `\s`): the "ecma" and "python"
        readings are kept apart, and "both", "either" and the complements are filled in when asked."""
        entry = self.pattern_dfas.get(pattern)
        if entry is None:
            where = f"patternProperties at {ptr}"
            readings = [parse_regex(pattern, search=True, dialect=d, where=where) for d in ("ecma", "python")]
            # When the readings differ only in `$` (Python's also matches before a final newline), every key
            # the ECMA reading matches the Python one matches too: "both" is the ECMA reading and "either"
            # the Python one, with no intersection or union to build (`^[a-z_-]{1,255}$`: 256 states each).
            dollar_only = readings[0] == parse_regex(
                pattern, search=True, dialect="python", where=where, python_dollar=False
            )
            entry = self.pattern_dfas[pattern] = {"ir": readings, "dollar_only": dollar_only}
        return entry

    def pattern_ir(self, pattern: str, ptr: str, reading: str) -> Node | None:
        """The IR of the keys `pattern` matches in `reading`, when one parsed reading is that language ("ecma"
        and "python" always, "both" and "either" when the readings differ only in `$`) and it holds a repeat
        the byte automaton counts: a key lowered from it keeps the repeat counted (`^[0-9a-zA-Z_-]{1,255}$`:
        one counter instead of a chain of 256 states) and needs no key automaton. (Other patterns keep their
        automaton: determinised, it is smaller than their IR lowered as it is (`.` searched: `.*..*`).)"""
        entry = self._pattern(pattern, ptr)
        if reading in ("ecma", "python"):
            ir = entry["ir"][reading == "python"]
        elif entry["dollar_only"] and reading in ("both", "either"):
            ir = entry["ir"][reading == "either"]
        else:
            return None
        return ir if largest_repeat(ir) > COUNTER_THRESHOLD else None

    def pattern_dfa(self, pattern: str, ptr: str, reading: str = "both", complement: bool = False):
        """The keys `pattern` matches in the "ecma" reading, the "python" one, "both", "either" or "one" (one
        reading but not the other); with `complement`, the keys it does not match in that reading."""
        entry = self._pattern(pattern, ptr)
        if reading not in entry:
            if reading in ("ecma", "python"):
                entry[reading] = cpauto.determinize(cpauto.from_ir(entry["ir"][reading == "python"]))
            elif entry["dollar_only"] and reading in ("both", "either"):
                entry[reading] = self.pattern_dfa(pattern, ptr, "ecma" if reading == "both" else "python")
            elif reading == "both":
                entry[reading] = cpauto.product(
                    self.pattern_dfa(pattern, ptr, "ecma"), self.pattern_dfa(pattern, ptr, "python")
                )
            elif reading == "either":
                entry[reading] = cpauto.determinize(cpauto.from_ir(alt(*entry["ir"])))
            else:  # one: matched by one reading only
                entry[reading] = cpauto.product(
                    self.pattern_dfa(pattern, ptr, "either"),
                    self.pattern_dfa(pattern, ptr, "both", complement=True),
                )
        if not complement:
            return entry[reading]
        key = "not " + reading
        if key not in entry:
            entry[key] = cpauto.complement(entry[reading])
        return entry[key]

    def keys_outside(self, patterns: list[str], words: list[str], ptr: str):
        """The keys none of `patterns` matches in either reading and that are none of `words`: their union as
        one automaton, complemented once. (Intersecting "none of the words" with each pattern's complement in
        turn builds a product per pattern, each over the states of the ones before.)"""
        matched = [Auto(self.pattern_dfa(p, ptr, "either")) for p in patterns]
        return cpauto.compact(
            cpauto.complement(cpauto.determinize(cpauto.from_ir(alt(*matched, *map(lit, words)))))
        )

    def pattern_words(self, pattern: str, ptr: str) -> list[str] | None:
        """The keys a patternProperties regex matches in either reading, if it matches only a word w (and
        w followed by a newline, which Python's `$` also matches): `^client_id$`, common in generated schemas."""
        entry = self._pattern(pattern, ptr)
        if "words" not in entry:
            words = None
            w = cpauto.single_word(self.pattern_dfa(pattern, ptr, "ecma"))
            if w is not None:
                either = self.pattern_dfa(pattern, ptr, "either")
                cands = [x for x in (w, w + "\n") if cpauto.accepts(either, x)]
                if cpauto.is_empty(cpauto.product(either, cpauto.not_words(cands))):
                    words = cands
            entry["words"] = words
        return entry["words"]

    def pattern_matches(self, pattern: str, ptr: str, name: str, python) -> bool:
        """Whether a declared property name is matched by `pattern` in either reading (`python`: its
        linear-time Python searcher)."""
        return python.accepts(name) or cpauto.accepts(self.pattern_dfa(pattern, ptr, "ecma"), name)

    def key_matches(self, pattern: str, ptr: str, name: str, reading: str) -> bool:
        """Whether a patternProperties regex matches the key `name` in one reading ("python" or "ecma")."""
        if reading == "python":
            return searcher(pattern, f"patternProperties at {ptr}").accepts(name)
        return cpauto.accepts(self.pattern_dfa(pattern, ptr, "ecma"), name)

    def patterns_overlap(self, p: str, q: str, ptr: str) -> bool:
        """Whether some key matches both patternProperties regexes (each in either reading)."""
        hit = self.pattern_overlaps.get((p, q))
        if hit is None:
            wp, wq = self.pattern_words(p, ptr), self.pattern_words(q, ptr)
            if wp is not None:
                hit = any(cpauto.accepts(self.pattern_dfa(q, ptr, "either"), w) for w in wp)
            elif wq is not None:
                hit = any(cpauto.accepts(self.pattern_dfa(p, ptr, "either"), w) for w in wq)
            else:
                hit = not cpauto.is_empty(
                    cpauto.product(self.pattern_dfa(p, ptr, "either"), self.pattern_dfa(q, ptr, "either"))
                )
            self.pattern_overlaps[(p, q)] = hit
        return hit

"""JSON Schema front end (draft 2020-12 and draft-07 keywords) lowered to the grammar IR, exactly or not at all.

Declared properties are generated in schema order, then additional/pattern properties; unsupported -> error.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal, InvalidOperation
from urllib.parse import unquote

from . import cpauto
from .budget import compile_budget, current
from .errors import GrammarError
from .ir import (
    ANY_RANGES,
    EMPTY,
    LAYOUT,
    LAYOUT_NO_INDENT,
    NOTHING,
    Auto,
    Chars,
    Escaped,
    Grammar,
    Members,
    Node,
    Ref,
    Repeat,
    alt,
    chars,
    cls,
    lit,
    norm,
    opt,
    seq,
    star,
)
from .regex import parse_regex
from .schema_safety import EnumValidator, check_keywords, refused_uri, searcher

ANNOTATIONS = {
    "$schema", "$id", "id", "$comment", "$anchor", "$vocabulary", "title", "description", "default", "examples",
    "example", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema",
    "$defs", "definitions", "nullable", "discriminator", "xml", "externalDocs", "markdownDescription",
    "errorMessage", "$dynamicAnchor", "$recursiveAnchor",
}
SUPPORTED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "format", "minLength",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
    "maxProperties", "patternProperties", "uniqueItems",
}
UNSUPPORTED = {
    "not", "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
}
TYPES = ("null", "boolean", "object", "array", "number", "string")
MAX_ENUM = 2000

HEX = cls("0-9a-fA-F")
DIG = cls("0-9")
DIG19 = cls("1-9")

_YEAR = r"(000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})"
_LEAP = r"(\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
# Exact calendar dates (month lengths and leap years), as validators that assert `format` check them.
_DATE = (_YEAR + r"-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|" + _YEAR + r"-(0[469]|11)-(0[1-9]|[12]\d|30)|"
         + _YEAR + r"-02-(0[1-9]|1\d|2[0-8])|" + _LEAP + r"-02-29")
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
    "json-pointer": r"(/([^~/]|~[01])*)*",
    "relative-json-pointer": r"(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
}
# Formats the specification defines (validators may assert them): one we cannot express is an error.
STANDARD_FORMATS = {"date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
                    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
                    "json-pointer", "relative-json-pointer", "regex"}
FORMATS["date-time"] = "(" + _DATE + ")[Tt]" + _TIME


def _pointer_escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _int_bound(x, lower: bool, exclusive: bool) -> int:
    d = Decimal(str(x))
    if lower:
        return math.floor(d) + 1 if exclusive else math.ceil(d)
    return math.ceil(d) - 1 if exclusive else math.floor(d)


def _digits_range(lo: str, hi: str) -> Node:
    """Digit strings of equal length between lo and hi (inclusive)."""
    if not lo:
        return EMPTY
    n = len(lo) - 1
    if lo[0] == hi[0]:
        return seq(lit(lo[0]), _digits_range(lo[1:], hi[1:]))
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return seq(cls(f"{lo[0]}-{hi[0]}"), Repeat(DIG, n, n)) if n else cls(f"{lo[0]}-{hi[0]}")
    parts = [seq(lit(lo[0]), _digits_range(lo[1:], "9" * n))]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        parts.append(seq(cls(f"{a}-{b}"), Repeat(DIG, n, n)))
    parts.append(seq(lit(hi[0]), _digits_range("0" * n, hi[1:])))
    return alt(*parts)


def _nonneg_range(a: int, b: int | None) -> Node:
    """Canonical decimal integers in [a, b] (a >= 0, b None = unbounded)."""
    if b is not None and b < a:
        return NOTHING
    la = len(str(a))
    parts = []
    last = la if b is None else len(str(b))
    if b is not None and last > 40:
        b, last = None, la
    for L in range(la, last + 1):
        lo = max(a, 10 ** (L - 1) if L > 1 else 0)
        hi = 10**L - 1 if b is None else min(b, 10**L - 1)
        if lo <= hi:
            parts.append(_digits_range(str(lo), str(hi)))
    if b is None:
        parts.append(seq(DIG19, Repeat(DIG, la, None)))
    return alt(*parts) if parts else NOTHING


def int_range(lo: int | None, hi: int | None) -> Node:
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        parts.append(seq(lit("-"), _nonneg_range(-top, None if lo is None else -lo)))
    return alt(*parts) if parts else NOTHING


INT = seq(opt(lit("-")), alt(lit("0"), seq(DIG19, star(DIG))))
FRAC = seq(lit("."), Repeat(DIG, 1, None))
EXP = seq(cls("eE"), opt(cls("+-")), Repeat(DIG, 1, None))
NUMBER = seq(INT, opt(FRAC), opt(EXP))
NONZERO_FRAC = seq(lit("."), star(DIG), DIG19, star(DIG))
ZERO_FRAC = seq(lit("."), Repeat(lit("0"), 1, None))

_HEX4 = alt(seq(cls("0-9a-cA-Ce-fE-F"), HEX, HEX, HEX), seq(cls("dD"), cls("0-7"), HEX, HEX))
# One JSON string character, any encoding (no lone surrogates, so each escape is one code point).
JCHAR = alt(
    Chars(norm([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)])),
    seq(lit("\\"), alt(cls('"\\\\/bfnrt'), seq(lit("u"), _HEX4))),
)


def _frac_digits(x: Decimal) -> str:
    """Digits after the point of a non-negative decimal, without trailing zeros."""
    t = format(x - math.floor(x), "f")
    return t.split(".")[1].rstrip("0") if "." in t else ""


def _ge_digits(f: str, strict: bool) -> Node:
    """Non-empty digit strings d with 0.d >= 0.f (> when strict)."""
    if not f:
        return seq(star(DIG), DIG19, star(DIG)) if strict else Repeat(DIG, 1, None)
    return _rest_ge(f, strict)


def _rest_ge(g: str, strict: bool) -> Node:
    if not g:
        return seq(star(DIG), DIG19, star(DIG)) if strict else star(DIG)
    d = int(g[0])
    options = [seq(lit(g[0]), _rest_ge(g[1:], strict))]
    if d < 9:
        options.append(seq(cls(f"{d + 1}-9"), star(DIG)))
    return alt(*options)


def _le_digits(f: str, strict: bool, first: bool = True) -> Node:
    """Non-empty digit strings d with 0.d <= 0.f (< when strict)."""
    if not f:
        if first:
            return NOTHING if strict else Repeat(lit("0"), 1, None)
        return NOTHING if strict else star(lit("0"))
    d = int(f[0])
    options = [seq(lit(f[0]), _le_digits(f[1:], strict, False))]
    if d > 0:
        options.append(seq(cls(f"0-{d - 1}"), star(DIG)))
    if not first:
        options.append(EMPTY)  # a proper prefix of f (which ends in a non-zero digit) is smaller
    return alt(*options)


def _decimal_range(lo: Decimal, lo_ex: bool, hi: Decimal | None, hi_ex: bool) -> Node:
    """Non-negative decimals (canonical integer part, optional fraction, no exponent) in the range."""
    lo_n, lo_f = math.floor(lo), _frac_digits(lo)
    hi_n = None if hi is None else math.floor(hi)
    hi_f = "" if hi is None else _frac_digits(hi)
    dot = lit(".")
    parts = []
    mid_hi = None if hi_n is None else hi_n - 1
    if mid_hi is None or mid_hi >= lo_n + 1:
        parts.append(seq(_nonneg_range(lo_n + 1, mid_hi), opt(seq(dot, Repeat(DIG, 1, None)))))
    low_int_ok = lo_f == "" and not lo_ex
    if hi_n is None or hi_n > lo_n:
        low = [seq(dot, _ge_digits(lo_f, lo_ex))]
        if low_int_ok:
            low.append(EMPTY)
        parts.append(seq(lit(str(lo_n)), alt(*low)))
        if hi_n is not None:
            high = [seq(dot, _le_digits(hi_f, hi_ex))]
            if not (hi_f == "" and hi_ex):
                high.append(EMPTY)
            parts.append(seq(lit(str(hi_n)), alt(*high)))
    else:
        both = cpauto.product(cpauto.determinize(cpauto.from_ir(_ge_digits(lo_f, lo_ex))),
                              cpauto.determinize(cpauto.from_ir(_le_digits(hi_f, hi_ex))))
        opts = [] if cpauto.is_empty(both) else [seq(dot, Auto(both))]
        if low_int_ok and not (hi_f == "" and hi_ex):
            opts.append(EMPTY)
        if opts:
            parts.append(seq(lit(str(lo_n)), alt(*opts)))
    return alt(*parts) if parts else NOTHING


def _sig_digits_dfa(limit: int) -> cpauto.CPNFA:
    """Number spellings ('-', digits, '.') with at most `limit` significant digits."""
    d = cpauto.CPNFA()
    lead = d.add()  # before the first non-zero digit
    counts = [d.add() for _ in range(limit + 1)]
    for q in [lead, *counts]:
        d.finals.add(q)
        d.edges[q].append((ord("-"), ord("."), q))  # '-' (0x2D) and '.' (0x2E); '/' never occurs in numbers
    d.edges[lead].append((ord("0"), ord("0"), lead))
    d.edges[lead].append((ord("1"), ord("9"), counts[1]))
    for k in range(1, limit):
        d.edges[counts[k]].append((ord("0"), ord("9"), counts[k + 1]))
    for q in range(d.size):
        d.edges[q].sort()
    d.start = lead
    return d


_SIG15 = _sig_digits_dfa(15)
# A pattern or format with only maxLength is unrolled (one automaton copy per length) up to this many states;
# beyond it the length is counted at run time (see nfa._Builder.embed_counted).
UNROLL_LIMIT = 1000
MAX_WS = 1000  # the largest max_ws option (longest run of spaces/tabs after a newline)


def _mod_dfa(k: int) -> cpauto.CPNFA:
    """Canonical integers divisible by k (digits read left to right, residue as the state)."""
    d = cpauto.CPNFA()
    start, neg, zero = d.add(), d.add(), d.add()
    res = [d.add() for _ in range(k)]
    d.edges[start].append((ord("-"), ord("-"), neg))
    d.edges[start].append((ord("0"), ord("0"), zero))
    for src in (start, neg):
        for dig in range(1, 10):
            d.edges[src].append((48 + dig, 48 + dig, res[dig % k]))
    for r in range(k):
        for dig in range(10):
            d.edges[res[r]].append((48 + dig, 48 + dig, res[(10 * r + dig) % k]))
    d.finals = {zero, res[0]}
    d.start = start
    return d


class _Compiler:
    def __init__(self, root, strict: bool, lenient: bool, compact: bool, max_ws: int) -> None:
        self.root = root
        self.strict = strict
        self.lenient = lenient
        self.warnings: list[str] = []
        self.rules: dict[str, Node] = {}
        self.ref_rules: dict[str, str] = {}
        self.merge_rules: dict[str, str] = {}
        if compact:
            self.ws = EMPTY
        else:
            # After a newline the indentation is unbounded here; the automaton caps it at max_ws
            # (Grammar.indent_limit), which keeps one automaton state per run instead of one per column.
            self.ws = LAYOUT if max_ws else LAYOUT_NO_INDENT
        self.indent_limit = max_ws if not compact and max_ws else None
        self.shared: set[str] = set()
        self.extra_rules = 0
        self.number_autos: dict[tuple, Node] = {}
        self.merge_inputs: dict[str, str] = {}
        self.pattern_dfas: dict[str, dict] = {}
        self.pattern_overlaps: dict[tuple[str, str], bool] = {}
        self.sep = seq(self.ws, lit(","), self.ws)
        self.colon = seq(self.ws, lit(":"), self.ws)
        self._validator: EnumValidator | None = None
        self.budget = current()
        self.scratch = 0  # budget units of memo keys and validator views, freed with this compiler
        self._depth = 0
        self._any_rule = None

    # -- helpers -----------------------------------------------------------------------------------------
    def hold(self, n: int) -> None:
        """Spend n units on data that lives only as long as this compiler (memo keys)."""
        self.scratch += n
        self.budget.spend(n)

    def unsupported(self, what: str, ptr: str) -> None:
        msg = f"unsupported JSON Schema {what} at {ptr or '#'}"
        if self.lenient:
            self.warnings.append(msg + " (ignored: lenient)")
        else:
            raise GrammarError(msg + "; pass lenient=True to ignore it")

    def resolve(self, ref: str, ptr: str):
        if not isinstance(ref, str):
            raise GrammarError(f"$ref at {ptr} must be a string")
        if not ref.startswith("#"):
            raise GrammarError(f"unsupported $ref {ref!r} at {ptr}: only local references ('#/...') are supported")
        node = self.root
        path = ref[1:]
        if path and not path.startswith("/"):
            raise GrammarError(f"unsupported $ref {ref!r} at {ptr}: anchors are not supported")
        for part in path.split("/")[1:] if path else []:
            part = unquote(part.replace("~1", "/").replace("~0", "~"))
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise GrammarError(f"$ref {ref!r} at {ptr} does not resolve")
        return node

    def any_value(self) -> Node:
        if self._any_rule is None:
            self._any_rule = "any"
            ws = self.ws
            v = Ref("any")
            string = self.string_node(0, None)
            obj = seq(lit("{"), ws, opt(seq(string, self.colon, v, star(seq(self.sep, string, self.colon, v)))),
                      ws, lit("}"))
            arr = seq(lit("["), ws, opt(seq(v, star(seq(self.sep, v)))), ws, lit("]"))
            self.rules["any"] = alt(obj, arr, string, NUMBER, lit("true"), lit("false"), lit("null"))
        return Ref("any")

    def validator(self) -> EnumValidator:
        if self._validator is None:
            self._validator = EnumValidator(self.root)
        return self._validator

    def valid_values(self, values: list, schema, ptr: str = "") -> list:
        """The values that `schema` accepts (one validator for them all: an enum may hold thousands)."""
        b = self.budget
        stage, b.stage = b.stage, "checking enum/const values against their schema"
        try:
            return self.validator().accepted(values, schema)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - jsonschema raises many types for odd schemas
            uri = refused_uri(exc)
            if uri is not None:
                raise GrammarError(f"$ref to {uri!r} (met while checking enum/const values at {ptr or '#'}) is "
                                   "not resolved: only references inside the document are, and nothing is "
                                   "fetched over the network or read from files") from None
            raise GrammarError(f"cannot evaluate enum/const against the schema: {exc}") from exc
        finally:
            b.stage = stage

    # -- schema -> IR ------------------------------------------------------------------------------------
    def compile(self, s, ptr: str) -> Node:
        b = self.budget
        b.spend(2)  # the IR nodes this call builds around its parts
        where, b.where = b.where, ptr or "#"
        self._depth += 1
        try:
            if self._depth > 60:
                raise GrammarError(f"schema nesting too deep at {ptr}")
            return self._compile(s, ptr)
        finally:
            self._depth -= 1
            b.where = where

    def _compile(self, s, ptr: str) -> Node:
        if s is True:
            return self.any_value()
        if s is False:
            return NOTHING
        if not isinstance(s, dict):
            raise GrammarError(f"schema at {ptr or '#'} must be an object or boolean, got {type(s).__name__}")
        for k in s:
            if k in UNSUPPORTED:
                if k == "propertyNames" and s[k] in (True, {}):
                    continue
                if k == "not":
                    continue
                self.unsupported(f"keyword {k!r}", ptr)
        if "not" in s:
            return self.negation(s, ptr)
        if s.get("uniqueItems") is True:
            self.unsupported("keyword 'uniqueItems'", ptr)
        if "$ref" in s:
            ref = s["$ref"]
            rest = {k: v for k, v in s.items() if k not in ANNOTATIONS and k != "$ref"}
            if not rest:
                return self.ref(ref, ptr)
            return self.compile({"allOf": [{"$ref": ref}, rest]}, ptr)
        if "allOf" in s:
            subs = s["allOf"]
            rest = [k for k in s if k != "allOf" and k not in ANNOTATIONS]
            if isinstance(subs, list) and len(subs) == 1 and not rest:
                return self.compile(subs[0], f"{ptr}/allOf/0")
            # The same allOf met again (a copy of the same oneOf in many properties) is the same rule: its
            # unmerged text is the key, which is small next to the merged schema (references are
            # root-relative, so the text alone decides the result).
            try:
                ikey = json.dumps(s, sort_keys=True)
            except (TypeError, ValueError):
                ikey = None
            else:
                self.budget.tick(1 + len(ikey) // 64)
            seen = self.merge_inputs.get(ikey) if ikey is not None else None
            if seen is not None:
                return Ref(seen)
            merged = self.merge_all(s, ptr)
            # A merged schema seen before becomes a shared rule, so recursion through allOf/$ref terminates.
            try:
                key = json.dumps(merged, sort_keys=True)
            except (TypeError, ValueError):
                key = None
            else:
                self.budget.tick(1 + len(key) // 64)
            if key is not None:
                name = self.merge_rules.get(key)
                fresh = name is None
                if fresh:
                    name = self.merge_rules[key] = f"all{len(self.merge_rules)}"
                    self.hold(1 + len(key) // 64)  # kept as a memo key
                if ikey is not None:
                    self.merge_inputs[ikey] = name
                    self.hold(1 + len(ikey) // 64)
                if fresh:
                    self.rules[name] = NOTHING
                    self.rules[name] = self.compile(merged, ptr)
                return Ref(name)
            return self.compile(merged, ptr)
        for key in ("anyOf", "oneOf"):
            if key in s:
                branches = s[key]
                if not isinstance(branches, list) or not branches:
                    raise GrammarError(f"{key} at {ptr} must be a non-empty array")
                rest = {k: v for k, v in s.items() if k != key}
                has_rest = any(k not in ANNOTATIONS for k in rest)
                subs = []
                for i, b in enumerate(branches):
                    bp = f"{ptr}/{key}/{i}"
                    if has_rest:
                        b = {"allOf": [rest, b]}
                    subs.append((b, bp))
                self.budget.spend(len(subs))
                if key == "oneOf" and len(subs) > 1:
                    subs = self.exclusive_branches(subs, ptr)
                return alt(*[self.compile(b, bp) for b, bp in subs])
        if "const" in s or "enum" in s:
            return self.enum(s, ptr)
        types = s.get("type")
        if types is None:
            tlist = list(TYPES)
        elif isinstance(types, str):
            tlist = [types]
        elif isinstance(types, list) and all(isinstance(t, str) for t in types):
            tlist = list(types)
        else:
            raise GrammarError(f"'type' at {ptr} must be a string or an array of strings")
        for t in tlist:
            if t not in TYPES and t not in ("integer", "__none__"):
                raise GrammarError(f"unknown type {t!r} at {ptr}/type")
        if "number" in tlist and "integer" in tlist:
            tlist.remove("integer")
        parts = []
        for t in tlist:
            parts.append(getattr(self, "t_" + t)(s, ptr))
        return alt(*parts)

    def negation(self, s: dict, ptr: str) -> Node:
        """`not` in the forms that have an exact (or subset) positive rewrite; others are unsupported."""
        n = self.deref(s["not"], f"{ptr}/not")
        rest = {k: v for k, v in s.items() if k != "not"}
        if n is False:
            return self.compile(rest, ptr)
        if n is True:
            return NOTHING
        if isinstance(n, dict):
            keys = {k for k in n if k not in ANNOTATIONS}
            if not keys:
                return NOTHING
            if keys == {"type"}:
                t = n["type"]
                excl = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
                cur = rest.get("type", list(TYPES))
                cur = [cur] if isinstance(cur, str) else list(cur)
                # "not integer" over "number" would need non-integral numbers only: not representable here.
                if excl is not None and not ("integer" in excl and "number" not in excl and "number" in cur):
                    keep = [x for x in cur if x not in excl and not (x == "integer" and "number" in excl)]
                    return self.compile({**rest, "type": keep or ["__none__"]}, ptr)
            if keys == {"required"} and isinstance(n["required"], list) and n["required"]:
                # not(required: K) = an object missing at least one key of K (non-objects satisfy `required`).
                absent = {"anyOf": [{"properties": {k: False}} for k in n["required"]]}
                return self.compile({"allOf": [rest, {"type": "object"}, absent]}, ptr)
            if keys <= {"enum", "const"}:
                vals = [n["const"]] if "const" in n else n.get("enum")
                if isinstance(vals, list) and vals and all(isinstance(v, str) for v in vals):
                    excl = list(rest.get("_not_strings", [])) + vals
                    return self.compile({**rest, "_not_strings": excl}, ptr)
        self.unsupported("keyword 'not' (only not with type, required or string enum/const is supported)", ptr)
        return self.compile(rest, ptr)

    def ref(self, ref: str, ptr: str) -> Node:
        name = self.ref_rules.get(ref)
        if name is None:
            name = f"ref{len(self.ref_rules)}"
            self.ref_rules[ref] = name
            target = self.resolve(ref, ptr)
            self.rules[name] = NOTHING
            self.rules[name] = self.compile(target, ref)
        return Ref(name)

    def deref(self, s, ptr: str, depth: int = 0):
        while isinstance(s, dict) and "$ref" in s:
            if depth > 50:
                raise GrammarError(f"$ref cycle without progress at {ptr}")
            target = self.resolve(s["$ref"], ptr)
            rest = {k: v for k, v in s.items() if k != "$ref"}
            if rest and any(k not in ANNOTATIONS for k in rest):
                if target is False:
                    return False
                if target is True:
                    target = {}
                s = {"allOf": [target, rest]}
                break
            s = target
            depth += 1
        return s

    # -- allOf -------------------------------------------------------------------------------------------
    def merge_all(self, s: dict, ptr: str) -> dict | bool:
        b = self.budget
        stage, b.stage = b.stage, "merging allOf"
        held = [0]
        try:
            return self._merge_all(s, ptr, b, held)
        finally:
            b.release(held[0])  # the parts are freed; the merged schema was charged by merge()
            b.stage = stage

    def _merge_all(self, s: dict, ptr: str, b, held: list[int]) -> dict | bool:
        # A part in the list below is its dict, a pointer and a tuple: a few budget units each. Parts multiply
        # when allOf branches refer to the same definitions again and again (d_i: allOf [d_i+1, d_i+1]).
        parts = []
        stack = [(s, ptr, 0)]
        while stack:
            cur, p, depth = stack.pop()
            b.where = p or "#"
            n = 4 + len(p) // 64
            held[0] += n
            b.spend(n)
            if depth > 50:
                raise GrammarError(f"allOf/$ref nesting too deep at {p}")
            cur = self.deref(cur, p)
            if cur is True:
                continue
            if cur is False:
                return False
            if not isinstance(cur, dict):
                raise GrammarError(f"schema at {p} must be an object or boolean")
            if "allOf" in cur:
                subs = cur["allOf"]
                if not isinstance(subs, list):
                    raise GrammarError(f"allOf at {p} must be an array")
                for i, x in enumerate(subs):
                    stack.append((x, f"{p}/allOf/{i}", depth + 1))
                cur = {k: v for k, v in cur.items() if k != "allOf"}
            if "$ref" in cur:
                stack.append(({"$ref": cur["$ref"]}, p, depth + 1))
                cur = {k: v for k, v in cur.items() if k != "$ref"}
            parts.append((cur, p))
        out: dict = {}
        for cur, p in parts:
            b.where = p or "#"
            out = self.merge(out, cur, p)
        return out

    def merge(self, a: dict, b: dict, ptr: str) -> dict:
        self.budget.spend(1 + (len(a) + len(b)) // 4)
        out = dict(a)
        for k, v in b.items():
            if k in ANNOTATIONS:
                continue
            if k not in out:
                out[k] = v
                continue
            u = out[k]
            if u == v:
                continue
            if k == "type":
                ta = {u} if isinstance(u, str) else set(u)
                tb = {v} if isinstance(v, str) else set(v)
                res = set()
                for x in ta:
                    for y in tb:
                        if x == y:
                            res.add(x)
                        elif {x, y} == {"integer", "number"}:
                            res.add("integer")
                out[k] = sorted(res) if res else ["__none__"]
            elif k == "required":
                out[k] = list(dict.fromkeys(list(u) + list(v)))
            elif k in ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"):
                if isinstance(u, bool) or isinstance(v, bool):
                    raise GrammarError(f"cannot merge boolean {k} in allOf at {ptr}")
                out[k] = max(u, v)
            elif k in ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"):
                if isinstance(u, bool) or isinstance(v, bool):
                    raise GrammarError(f"cannot merge boolean {k} in allOf at {ptr}")
                out[k] = min(u, v)
            elif k == "properties":
                self.budget.spend(1 + (len(u) + len(v)) // 4)
                props = dict(u)
                for name, sub in v.items():
                    props[name] = {"allOf": [props[name], sub]} if name in props else sub
                out[k] = props
            elif k in ("additionalProperties", "items", "additionalItems"):
                out[k] = {"allOf": [u, v]}
            elif k == "_not_strings":
                out[k] = list(u) + list(v)
            elif k == "pattern":
                out["pattern"] = [*(u if isinstance(u, list) else [u]), *(v if isinstance(v, list) else [v])]
            elif k in ("enum", "const"):
                ua = u if k == "enum" else [u]
                va = v if k == "enum" else [v]
                inter = [x for x in ua if any(_json_equal(x, y) for y in va)]
                out[k] = inter if k == "enum" else (inter[0] if inter else None)
                if k == "const" and not inter:
                    out["enum"] = []
                    del out["const"]
            elif k in ("anyOf", "oneOf"):
                combos = [{"allOf": [x, y]} for x in u for y in v]
                if len(combos) > 64:
                    raise GrammarError(f"allOf of two {k} lists at {ptr} is too large to combine")
                if k == "oneOf":
                    out["anyOf"] = out.get("anyOf", [])
                    self.unsupported("allOf combining two oneOf lists", ptr)
                out[k] = combos
            elif k in UNSUPPORTED or k in SUPPORTED:
                self.unsupported(f"keyword {k!r} with different values in allOf", ptr)
            # Unknown (vendor) keywords carry no assertion: the first value is kept, the other ignored.
        # A property declared by one side only is still governed by the other side's additionalProperties.
        for side, other in ((a, b), (b, a)):
            addl = other.get("additionalProperties", True)
            if addl is True or "properties" not in side:
                continue
            if "patternProperties" in other:
                raise GrammarError(f"allOf mixing properties with patternProperties at {ptr} is not supported")
            oprops = other.get("properties", {})
            self.budget.spend(1 + len(out["properties"]) // 4)
            out["properties"] = dict(out["properties"])
            for name in side["properties"]:
                if name not in oprops:
                    out["properties"][name] = {"allOf": [out["properties"][name], addl]}
        if "patternProperties" in a and "patternProperties" in b and a["patternProperties"] != b["patternProperties"]:
            raise GrammarError(f"allOf with two patternProperties at {ptr} is not supported")
        return out

    # -- oneOf disjointness ------------------------------------------------------------------------------
    def exclusive_branches(self, subs, ptr: str):
        """Make oneOf branches mutually exclusive, or raise if that cannot be done exactly.

        Provably disjoint branches stay as they are. For two overlapping object-only branches, branch i
        additionally requires that one of branch j's required properties is absent: a subset of
        "not branch j", so every accepted value matches exactly one branch."""
        resolved = []
        for b, bp in subs:
            r = self.deref(b, bp)
            if isinstance(r, dict) and "allOf" in r:
                r = self.merge_all(r, bp)
            resolved.append(r)
        out = []
        for i, (b, bp) in enumerate(subs):
            extra = []
            for j in range(len(resolved)):
                if i == j or self.disjoint(resolved[i], resolved[j], 0):
                    continue
                ri, rj = resolved[i], resolved[j]
                req_j = rj.get("required", []) if isinstance(rj, dict) else []
                if (isinstance(ri, dict) and isinstance(rj, dict) and self._types(ri) == {"object"}
                        and self._types(rj) == {"object"} and req_j and isinstance(req_j, list)):
                    extra.append({"anyOf": [{"properties": {k: False}} for k in req_j]})
                else:
                    self.unsupported(f"oneOf whose branches {min(i, j)} and {max(i, j)} may overlap", ptr)
                    return subs
            out.append(({"allOf": [b, *extra]} if extra else b, bp))
        return out

    def _types(self, s) -> set[str]:
        if s is False:
            return set()
        if not isinstance(s, dict):
            return set(TYPES) | {"integer"}
        if "const" in s or "enum" in s:
            vals = [s["const"]] if "const" in s else list(s.get("enum") or [])
            return {_json_type(v) for v in vals}
        t = s.get("type")
        if t is None:
            for key in ("anyOf", "oneOf"):
                if isinstance(s.get(key), list):
                    acc: set[str] = set()
                    for b in s[key]:
                        acc |= self._types(self.deref(b, ""))
                    return acc
            return set(TYPES) | {"integer"}
        ts = {t} if isinstance(t, str) else set(t)
        if "number" in ts:
            ts.add("integer")
        return ts

    def disjoint(self, a, b, depth: int) -> bool:
        self.budget.tick()
        if a is False or b is False:
            return True
        if depth > 8 or not isinstance(a, dict) or not isinstance(b, dict):
            return False
        for x, y in ((a, b), (b, a)):
            for key in ("anyOf", "oneOf"):
                if isinstance(x.get(key), list) and "type" not in x:
                    rest = {k: v for k, v in x.items() if k != key}
                    if all(self.disjoint(self.deref({"allOf": [rest, br]} if rest else br, ""), y, depth + 1)
                           for br in x[key]):
                        return True
        ta, tb = self._types(a), self._types(b)
        inter = set()
        for x in ta:
            for y in tb:
                if x == y:
                    inter.add(x)
                elif {x, y} == {"integer", "number"}:
                    inter.add("integer")
        if not inter:
            return True
        for x, y in ((a, b), (b, a)):
            if "const" in x or "enum" in x:
                vals = [x["const"]] if "const" in x else list(x.get("enum") or [])
                if not self.valid_values(vals, y, "a oneOf branch"):
                    return True
        if inter == {"object"}:
            pa, pb = a.get("properties", {}), b.get("properties", {})
            ra, rb = set(a.get("required", [])), set(b.get("required", []))
            for name in ra & rb:
                if name in pa and name in pb:
                    sa, sb = self.deref(pa[name], ""), self.deref(pb[name], "")
                    if self.disjoint(sa, sb, depth + 1):
                        return True
            for x, rx in ((a, rb), (b, ra)):
                if x.get("additionalProperties", True) is False and "patternProperties" not in x:
                    if any(n not in x.get("properties", {}) for n in rx):
                        return True
        return False

    # -- enum / const ------------------------------------------------------------------------------------
    def enum(self, s: dict, ptr: str) -> Node:
        vals = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(vals, list):
            raise GrammarError(f"enum at {ptr} must be an array")
        if len(vals) > MAX_ENUM:
            raise GrammarError(f"enum at {ptr} has more than {MAX_ENUM} values")
        rest = {k: v for k, v in s.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if "const" in s and "enum" in s:
            vals = [v for v in vals if any(_json_equal(v, e) for e in s["enum"])]
        excluded = rest.pop("_not_strings", None)
        if excluded:
            vals = [v for v in vals if not (isinstance(v, str) and v in excluded)]
        if rest:
            vals = self.valid_values(vals, rest, ptr)
        alts = []
        for v in vals:
            alts.append(self.literal(v))
        return alt(*alts) if alts else NOTHING

    def literal(self, v) -> Node:
        compact = json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        spaced = json.dumps(v, ensure_ascii=False, allow_nan=False)
        self.budget.spend(1 + (len(compact) + len(spaced)) // 8)  # a node per character, 8 bytes each
        if self.ws == EMPTY or compact == spaced:
            return _lit_json(compact)
        return alt(_lit_json(compact), _lit_json(spaced))

    # -- per type ----------------------------------------------------------------------------------------
    def t___none__(self, s, ptr):
        return NOTHING

    def t_null(self, s, ptr):
        return lit("null")

    def t_boolean(self, s, ptr):
        return alt(lit("true"), lit("false"))

    def _bounds(self, s, ptr):
        lo = hi = None
        lo_ex = hi_ex = False
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            v = s.get(key)
            if v is None or isinstance(v, bool):
                continue
            if not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                raise GrammarError(f"{key} at {ptr} must be a number")
        mn, mx = s.get("minimum"), s.get("maximum")
        emn, emx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        cands_lo = []
        if mn is not None:
            cands_lo.append((Decimal(str(mn)), emn is True))
        if emn is not None and not isinstance(emn, bool):
            cands_lo.append((Decimal(str(emn)), True))
        cands_hi = []
        if mx is not None:
            cands_hi.append((Decimal(str(mx)), emx is True))
        if emx is not None and not isinstance(emx, bool):
            cands_hi.append((Decimal(str(emx)), True))
        if cands_lo:
            lo, lo_ex = max(cands_lo, key=lambda x: (x[0], x[1]))
        if cands_hi:
            hi, hi_ex = min(cands_hi, key=lambda x: (x[0], not x[1]))
        return lo, lo_ex, hi, hi_ex

    def t_integer(self, s, ptr):
        lo, lo_ex, hi, hi_ex = self._bounds(s, ptr)
        ilo = None if lo is None else _int_bound(lo, True, lo_ex)
        ihi = None if hi is None else _int_bound(hi, False, hi_ex)
        if ilo is not None and ihi is not None and ilo > ihi:
            return NOTHING
        node = int_range(ilo, ihi)
        m = s.get("multipleOf")
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0:
                raise GrammarError(f"multipleOf at {ptr} must be a positive number")
            dm = Decimal(str(m))
            if dm != dm.to_integral_value():
                self.unsupported("non-integer multipleOf on an integer", ptr)
                return node
            k = int(dm)
            if k == 1:
                return node
            if k > 5000:
                self.unsupported(f"multipleOf {k} (too large)", ptr)
                return node
            base = cpauto.determinize(cpauto.from_ir(node))
            return Auto(cpauto.product(base, _mod_dfa(k)))
        return node

    def t_number(self, s, ptr):
        m = s.get("multipleOf")
        if m is not None:
            try:
                integral = Decimal(str(m)) == Decimal(str(m)).to_integral_value()
            except InvalidOperation:
                integral = False
            if not integral:
                self.unsupported("non-integer multipleOf", ptr)
                s = {k: v for k, v in s.items() if k != "multipleOf"}
            else:
                return self.t_integer(s, ptr)
        lo, lo_ex, hi, hi_ex = self._bounds(s, ptr)
        if lo is None and hi is None:
            return NUMBER
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex))):
            return NOTHING
        for b in (lo, hi):
            if b is not None and len(b.normalize().as_tuple().digits) > 15:
                self.unsupported("number bound with more than 15 significant digits", ptr)
        # The same bounds recur (a schema merged into several allOf/oneOf branches): one automaton for each.
        key = (lo, lo_ex, hi, hi_ex)
        hit = self.number_autos.get(key)
        if hit is None:
            hit = self.number_autos[key] = self._number_range(lo, lo_ex, hi, hi_ex)
        return hit

    @staticmethod
    def _number_range(lo, lo_ex, hi, hi_ex) -> Node:
        # Bounded numbers are written without exponent (a subset of the valid spellings), exactly in range.
        parts = []
        if hi is None or hi >= 0:
            plo, plo_ex = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_ex)
            parts.append(_decimal_range(plo, plo_ex, hi, hi_ex))
        if lo is None or lo < 0:
            nlo, nlo_ex = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, hi_ex)
            parts.append(seq(lit("-"), _decimal_range(nlo, nlo_ex, None if lo is None else -lo, lo_ex)))
        # Validators compare binary floats: decimals of at most 15 significant digits keep their order
        # when rounded to doubles, so longer spellings (which could round onto a bound) are not generated.
        node = alt(*parts)
        if node == NOTHING:
            return NOTHING
        dfa = cpauto.determinize(cpauto.from_ir(node), max_states=20000)
        return Auto(cpauto.product(dfa, _SIG15, max_states=40000))

    def string_node(self, mn: int, mx: int | None) -> Node:
        """A JSON string of mn..mx characters: its body and closing quote are one shared called rule."""
        name = f"%str{mn}:{'' if mx is None else mx}"
        if name not in self.rules:
            self.rules[name] = seq(Repeat(JCHAR, mn, mx), lit('"'))
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
        regexes = []
        pats = s.get("pattern")
        if pats is not None:
            for p in pats if isinstance(pats, list) else [pats]:
                regexes.append(parse_regex(p, search=True, where=f"pattern at {ptr}/pattern", dialect="json-schema"))
        fmt = s.get("format")
        if fmt is not None:
            if fmt in FORMATS:
                regexes.append(parse_regex(FORMATS[fmt], where=f"format {fmt}", dialect="json-schema"))  # ASCII \d
            elif fmt in STANDARD_FORMATS:
                self.unsupported(f"format {fmt!r}", ptr)
            else:
                self.warnings.append(f"format {fmt!r} at {ptr} is not enforced (annotation only)")
        q = lit('"')
        excluded = s.get("_not_strings")
        if excluded:
            # Excluding values forces the canonical (json.dumps) encoding, so an escape cannot spell one.
            regexes.append(Auto(cpauto.not_words(excluded)))
        if not regexes:
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

    def t_array(self, s, ptr):
        mn = s.get("minItems", 0)
        mx = s.get("maxItems")
        for key, v in (("minItems", mn), ("maxItems", mx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} at {ptr} must be a non-negative integer")
        items = s.get("items", True)
        prefix: list = []
        if "prefixItems" in s:
            prefix = s["prefixItems"]
            rest = items
        elif isinstance(items, list):
            prefix = items
            rest = s.get("additionalItems", True)
        else:
            rest = items
        if not isinstance(prefix, list):
            raise GrammarError(f"prefixItems at {ptr} must be an array")
        P = len(prefix)
        self.budget.spend(P)
        pnodes = [self.compile(x, f"{ptr}/prefixItems/{i}") for i, x in enumerate(prefix)]
        rnode = self.compile(rest, f"{ptr}/items")
        if mx is not None and mx < mn:
            return NOTHING
        ws = self.ws
        empty = seq(lit("["), ws, lit("]"))

        first = pnodes[0] if P else rnode
        if mx == 0 or first == NOTHING:
            return empty if mn == 0 else NOTHING
        # What may follow item 0, built from the back: first the items after the prefix (each `rnode`), then
        # for each prefix item k (last to first) "stop here, or a separator, item k and the rest".
        k = max(P, 1)
        if rnode == NOTHING:
            tail = EMPTY if k >= mn else NOTHING
        elif mx is not None and mx < k:
            tail = NOTHING
        else:
            tail = Repeat(seq(self.sep, rnode), max(0, mn - k), None if mx is None else mx - k)
        for k in range(P - 1, 0, -1):
            options = []
            if k >= mn:
                options.append(EMPTY)
            if mx is None or k < mx:
                options.append(seq(self.sep, pnodes[k], tail))
            tail = alt(*options) if options else NOTHING
        full = seq(lit("["), ws, first, tail, ws, lit("]"))
        return alt(empty, full) if mn == 0 else full

    def _pattern(self, pattern: str, ptr: str) -> dict:
        """A patternProperties regex's key automaton (search semantics), built once per pattern since the same
        patterns recur across a schema's objects; its complement and single word are filled in when asked."""
        entry = self.pattern_dfas.get(pattern)
        if entry is None:
            d = cpauto.determinize(cpauto.from_ir(parse_regex(pattern, search=True, dialect="json-schema",
                                                              where=f"patternProperties at {ptr}")))
            entry = self.pattern_dfas[pattern] = {"dfa": d}
        return entry

    def pattern_dfa(self, pattern: str, ptr: str, complement: bool = False):
        entry = self._pattern(pattern, ptr)
        if not complement:
            return entry["dfa"]
        if "not" not in entry:
            entry["not"] = cpauto.complement(entry["dfa"])
        return entry["not"]

    def pattern_word(self, pattern: str, ptr: str) -> str | None:
        """The one key a patternProperties regex matches, if it matches exactly one."""
        entry = self._pattern(pattern, ptr)
        if "word" not in entry:
            entry["word"] = cpauto.single_word(entry["dfa"])
        return entry["word"]

    def patterns_overlap(self, p: str, q: str, ptr: str) -> bool:
        """Whether some key matches both patternProperties regexes."""
        hit = self.pattern_overlaps.get((p, q))
        if hit is None:
            wp, wq = self.pattern_word(p, ptr), self.pattern_word(q, ptr)
            if wp is not None:
                hit = cpauto.accepts(self.pattern_dfa(q, ptr), wp)
            elif wq is not None:
                hit = cpauto.accepts(self.pattern_dfa(p, ptr), wq)
            else:
                hit = not cpauto.is_empty(cpauto.product(self.pattern_dfa(p, ptr), self.pattern_dfa(q, ptr)))
            self.pattern_overlaps[(p, q)] = hit
        return hit

    def t_object(self, s, ptr):
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise GrammarError(f"properties at {ptr} must be an object")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarError(f"required at {ptr} must be an array of strings")
        pprops = s.get("patternProperties", {})
        if not isinstance(pprops, dict):
            raise GrammarError(f"patternProperties at {ptr} must be an object")
        addl = s.get("additionalProperties", False if self.strict else True)
        mn = s.get("minProperties", 0)
        mx = s.get("maxProperties")
        for key, v in (("minProperties", mn), ("maxProperties", mx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} at {ptr} must be a non-negative integer")
        pat_res = {}
        for p in pprops:
            try:
                re.compile(p)
            except re.error as exc:
                raise GrammarError(f"patternProperties key {p!r} at {ptr} is not a valid regex: {exc}") from exc
            # Which declared names a pattern governs, as Python's re.search decides, without its backtracking.
            # A pattern the regex parser refuses is refused again below, after the properties as it always was
            # (the first error met stays the one reported).
            try:
                pat_res[p] = searcher(p, f"patternProperties at {ptr}")
            except GrammarError as exc:
                pat_res[p] = exc
        names = list(props) + [r for r in required if r not in props]
        # Per name: its member's IR nodes, the key's characters, and its part of the key automata.
        self.budget.spend(1 + 4 * len(names) + sum(map(len, names)) // 8)
        items = []
        for name in names:
            sp = f"{ptr}/properties/{_pointer_escape(name)}"
            matching = [p for p in pprops if not isinstance(pat_res[p], GrammarError) and pat_res[p].accepts(name)]
            if name in props:
                sub = props[name]
                if matching:
                    sub = {"allOf": [sub] + [pprops[p] for p in matching]}
            elif matching:
                sub = {"allOf": [pprops[p] for p in matching]}
            else:
                sub = addl
            vnode = self.compile(sub, sp)
            req = name in required
            if vnode == NOTHING:
                if req:
                    return NOTHING
                continue
            items.append((seq(_lit_json(json.dumps(name, ensure_ascii=False)), self.colon, vnode), req))
        not_declared = cpauto.not_words(names)
        extra_alts = []
        pat_names = []
        for p, sub in pprops.items():
            d = self.pattern_dfa(p, ptr)
            if isinstance(pat_res[p], GrammarError):
                raise pat_res[p]
            pat_names.append(p)
            # Keys the pattern matches minus the declared ones (the product is skipped when none matches).
            key = cpauto.product(d, not_declared) if any(cpauto.accepts(d, n) for n in names) else d
            vnode = self.compile(sub, f"{ptr}/patternProperties/{_pointer_escape(p)}")
            if not cpauto.is_empty(key) and vnode != NOTHING:
                extra_alts.append(seq(lit('"'), Auto(key, escape=True), lit('"'), self.colon, vnode))
        for i in range(len(pat_names)):
            for j in range(i + 1, len(pat_names)):
                if self.patterns_overlap(pat_names[i], pat_names[j], ptr):
                    self.unsupported("patternProperties with overlapping patterns", ptr)
        vnode = self.compile(addl, f"{ptr}/additionalProperties")
        if vnode != NOTHING:
            # Literal patterns (`^client_id$`, common in generated schemas) join the declared names; the others
            # are intersected away.
            words = [w for w in (self.pattern_word(p, ptr) for p in pat_names) if w is not None]
            key = cpauto.not_words(names + words) if words else not_declared
            for p in pat_names:
                if self.pattern_word(p, ptr) is None:
                    key = cpauto.product(key, self.pattern_dfa(p, ptr, complement=True))
            if not cpauto.is_empty(key):
                extra_alts.append(seq(lit('"'), Auto(key, escape=True), lit('"'), self.colon, vnode))
        extra = None
        if extra_alts:
            # Extra members (key, colon, value) are one shared called rule: every place in the object where one
            # may start then has the same automaton states inside it, so their token masks are computed once.
            name = f"%extra{self.extra_rules}"
            self.extra_rules += 1
            self.rules[name] = alt(*extra_alts)
            self.shared.add(name)
            extra = Ref(name)
        if mx is not None and (mx < mn or sum(req for _, req in items) > mx):
            return NOTHING
        if extra is None and mn > len(items):
            return NOTHING
        members = Members(tuple(items), extra, self.sep, mn, mx)
        return seq(lit("{"), self.ws, members, self.ws, lit("}"))


def _lit_json(text: str) -> Node:
    return lit(text)


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def schema_to_grammar(schema, strict: bool = False, lenient: bool = False, compact: bool = False,
                      max_ws: int = 40) -> Grammar:
    """Lower a JSON Schema to a grammar IR. See GrammarCompiler.compile_json_schema for the options."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"JSON schema must be an object or boolean, got {type(schema).__name__}")
    if not isinstance(max_ws, int) or isinstance(max_ws, bool) or not 0 <= max_ws <= MAX_WS:
        raise GrammarError(f"max_ws must be an integer between 0 and {MAX_WS}")
    with compile_budget() as b:
        b.stage = "checking the JSON schema's keywords"
        check_keywords(schema)
        b.stage = "lowering the JSON schema"
        c = _Compiler(schema, bool(strict), bool(lenient), bool(compact), max_ws)
        root = c.compile(schema, "")
        if root == NOTHING:
            raise GrammarError("the JSON schema accepts no value")
        c.rules["root"] = root
        g = Grammar(c.rules, "root", c.warnings, frozenset(c.shared), c.indent_limit)
        b.where = ""
        # The compiler's memos and validator go with it; the grammar (its IR) is what the later stages hold.
        b.release(c.scratch + (c._validator.charged if c._validator is not None else 0))
        return g


__all__ = ["schema_to_grammar", "int_range", "ANY_RANGES", "chars"]

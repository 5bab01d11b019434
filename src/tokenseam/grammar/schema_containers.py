"""JSON Schema arrays and objects lowered to the grammar IR: prefix and rest items with their counts, and
declared, pattern and additional properties as one Members node."""

from __future__ import annotations

import json
import re

from . import anyorder, cpauto
from .errors import GrammarError
from .ir import (
    EMPTY,
    NOTHING,
    Auto,
    Escaped,
    Members,
    Ref,
    Repeat,
    alt,
    lit,
    seq,
)
from .schema_keywords import ANNOTATIONS, json_equal, json_key, json_string, pointer_escape, spelled
from .schema_negation import array_parts
from .schema_safety import searcher

NAME_KEYWORDS = {"type", "pattern", "minLength", "maxLength", "enum", "const"}
MAX_CONTAINS_UNROLL = 64
MAX_ENUM_VALUES = 2000  # as json_schema.MAX_ENUM  # positions of an array with `contains` built one by one


class ContainerLowering:
    """The `array` and `object` types of the JSON Schema compiler (json_schema._Compiler)."""

    def t_array(self, s, ptr):
        mn = s.get("minItems", 0)
        mx = s.get("maxItems")
        for key, v in (("minItems", mn), ("maxItems", mx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} at {ptr} must be a non-negative integer")
        prefix, rest, _ = array_parts(s)
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
        contains = s.get("_contains")
        if s.get("uniqueItems") is True and (mx is None or mx > 1):
            unique = None if contains else self._unique_array(ptr, prefix, rest, rnode, mn, mx)
            if unique is None:
                self.unsupported(
                    "keyword 'uniqueItems' (exact for at most one item, items of listed values, booleans or "
                    f"null, up to {anyorder.MAX_VALUE_BITS} of them, and positions whose schemas share no value)",
                    ptr,
                )
            elif unique is not True:
                return unique
        if contains:
            return self._contains_array(s, ptr, contains, prefix, rest, pnodes, rnode, mn, mx)

        if not P and (mx is None or mx > 1):
            # The item is written twice (the first, then each later one after a separator): as a rule, which the
            # byte NFA builder calls instead of copying when it is large (nfa.INLINE_LIMIT) and copies when small.
            rnode = self._as_rule(rnode)
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

    def _contains_array(self, s, ptr, contains, prefix, rest, pnodes, rnode, mn, mx):
        """An array with, besides its item schemas and counts, an item at a position in [start, stop) that
        also satisfies `schema` (`_contains`: [[schema, start, stop]], from `contains` or `not items`).
        Built as the items from each position on, before and after that item has been met: the positions
        before the point where nothing changes any more (past the prefix, `start` and `minItems`, or up to
        `maxItems`) are unrolled, so their number is bounded."""
        distinct = []
        for c in contains:
            if c not in distinct:
                distinct.append(c)
        if len(distinct) > 1:
            self.unsupported(
                "keyword 'contains' twice on one array (two contains, or contains and not items)", ptr
            )
        cs, start, stop = distinct[0]
        P = len(prefix)
        # Positions past the prefix built one by one while the item is not met yet: up to `stop`, else up to
        # maxItems, else up to where minItems and `start` are behind (then a loop takes the rest).
        needed = stop if stop is not None else max(start, mn) if mx is None else mx
        unrolled = max(P, needed if mx is None else min(needed, mx))
        if unrolled - P > MAX_CONTAINS_UNROLL or P > MAX_CONTAINS_UNROLL:
            self.unsupported(
                f"keyword 'contains' on an array whose items, minItems or maxItems need more than "
                f"{MAX_CONTAINS_UNROLL} positions built one by one",
                ptr,
            )
            return self.t_array({k: v for k, v in s.items() if k != "_contains"}, ptr)
        self.budget.spend(2 * (unrolled + 1))
        hit = [
            self.compile({"allOf": [x, cs]}, f"{ptr}/prefixItems/{i}")
            if start <= i and (stop is None or i < stop)
            else NOTHING
            for i, x in enumerate(prefix)
        ]
        rhit = self.compile({"allOf": [rest, cs]}, f"{ptr}/items") if stop is None or stop > P else NOTHING
        if unrolled > P:
            # Unrolled positions refer to the item rules instead of copying them.
            rnode, rhit = self._as_rule(rnode), self._as_rule(rhit)
        sep = self.sep
        memo: dict[tuple[int, bool], object] = {}

        def item(pos: int, met: bool):
            if met:
                return hit[pos] if pos < P else rhit
            return pnodes[pos] if pos < P else rnode

        def can_meet(pos: int) -> bool:
            return start <= pos and (stop is None or pos < stop)

        def after(pos: int, met: bool):
            """The items after the first `pos` (each with its separator), `met` once the item is among them."""
            key = (pos, met)
            if key in memo:
                return memo[key]
            if pos >= P and met:
                node = (
                    Repeat(seq(sep, rnode), max(0, mn - pos), None if mx is None else mx - pos)
                    if rnode != NOTHING
                    else (EMPTY if pos >= mn else NOTHING)
                )
            elif pos >= P and mx is None and pos >= max(mn, start) and stop is None:
                loop = Repeat(seq(sep, rnode), 0, None) if rnode != NOTHING else EMPTY
                node = seq(loop, sep, rhit, loop)
            elif pos >= unrolled and not met:
                node = NOTHING
            else:
                options = [EMPTY] if met and pos >= mn else []
                if mx is None or pos < mx:
                    options.append(seq(sep, item(pos, False), after(pos + 1, met)))
                    if not met and can_meet(pos):
                        options.append(seq(sep, item(pos, True), after(pos + 1, True)))
                node = alt(*options) if options else NOTHING
            memo[key] = node
            return node

        if mx == 0:
            return NOTHING
        first = [seq(item(0, False), after(1, False))]
        if can_meet(0):
            first.append(seq(item(0, True), after(1, True)))
        return seq(lit("["), self.ws, alt(*first), self.ws, lit("]"))

    def _unique_array(self, ptr, prefix, rest, rnode, mn, mx):
        """`uniqueItems` where it is exact: True when no two items can be equal anyway (the schemas of the
        positions that can be filled share no value); for items drawn from finitely many values (an enum or
        const, booleans, null), the array of distinct values in any order, as an any-order Members node (each
        value at most once, grammar/anyorder.py); None otherwise."""
        P = len(prefix)
        many = rnode != NOTHING and (mx is None or mx > P + 1)
        if not many:
            positions = list(prefix) + ([rest] if rnode != NOTHING and (mx is None or mx > P) else [])
            if mx is not None:
                positions = positions[:mx]
            resolved = [self._resolved(x, f"{ptr}/items") for x in positions]
            if all(
                self.disjoint(resolved[i], resolved[j], 0)
                for i in range(len(resolved))
                for j in range(i + 1, len(resolved))
            ):
                return True
            return None
        if P:
            return None
        groups = self.finite_values(rest, f"{ptr}/items")
        if groups is None:
            return None
        if mn > len(groups):
            return NOTHING
        if not anyorder.fits(len(groups), mn, mx):
            self.unsupported(
                f"keyword 'uniqueItems' over {len(groups)} distinct values (the any-order set holds "
                f"{anyorder.MAX_VALUE_BITS - (mx if mx is not None else mn).bit_length()})",
                ptr,
            )
            return None
        self.budget.spend(2 * len(groups))
        items = tuple((alt(*[self.literal(v) for v in g]), False) for g in groups)
        members = Members(items, None, self.sep, mn, mx, True)
        return seq(lit("["), self.ws, members, self.ws, lit("]"))

    def _resolved(self, s, ptr):
        r = self.deref(s, ptr)
        if isinstance(r, dict) and "allOf" in r:
            r = self.merge_all(r, ptr)
        return r

    def finite_values(self, s, ptr) -> list[list] | None:
        """The values schema `s` accepts, if it lists them (enum / const, with the keywords beside them
        checked by the validator) or is booleans and null: one group per JSON value, holding the Python values
        that spell it (`1` and `1.0`); None if there are endlessly many (or too many to list)."""
        r = self._resolved(s, ptr)
        if r is False:
            return []
        if not isinstance(r, dict):
            return None
        if "enum" in r or "const" in r:
            vals = [r["const"]] if "const" in r else r["enum"]
            if not isinstance(vals, list) or len(vals) > MAX_ENUM_VALUES:
                return None
            if "const" in r and "enum" in r:
                vals = [v for v in vals if any(json_equal(v, e) for e in r["enum"])]
            rest = {k: v for k, v in r.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
            forms = spelled(vals)
            if rest:
                forms = self.valid_values(forms, rest, ptr)
        else:
            t = r.get("type")
            ts = [t] if isinstance(t, str) else t
            if any(k not in ANNOTATIONS and k != "type" for k in r) or not isinstance(ts, list) or not ts:
                return None
            if not set(ts) <= {"boolean", "null"}:
                return None
            forms = ([True, False] if "boolean" in ts else []) + ([None] if "null" in ts else [])
        groups: dict = {}
        for v in forms:
            self.budget.tick()
            g = groups.setdefault(json_key(v), [])
            if not any(type(x) is type(v) and json.dumps(x) == json.dumps(v) for x in g):
                g.append(v)
        return list(groups.values())

    def _as_rule(self, node):
        if node in (NOTHING, EMPTY) or isinstance(node, Ref):
            return node
        name = f"%item{self.extra_rules}"
        self.extra_rules += 1
        self.rules[name] = node
        return Ref(name)

    def property_names(self, pn, ptr: str):
        """The keys `propertyNames` allows, as a code point automaton (None: every key). Exact for schemas of
        string keywords (type, pattern in both readings, minLength / maxLength, enum / const); others are
        unsupported."""
        pn = self.deref(pn, ptr)
        if pn is True or pn == {}:
            return None
        no_key = cpauto.determinize(cpauto.from_ir(NOTHING))
        if pn is False:
            return no_key
        if not isinstance(pn, dict):
            raise GrammarError(f"propertyNames at {ptr} must be a schema")
        keys = {k for k in pn if k not in ANNOTATIONS}
        if not keys <= NAME_KEYWORDS:
            self.unsupported(f"keyword 'propertyNames' with {sorted(keys - NAME_KEYWORDS)[0]!r}", ptr)
            return None
        t = pn.get("type", "string")
        if "string" not in ([t] if isinstance(t, str) else t):
            return no_key  # keys are strings
        d = cpauto.not_words([])  # every string
        pats = pn.get("pattern")
        for p in [] if pats is None else pats if isinstance(pats, list) else [pats]:
            d = cpauto.product(d, self.pattern_dfa(p, ptr, "both"))
        if "enum" in pn or "const" in pn:
            vals = [pn["const"]] if "const" in pn else pn["enum"]
            words = [v for v in vals if isinstance(v, str)] if isinstance(vals, list) else []
            listed = cpauto.determinize(cpauto.from_ir(alt(*[lit(w) for w in words]) if words else NOTHING))
            d = cpauto.product(d, listed)
        mn, mx = pn.get("minLength", 0), pn.get("maxLength")
        for key, v in (("minLength", mn), ("maxLength", mx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise GrammarError(f"{key} at {ptr} must be a non-negative integer")
        if mn or mx is not None:
            d = cpauto.determinize(cpauto.count(d, mn, mx))
        return d

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
                raise GrammarError(
                    f"patternProperties key {p!r} at {ptr} is not a valid regex: {exc}"
                ) from exc
            # Which declared names a pattern governs: those it matches as Python's re.search reads it (without
            # its backtracking) or as ECMA-262 reads it. A pattern the regex parser refuses is refused again
            # below, after the properties as it always was (the first error met stays the one reported).
            try:
                pat_res[p] = searcher(p, f"patternProperties at {ptr}")
                self._pattern(p, ptr)  # (parsed: its automata are built when needed)
            except GrammarError as exc:
                pat_res[p] = exc
        names = list(props) + [r for r in required if r not in props]
        name_dfa = self.property_names(s.get("propertyNames", True), f"{ptr}/propertyNames")
        if name_dfa is not None:
            # Keys propertyNames refuses are not written: a declared one is left out (the object is impossible
            # when it is required), and pattern and additional keys are intersected with the language below.
            if any(r in required and not cpauto.accepts(name_dfa, r) for r in names):
                return NOTHING
            names = [n for n in names if cpauto.accepts(name_dfa, n)]
        # Per name: its member's IR nodes, the key's characters, and its part of the key automata.
        self.budget.spend(1 + 4 * len(names) + sum(map(len, names)) // 8)
        items = []
        for name in names:
            sp = f"{ptr}/properties/{pointer_escape(name)}"
            matching = [
                p
                for p in pprops
                if not isinstance(pat_res[p], GrammarError) and self.pattern_matches(p, ptr, name, pat_res[p])
            ]
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
            items.append((seq(lit(json_string(name)), self.colon, vnode), req))
        not_declared = None  # "any key but the declared names", built when first needed

        def undeclared():
            nonlocal not_declared
            if not_declared is None:
                not_declared = cpauto.not_words(names)
            return not_declared

        extra_alts = []
        pat_names = []
        # A key one reading of a pattern matches and the other does not is matched for one validator and
        # additional for the other: its value must satisfy both the pattern's schema and additionalProperties.
        # Under additionalProperties true (the default) that is the pattern's schema alone.
        addl_free = addl is True or addl == {}
        for p, sub in pprops.items():
            if isinstance(pat_res[p], GrammarError):
                raise pat_res[p]
            pat_names.append(p)
            sp = f"{ptr}/patternProperties/{pointer_escape(p)}"
            vnode = self.compile(sub, sp)
            regions = [("either" if addl_free else "both", vnode)]
            if not addl_free:
                regions.append(("one", self.compile({"allOf": [sub, addl]}, sp)))
            for reading, value in regions:
                if value == NOTHING:
                    continue
                # The keys the pattern matches, as its parsed IR when nothing is taken out of them (no declared
                # name, no propertyNames): no key automaton to build, and a long counted repeat stays counted.
                # (As a string value's pattern is: the parser refuses an empty class, so the IR matches a key.)
                ir = self.pattern_ir(p, ptr, reading) if not names and name_dfa is None else None
                if ir is not None:
                    knode = Escaped(ir)
                else:
                    d = self.pattern_dfa(p, ptr, reading)
                    # Minus the declared names (the product is skipped when none matches).
                    key = cpauto.product(d, undeclared()) if any(cpauto.accepts(d, n) for n in names) else d
                    if name_dfa is not None:
                        key = cpauto.product(key, name_dfa)
                    if cpauto.is_empty(key):
                        continue
                    knode = Auto(key, escape=True)
                extra_alts.append(seq(lit('"'), knode, lit('"'), self.colon, value))
        for i in range(len(pat_names)):
            for j in range(i + 1, len(pat_names)):
                if self.patterns_overlap(pat_names[i], pat_names[j], ptr):
                    self.unsupported("patternProperties with overlapping patterns", ptr)
        vnode = self.compile(addl, f"{ptr}/additionalProperties")
        if vnode != NOTHING:
            # Literal patterns (`^client_id$`, common in generated schemas) join the declared names; the others
            # are intersected away.
            words = [w for p in pat_names for w in self.pattern_words(p, ptr) or ()]
            others = [p for p in pat_names if self.pattern_words(p, ptr) is None]
            if len(others) > 1:
                key = self.keys_outside(others, names + words, ptr)
            else:
                key = cpauto.not_words(names + words) if words else undeclared()
                for p in others:
                    key = cpauto.product(key, self.pattern_dfa(p, ptr, "either", complement=True))
            if name_dfa is not None:
                key = cpauto.product(key, name_dfa)
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
        any_order = self.any_order
        if any_order and not anyorder.fits(len(items), mn, mx):
            # Schema order accepts a subset of what any order would: tighter, never looser, and said.
            any_order = False
            self.warnings.append(
                f'object at {ptr or "#"} has {len(items)} declared properties, more than property_order "any" '
                "can track: its properties must come in schema order"
            )
        members = Members(tuple(items), extra, self.sep, mn, mx, any_order)
        return seq(lit("{"), self.ws, members, self.ws, lit("}"))

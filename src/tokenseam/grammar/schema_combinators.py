"""JSON Schema combinators: allOf merged into one schema, and oneOf branches made mutually exclusive (or
refused when that cannot be done exactly)."""

from __future__ import annotations

from .errors import GrammarError
from .schema_keywords import SUPPORTED, TYPES, UNSUPPORTED, json_equal, json_type, spelled
from .schema_negation import CONDITIONAL
from .schema_safety import asserts

MAX_COMBOS = 64  # branches an allOf of two anyOf lists may make


class Combinators:
    """allOf merging and oneOf disjointness for the JSON Schema compiler (json_schema._Compiler)."""

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
            if self.not_in_draft and not self.not_in_draft.isdisjoint(cur):
                cur = {k: v for k, v in cur.items() if k not in self.not_in_draft}
            if any(k in cur for k in CONDITIONAL):
                # if/then/else and dependencies as anyOf branches: two parts' conditions then combine.
                cur = self.conditionals(cur, p)
                if not isinstance(cur, dict):
                    raise GrammarError(f"schema at {p} must be an object or boolean")
            if any(k in cur for k in ("contains", "minContains", "maxContains")):
                cur = self.contains_keyword(cur, p)
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
            if not asserts(k):  # annotations and vendor keys: nothing to merge
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
            elif k == "uniqueItems" and isinstance(u, bool) and isinstance(v, bool):
                out[k] = u or v  # false asserts nothing
            elif k in ("_not_strings", "_not_pattern", "_contains"):
                out[k] = list(u) + list(v)
            elif k == "not":
                out[k] = {"anyOf": [u, v]}  # not u and not v = not (u or v)
            elif k == "pattern":
                out["pattern"] = [*(u if isinstance(u, list) else [u]), *(v if isinstance(v, list) else [v])]
            elif k in ("enum", "const"):
                ua = u if k == "enum" else [u]
                va = v if k == "enum" else [v]
                inter = [x for x in ua if any(json_equal(x, y) for y in va)]
                out[k] = inter if k == "enum" else (inter[0] if inter else None)
                if k == "const" and not inter:
                    out["enum"] = []
                    del out["const"]
            elif k in ("anyOf", "oneOf"):
                combos = [{"allOf": [x, y]} for x in u for y in v]
                if len(combos) > MAX_COMBOS:
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
                raise GrammarError(
                    f"allOf mixing properties with patternProperties at {ptr} is not supported"
                )
            oprops = other.get("properties", {})
            self.budget.spend(1 + len(out["properties"]) // 4)
            out["properties"] = dict(out["properties"])
            for name in side["properties"]:
                if name not in oprops:
                    out["properties"][name] = {"allOf": [out["properties"][name], addl]}
        if (
            "patternProperties" in a
            and "patternProperties" in b
            and a["patternProperties"] != b["patternProperties"]
        ):
            raise GrammarError(f"allOf with two patternProperties at {ptr} is not supported")
        return out

    # -- oneOf disjointness ------------------------------------------------------------------------------
    def exclusive_branches(self, subs, ptr: str, raw: list | None = None):
        """Make oneOf branches mutually exclusive, or raise if that cannot be done exactly.

        Provably disjoint branches stay as they are. Where branches i and j may overlap, branch i also takes
        "not branch j" when that has an exact positive form (schema_negation); else, for two object-only
        branches, that one of branch j's required properties is absent: a subset of "not branch j", so every
        accepted value matches exactly one branch. `raw`: the branches without the keywords beside the oneOf
        (which every branch has, so "not branch j" needs only branch j's own)."""
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
                if isinstance(ri, dict) and ("enum" in ri or "const" in ri):
                    # Finitely many values: the validator drops those branch j accepts (an enum beside `not`).
                    extra.append({"not": subs[j][0] if raw is None else raw[j]})
                    continue
                neg = self.negate(rj if raw is None else raw[j], subs[j][1], keys=finite_keys(ri))
                if neg is not None:
                    extra.append(neg)  # branch i and not branch j: exact
                elif (
                    isinstance(ri, dict)
                    and isinstance(rj, dict)
                    and self._types(ri) == {"object"}
                    and self._types(rj) == {"object"}
                    and req_j
                    and isinstance(req_j, list)
                ):
                    extra.append({"anyOf": [{"properties": {k: False}} for k in req_j]})
                else:
                    self.unsupported(
                        f"oneOf whose branches {min(i, j)} and {max(i, j)} may overlap (branch {j} has no exact "
                        f"negation: {self.negation_blocker} has none)",
                        ptr,
                    )
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
            return {json_type(v) for v in vals}
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
                    if all(
                        self.disjoint(self.deref({"allOf": [rest, br]} if rest else br, ""), y, depth + 1)
                        for br in x[key]
                    ):
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
                if not self.valid_values(spelled(vals), y, "a oneOf branch"):
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
                # A property the other requires that x forbids: not declared, and no pattern of x matches it in
                # either reading.
                pprops = x.get("patternProperties", {})
                if x.get("additionalProperties", True) is False and isinstance(pprops, dict):
                    declared = x.get("properties", {})
                    for n in rx:
                        if n not in declared and not any(
                            self.key_matches(p, "", n, r) for p in pprops for r in ("python", "ecma")
                        ):
                            return True
        return False


def finite_keys(s) -> tuple[str, ...] | None:
    """The only keys an object `s` accepts can have (`additionalProperties: false`, no `patternProperties`),
    or None."""
    if (
        not isinstance(s, dict)
        or s.get("additionalProperties", True) is not False
        or s.get("patternProperties")
    ):
        return None
    props = s.get("properties", {})
    return tuple(props) if isinstance(props, dict) else None

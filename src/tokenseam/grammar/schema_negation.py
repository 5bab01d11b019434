"""`not` rewritten as a positive schema with exactly the complementary set of values, where one exists.

A schema's keywords are independent assertions (the object keywords `properties` / `patternProperties` /
`additionalProperties` and the array ones count as one each, since they read each other), so by De Morgan
`not {k1, k2, ...}` is `anyOf [not k1, not k2, ...]`, and most single assertions have an exact positive
complement: `not {maxLength: 3}` is "a string of at least 4 characters" (every other value satisfies
`maxLength`). `negate` returns None
for anything without one (a number enum: 6, 6.0 and 60e-1 are one value with endlessly many spellings), and the
caller then refuses the schema: the language is never loosened.
"""

from __future__ import annotations

from .errors import GrammarError
from .schema_keywords import ANNOTATIONS, SUPPORTED, TYPES, UNSUPPORTED, pointer_escape

ALL_TYPES = set(TYPES)
MAX_NEGATION_DEPTH = 8
MAX_ONEOF_NEGATED = 6  # not oneOf takes every pair of branches
# Keywords that constrain one type only, so every value of another type satisfies them and fails their
# negation: keyword -> (its type, the keyword that states the complement, the bound's offset).
_BOUNDS = {
    "maxLength": ("string", "minLength", 1),
    "minLength": ("string", "maxLength", -1),
    "maxItems": ("array", "minItems", 1),
    "minItems": ("array", "maxItems", -1),
    "maxProperties": ("object", "minProperties", 1),
    "minProperties": ("object", "maxProperties", -1),
}
_NUMBER_BOUNDS = {
    "maximum": "exclusiveMinimum",
    "exclusiveMaximum": "minimum",
    "minimum": "exclusiveMaximum",
    "exclusiveMinimum": "maximum",
}
_OBJECT_GROUP = ("properties", "patternProperties", "additionalProperties")
_ARRAY_GROUP = ("items", "prefixItems", "additionalItems")
CONDITIONAL = ("if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies")
# Keywords some draft defines, and the compiler's own: any other keyword asserts nothing.
KNOWN = (
    SUPPORTED
    | UNSUPPORTED
    | set(CONDITIONAL)
    | {"extends", "disallow", "divisibleBy", "$dynamicRef", "$recursiveRef", "$ref"}
    | {"_not_strings", "_not_pattern", "_contains", "_not_integer"}
)


def array_parts(s: dict) -> tuple[object, object, str]:
    """An array schema's positional item schemas, the schema of the items past them, and the keyword naming
    the former: `prefixItems` and `items` (2020-12), or `items` as a list and `additionalItems` (earlier)."""
    items = s.get("items", True)
    if "prefixItems" in s:
        return s["prefixItems"], items, "prefixItems"
    if isinstance(items, list):
        return items, s.get("additionalItems", True), "items"
    return [], items, "items"


def _other_types(t: str) -> dict:
    """Every value not of JSON type t (t "number" includes the integers)."""
    return {"type": sorted(ALL_TYPES - {t})}


class Negation:
    """`negate` for the JSON Schema compiler (json_schema._Compiler): needs `deref`."""

    def negate(self, s, ptr: str, depth: int = 0, keys: tuple[str, ...] | None = None):
        """A schema accepting exactly the values `s` rejects, or None when there is no exact one here.

        `keys`: the only keys the objects the result will be intersected with can have (a schema with
        `additionalProperties: false` and no `patternProperties`). Within those objects, `additionalProperties`
        and `patternProperties` have an exact negation too: some key present whose value fails the schemas
        that apply to it.

        When it returns None, `negation_blocker` names the first keyword met without an exact negation."""
        if depth == 0:
            self.negation_blocker = None
        if depth > MAX_NEGATION_DEPTH:
            self._blocked(f"a negation nested more than {MAX_NEGATION_DEPTH} deep at {ptr or '#'}")
            return None
        s = self.deref(s, ptr)
        if s is True:
            return False
        if s is False:
            return True
        if not isinstance(s, dict):
            self._blocked(f"a schema that is no object at {ptr or '#'}")
            return None
        if self.not_in_draft and not self.not_in_draft.isdisjoint(s):
            s = {k: v for k, v in s.items() if k not in self.not_in_draft}  # no keyword in this draft
        words = [k for k in s if k not in ANNOTATIONS]
        if not words:
            return False
        parts = []
        done: set[str] = set()
        for k in words:
            if k in done:
                continue
            if k in _OBJECT_GROUP:
                done.update(_OBJECT_GROUP)
                part = self._negate_properties(s, ptr, depth, keys)
            elif k in _ARRAY_GROUP:
                done.update(_ARRAY_GROUP)
                part = self._negate_items(s, ptr, depth)
            elif k in CONDITIONAL:
                done.update(CONDITIONAL)
                part = self._negate_conditionals(s, ptr, depth, keys)
            else:
                done.add(k)
                part = self._negate_keyword(k, s[k], ptr, depth, keys)
            if part is None:
                self._blocked(f"{k!r} at {ptr or '#'}")
                return None
            if part is not False:
                parts.append(part)
        if not parts:
            return False
        return parts[0] if len(parts) == 1 else {"anyOf": parts}

    def _blocked(self, what: str) -> None:
        if getattr(self, "negation_blocker", None) is None:
            self.negation_blocker = what  # the innermost keyword, met first

    def _negate_keyword(self, k: str, v, ptr: str, depth: int, keys: tuple[str, ...] | None = None):
        if k == "type":
            ts = [v] if isinstance(v, str) else v
            if not isinstance(ts, list) or not all(isinstance(t, str) for t in ts):
                return None
            names = set(ts)
            left = ALL_TYPES - names
            if "integer" in names and "number" not in names:
                # every other type, and the numbers that are not integers (t_number's `_not_integer`)
                left.discard("number")
                rest = [{"type": "number", "_not_integer": True}]
                return {"anyOf": [{"type": sorted(left)}, *rest]} if left else rest[0]
            if not left:
                return False
            return {"type": sorted(left)}
        if k in ("enum", "const"):
            vals = [v] if k == "const" else v
            if not isinstance(vals, list):
                return None
            if any(x is not None and not isinstance(x, bool | str) for x in vals):
                return None  # numbers, arrays, objects: equal values have other spellings (6, 6.0, 60e-1)
            pieces: list = []
            strings = [x for x in vals if isinstance(x, str)]
            if strings:
                pieces.append({"_not_strings": strings})
            if None in vals:
                pieces.append(_other_types("null"))
            bools = {x for x in vals if isinstance(x, bool)}
            if len(bools) == 2:
                pieces.append(_other_types("boolean"))
            elif bools:
                pieces.append({"anyOf": [_other_types("boolean"), {"const": not bools.pop()}]})
            if not pieces:
                return True  # an empty enum rejects everything
            return pieces[0] if len(pieces) == 1 else {"allOf": pieces}
        if k in _BOUNDS:
            t, other, step = _BOUNDS[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                return None
            bound = v + step
            if bound < 0:
                return False  # minLength 0 holds for every value
            return {"type": t, other: bound}
        if k in _NUMBER_BOUNDS:
            if isinstance(v, bool) or not isinstance(v, int | float):
                return None
            return {"type": "number", _NUMBER_BOUNDS[k]: v}
        if k == "pattern":
            pats = v if isinstance(v, list) else [v]  # a list: the patterns of merged allOf parts
            if not pats or not all(isinstance(p, str) for p in pats):
                return None
            parts = [{"type": "string", "_not_pattern": [p]} for p in pats]
            return parts[0] if len(parts) == 1 else {"anyOf": parts}
        if k == "required":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                return None
            if not v:
                return False
            return {"type": "object", "anyOf": [{"properties": {x: False}} for x in v]}
        if k == "anyOf" or k == "allOf" or k == "oneOf":
            if not isinstance(v, list) or not v:
                return None
            if k == "oneOf" and len(v) > MAX_ONEOF_NEGATED:
                return None
            subs = []
            for i, b in enumerate(v):
                sub = self.negate(b, f"{ptr}/{k}/{i}", depth + 1, keys)
                if sub is None:
                    return None
                subs.append(sub)
            if k != "oneOf":
                return {"allOf" if k == "anyOf" else "anyOf": subs}
            # not oneOf: no branch holds, or two of them do.
            pairs = [{"allOf": [v[i], v[j]]} for i in range(len(v)) for j in range(i + 1, len(v))]
            return {"anyOf": [{"allOf": subs}, *pairs]}
        if k == "not":
            return v  # not not s = s
        if k not in KNOWN:
            return (
                False  # a vendor keyword asserts nothing (for the compiler and the validators): none fails it
            )
        return None

    def _negate_properties(self, s: dict, ptr: str, depth: int, keys: tuple[str, ...] | None = None):
        """not {properties: P} = an object with some property k of P whose value fails P[k]. With pattern or
        additional properties beside them: None, unless the objects can only have `keys`; then it is an object
        with some key k of `keys` whose value fails what applies to k (P[k], the schemas of the patterns
        matching k, or additionalProperties when neither does)."""
        props = s.get("properties", {})
        if not isinstance(props, dict):
            return None
        if "patternProperties" in s or "additionalProperties" in s:
            if keys is None:
                return None
            return self._negate_members(s, props, ptr, depth, keys)
        branches = []
        for name, sub in props.items():
            neg = self.negate(sub, f"{ptr}/properties/{name}", depth + 1)
            if neg is None:
                return None
            if neg is False:
                continue  # a property no value fails
            branches.append({"type": "object", "required": [name], "properties": {name: neg}})
        if not branches:
            return False
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def _negate_conditionals(self, s: dict, ptr: str, depth: int, keys: tuple[str, ...] | None):
        """not of `if` / `then` / `else` and the dependency keywords: the negation of their rewrite as
        `conditionals` makes it (an `if` needs an exact negation of its condition)."""
        if "if" in s and self.negate(s["if"], f"{ptr}/if", depth + 1) is None:
            return None
        # Without a root $schema, `dependencies` asserts for a draft-07 reader and nothing for a 2020-12 one:
        # no value fails it for both, so its negation is empty.
        ambiguous = ("dependencies",) if self.draft is None else ()
        rewritten = self.conditionals({k: s[k] for k in CONDITIONAL if k in s and k not in ambiguous}, ptr)
        return self.negate(rewritten, ptr, depth + 1, keys)

    def _negate_items(self, s: dict, ptr: str, depth: int):
        """not {prefixItems: P, items: I} (or draft-07's items: P, additionalItems: I) = an array with an item
        at some position i < len(P) failing P[i], or at a position past P failing I: `_contains` entries
        [schema, first position, position past the last (None: no end)], read as t_array reads them."""
        prefix, rest, where = array_parts(s)
        if not isinstance(prefix, list):
            return None
        branches = []
        for i, sub in enumerate(prefix):
            neg = self.negate(sub, f"{ptr}/{where}/{i}", depth + 1)
            if neg is None:
                return None
            if neg is not False:
                branches.append({"type": "array", "_contains": [[neg, i, i + 1]]})
        neg = self.negate(rest, f"{ptr}/items", depth + 1)
        if neg is None:
            return None
        if neg is not False:
            branches.append({"type": "array", "_contains": [[neg, len(prefix), None]]})
        if not branches:
            return False
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def _negate_members(self, s: dict, props: dict, ptr: str, depth: int, keys: tuple[str, ...]):
        pprops = s.get("patternProperties", {})
        if not isinstance(pprops, dict):
            return None
        addl = s.get("additionalProperties", True)
        branches = []
        for name in keys:
            self.budget.tick()
            sp = f"{ptr}/properties/{pointer_escape(name)}"
            # What applies to the key for a validator reading the patterns as Python does, and as ECMA-262
            # does: the value must fail both (each validator then rejects the object).
            readings = []
            for reading in ("python", "ecma"):
                parts = [props[name]] if name in props else []
                for p in pprops:
                    if self.key_matches(p, ptr, name, reading):
                        parts.append(pprops[p])
                if not parts:
                    parts.append(addl)
                if parts not in readings:
                    readings.append(parts)
            negs = []
            for parts in readings:
                neg = self.negate(parts[0] if len(parts) == 1 else {"allOf": parts}, sp, depth + 1)
                if neg is None:
                    return None
                negs.append(neg)
            if False in negs:
                continue  # a value no reading rejects
            neg = negs[0] if len(negs) == 1 else {"allOf": negs}
            branches.append({"type": "object", "required": [name], "properties": {name: neg}})
        if not branches:
            return False
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    # -- keywords rewritten with negation -----------------------------------------------------------------
    def conditionals(self, s: dict, ptr: str) -> dict:
        """`if`/`then`/`else`, `dependentRequired`, `dependentSchemas` and `dependencies` as an allOf of
        anyOf branches with the same values (`if` needs an exact negation of its condition)."""
        rest = {k: v for k, v in s.items() if k not in CONDITIONAL}
        parts = [rest] if any(k not in ANNOTATIONS for k in rest) else []
        if "if" in s:
            cond, then, other = s["if"], s.get("then", True), s.get("else", True)
            neg = self.negate(cond, f"{ptr}/if")
            if neg is None:
                self.unsupported("keyword 'if' whose condition has no exact negation", ptr)
            else:
                parts.append({"anyOf": [{"allOf": [cond, then]}, {"allOf": [neg, other]}]})
        # `then` / `else` without `if` assert nothing.
        deps: list[tuple[str, object, str]] = []
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            v = s.get(key)
            if v is None:
                continue
            if not isinstance(v, dict):
                raise GrammarError(f"{key} at {ptr} must be an object")
            deps.extend((name, dep, f"{ptr}/{key}/{pointer_escape(name)}") for name, dep in v.items())
        for name, dep, where in deps:
            if isinstance(dep, list):
                if not all(isinstance(x, str) for x in dep):
                    raise GrammarError(f"{where} must be an array of property names")
                then = {"required": [name, *dep]}
            elif isinstance(dep, dict | bool):
                then = {"allOf": [{"required": [name]}, dep]}
            else:
                raise GrammarError(f"{where} must be a schema or an array of property names")
            # Either the object lacks the property, or it has it and what depends on it.
            parts.append({"anyOf": [{"properties": {name: False}}, then]})
        if not parts:
            return {}
        return parts[0] if len(parts) == 1 else {"allOf": parts}

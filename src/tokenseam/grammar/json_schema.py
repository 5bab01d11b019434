"""JSON Schema front end (draft 2020-12 and draft-07 keywords) lowered to the grammar IR, exactly or not at all.

Declared properties are generated in schema order, then additional/pattern properties; unsupported -> error.
Here: the compiler's dispatch over keywords ($ref, allOf/anyOf/oneOf, not, enum/const, type) and
schema_to_grammar. The per-type lowerings and the combinators are mixins of _Compiler, one module each:
schema_numbers, schema_strings, schema_containers, schema_combinators; keyword sets in schema_keywords.
"""

from __future__ import annotations

import functools
from urllib.parse import unquote

from .budget import compile_budget, current
from .errors import GrammarEmpty, GrammarError
from .ir import (
    EMPTY,
    LAYOUT,
    LAYOUT_NO_INDENT,
    NOTHING,
    Grammar,
    Node,
    Ref,
    alt,
    lit,
    literal_alt,
    opt,
    seq,
    star,
)
from .library import library_rule
from .schema_combinators import Combinators, finite_keys
from .schema_containers import ContainerLowering
from .schema_keywords import (
    ANNOTATIONS,
    COMPACT,
    SORTED,
    SPACED,
    SUPPORTED,
    TYPES,
    UNSUPPORTED,
    json_equal,
    json_key,
    json_string,
    json_type,
    pointer_escape,
    spelled,
)
from .schema_negation import CONDITIONAL, Negation
from .schema_numbers import NUMBER, NumberLowering
from .schema_safety import EnumValidator, asserts, check_keywords, refused_uri, searcher
from .schema_strings import StringLowering

MAX_ENUM = 2000
MAX_WS = 1000  # the largest max_ws option (longest run of spaces/tabs after a newline)

LENIENT_HINT = "; pass lenient=True to ignore it"  # ends the message of an unsupported keyword


# The type names every draft reads alike (`integer` is not: draft 4 takes 1.0 for no integer). Enum values beside
# nothing but a `type` of these are checked here, not by the validator (the common case, and one check per value
# instead of a validator's walk).
_PLAIN_TYPES = frozenset({"string", "boolean", "null", "number", "object", "array"})


LITERAL_TREE_MIN = 16  # enum values written one way, from which they become one tree (ir.literal_alt)


def plain_types(rest: dict) -> frozenset | None:
    """The type names of an enum's other keywords when they are only a `type` of plain names, else None."""
    if len(rest) != 1 or "type" not in rest:
        return None
    t = rest["type"]
    names = [t] if isinstance(t, str) else t
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n in _PLAIN_TYPES for n in names)
    ):
        return None
    return frozenset(names)


def of_types(v, kinds: frozenset) -> bool:
    """Whether the JSON value v is of one of the plain type names `kinds` (a number is any int or float)."""
    t = json_type(v)
    return t in kinds or (t == "integer" and "number" in kinds)


@functools.lru_cache(maxsize=8)
def separators(ws: Node) -> tuple[Node, Node]:
    """The comma and the colon between members, with layout `ws` around them."""
    return seq(ws, lit(","), ws), seq(ws, lit(":"), ws)


@functools.lru_cache(maxsize=8)
def any_body(ws: Node) -> Node:
    """The rule `any` (any JSON value, with layout `ws`), calling itself and the plain string rule `%str0:`.
    One object per layout in the process, so the byte NFA builder lowers it once (library.py)."""
    sep, colon = separators(ws)
    v = Ref("any")
    string = seq(lit('"'), Ref("%str0:"))
    obj = seq(lit("{"), ws, opt(seq(string, colon, v, star(seq(sep, string, colon, v)))), ws, lit("}"))
    arr = seq(lit("["), ws, opt(seq(v, star(seq(sep, v)))), ws, lit("]"))
    return alt(obj, arr, string, NUMBER, lit("true"), lit("false"), lit("null"))


class _Compiler(Combinators, Negation, NumberLowering, StringLowering, ContainerLowering):
    """One schema lowered to IR rules: `compile` per sub-schema; the state below is shared with the mixins."""

    def __init__(
        self, root, strict: bool, lenient: bool, compact: bool, max_ws: int, any_order: bool = False
    ) -> None:
        self.root = root
        self.strict = strict
        self.any_order = any_order
        # A root `$schema` naming an older draft is read as that draft reads it: up to draft-07 `$ref` stands
        # alone (its siblings are ignored), and keywords from later drafts are no assertion.
        self.draft = draft = declared_draft(root)
        self.ref_alone = draft is not None and draft <= 7
        self.not_in_draft = frozenset(
            k for since, ks in _NEWER if draft is not None and draft < since for k in ks
        ) | (frozenset({"dependencies"}) if draft is not None and draft >= 2019 else frozenset())
        self.lenient = lenient
        self.warnings: list[str] = []
        self.rules: dict[str, Node] = {}
        self.ref_rules: dict[str, str] = {}
        self.merge_rules: dict[str, str] = {}
        self.empty_merges: set[str] = set()  # merge rules whose schema accepts nothing: met again, NOTHING
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
        self.string_autos: dict[tuple, Node] = {}
        self.merge_inputs: dict[str, str] = {}
        self.pattern_dfas: dict[str, dict] = {}
        self.pattern_overlaps: dict[tuple[str, str], bool] = {}
        self.sep, self.colon = separators(self.ws)
        self._validator: EnumValidator | None = None
        self.budget = current()
        self.scratch = 0  # budget units of memo keys and validator views, freed with this compiler
        self._depth = 0
        self._any_rule = None
        self._plain: dict[int, bool] = {}
        self._unions: dict[int, tuple[list, list | None]] = {}

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
            raise GrammarError(msg + LENIENT_HINT)

    def resolve(self, ref: str, ptr: str):
        if not isinstance(ref, str):
            raise GrammarError(f"$ref at {ptr} must be a string")
        if not ref.startswith("#"):
            raise GrammarError(
                f"unsupported $ref {ref!r} at {ptr}: only local references ('#/...') are supported"
            )
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
            self.string_node(0, None)  # the string rule the value calls
            self.rules["any"] = library_rule(any_body(self.ws))
        return Ref("any")

    def validator(self) -> EnumValidator:
        if self._validator is None:
            self._validator = EnumValidator(self.root, "dependencies" not in self.not_in_draft)
        return self._validator

    def validator_decides(self, s: dict) -> bool:
        """Whether the validator decides `s`, an enum/const beside keywords the grammar cannot build exactly
        (`not`, `if`, `uniqueItems`, `contains`, ...): the values are finite, and the validator reads every
        keyword as the compiler does (`format` included: see schema_safety), except a non-integral
        `multipleOf` (float division to it: 0.07 is no multiple of 0.01), so a schema reaching it (or a
        dynamic reference, which the compiler does not follow) is left to the compiler's own rules."""
        if not any(k in s for k in DECIDED) and s.get("uniqueItems") is not True:
            return False
        hit = self._plain.get(id(s))
        if hit is None:
            hit = self._plain[id(s)] = self._reads_alike(s)
        return hit

    def _reads_alike(self, s) -> bool:
        seen: set[int] = set()
        stack = [s]
        while stack:
            x = stack.pop()
            self.budget.tick()
            if isinstance(x, list):
                stack.extend(x)
                continue
            if not isinstance(x, dict) or id(x) in seen:
                continue
            seen.add(id(x))
            if "$dynamicRef" in x or "$recursiveRef" in x:
                return False
            m = x.get("multipleOf")
            if isinstance(m, float) and not m.is_integer():
                return False
            for k, v in x.items():
                if k == "$ref" and isinstance(v, str):
                    stack.append(self.resolve(v, "a $ref met checking enum/const values"))
                elif k not in ENUM_DATA and isinstance(v, (dict, list)):
                    stack.append(v)
        return True

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
                raise GrammarError(
                    f"$ref to {uri!r} (met while checking enum/const values at {ptr or '#'}) is "
                    "not resolved: only references inside the document are, and nothing is "
                    "fetched over the network or read from files"
                ) from None
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
        if self.not_in_draft and not self.not_in_draft.isdisjoint(s):
            s = {k: v for k, v in s.items() if k not in self.not_in_draft}
        if ("enum" in s or "const" in s) and self.validator_decides(s):
            return self.enum(s, ptr)
        # (Each test a set against the keys, in C: most schemas have none of these keywords.)
        if not CONTAINS.isdisjoint(s):
            s = self.contains_keyword(s, ptr)
        if not UNSUPPORTED.isdisjoint(s):
            for k in s:
                if k in UNSUPPORTED:
                    if k == "propertyNames":
                        continue  # the object lowering reads it (it asserts nothing about other types)
                    if k == "not" or k in CONDITIONAL:
                        continue
                    self.unsupported(f"keyword {k!r}", ptr)
        if not _CONDITIONAL.isdisjoint(s):
            return self.compile(self.conditionals(s, ptr), ptr)
        if "not" in s:
            return self.negation(s, ptr)
        if "$ref" in s:
            ref = s["$ref"]
            rest = {k: v for k, v in s.items() if k != "$ref" and asserts(k)}
            if not rest or self.ref_alone:
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
                ikey = SORTED.encode(s)
            except (TypeError, ValueError):
                ikey = None
            else:
                self.budget.tick(1 + len(ikey) // 64)
            seen = self.merge_inputs.get(ikey) if ikey is not None else None
            if seen is not None:
                return NOTHING if seen in self.empty_merges else Ref(seen)
            merged = self.merge_all(s, ptr)
            # A merged schema seen before becomes a shared rule, so recursion through allOf/$ref terminates.
            try:
                key = SORTED.encode(merged)
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
                    if self.rules[name] == NOTHING:
                        # Nothing satisfies it (an allOf with `false`): said as such, here and wherever it is
                        # met again, so that callers drop what needs it (a patternProperties key's region)
                        # instead of lowering it.
                        self.empty_merges.add(name)
                return NOTHING if name in self.empty_merges else Ref(name)
            return self.compile(merged, ptr)
        for key in ("anyOf", "oneOf"):
            if key in s:
                branches = s[key]
                if not isinstance(branches, list) or not branches:
                    raise GrammarError(f"{key} at {ptr} must be a non-empty array")
                # The keywords beside the list, which every branch takes (annotations and vendor keys assert
                # nothing, and `definitions` can be most of the document: they would only lengthen the
                # allOf's memo key).
                rest = {k: v for k, v in s.items() if k != key and asserts(k)}
                has_rest = bool(rest)
                union = None
                if key == "anyOf" and has_rest and "enum" not in rest and "const" not in rest:
                    union = self.enum_union(branches)
                if union is not None:
                    # anyOf of bare enums beside other keywords is one enum beside them: its values are checked
                    # with one validator instead of one merged schema per branch
                    return self.compile({**rest, "enum": union}, ptr)
                subs = []
                for i, b in enumerate(branches):
                    bp = f"{ptr}/{key}/{i}"
                    if has_rest:
                        b = {"allOf": [rest, b]}
                    subs.append((b, bp))
                self.budget.spend(len(subs))
                if key == "oneOf" and len(subs) > 1:
                    subs = self.exclusive_branches(subs, ptr, branches)
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

    def contains_keyword(self, s: dict, ptr: str) -> dict:
        """`contains` (with `minContains` 1 or 0, no `maxContains`) as the `_contains` entry t_array builds:
        some item, at any position, also satisfies its schema."""
        out = {k: v for k, v in s.items() if k not in CONTAINS}
        if "maxContains" in s:
            self.unsupported("keyword 'maxContains'", ptr)
        if "contains" not in s:
            return out  # minContains / maxContains alone assert nothing
        lo = s.get("minContains", 1)
        if lo == 0:
            return out
        if lo != 1:
            self.unsupported("keyword 'minContains' above 1", ptr)
        out["_contains"] = [*s.get("_contains", []), [s["contains"], 0, None]]
        return out

    def negation(self, s: dict, ptr: str) -> Node:
        """`not` in the forms that have an exact (or subset) positive rewrite; others are unsupported."""
        n = self.deref(s["not"], f"{ptr}/not")
        rest = {k: v for k, v in s.items() if k != "not"}
        if n is False:
            return self.compile(rest, ptr)
        if n is True:
            return NOTHING
        if isinstance(n, dict):
            if self.not_in_draft and not self.not_in_draft.isdisjoint(n):
                n = {k: v for k, v in n.items() if k not in self.not_in_draft}  # no keyword in this draft
            keys = {k for k in n if k not in ANNOTATIONS}
            if not keys:
                return NOTHING
            if keys == {"type"}:
                t = n["type"]
                excl = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
                cur = rest.get("type", list(TYPES))
                cur = [cur] if isinstance(cur, str) else list(cur)
                # "not integer" over "number" (the non-integral numbers) is left to negate().
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
        positive = self.negate(n, f"{ptr}/not", keys=finite_keys(rest))
        if positive is not None:
            return self.compile({"allOf": [rest, positive]} if rest else positive, ptr)
        self.unsupported(
            f"keyword 'not' whose negation has no exact form here ({self.negation_blocker} has none)", ptr
        )
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

    def deref(self, s, ptr: str):
        """`s` with its `$ref` chain followed (a `$ref` beside other keywords becomes an allOf of both)."""
        depth = 0
        while isinstance(s, dict) and "$ref" in s:
            if depth > 50:
                raise GrammarError(f"$ref cycle without progress at {ptr}")
            target = self.resolve(s["$ref"], ptr)
            rest = {k: v for k, v in s.items() if k != "$ref"}
            if rest and any(k not in ANNOTATIONS for k in rest) and not self.ref_alone:
                if target is False:
                    return False
                if target is True:
                    target = {}
                s = {"allOf": [target, rest]}
                break
            s = target
            depth += 1
        return s

    # -- enum / const ------------------------------------------------------------------------------------
    def enum_union(self, branches: list) -> list | None:
        """The values of anyOf branches that are each a bare enum or const (nothing beside it but annotations
        and unknown keys), in order and without repeats; None if some branch is more than that. Memoised per
        list: a merged schema carries the same anyOf into every branch it is merged with."""
        hit = self._unions.get(id(branches))
        if hit is not None:
            return hit[1]
        out = self._enum_union(branches)
        # the list is kept alive with its entry, so its id stays unique
        self._unions[id(branches)] = (branches, out)
        self.hold(1 + (len(out) if out else 0) // 4)
        return out

    def _enum_union(self, branches: list) -> list | None:
        out, seen = [], set()
        for b in branches:
            if not isinstance(b, dict):
                return None
            # (keys with a leading underscore are the compiler's own: merged negations, `contains`)
            kw = [k for k in b if k in SUPPORTED or k in UNSUPPORTED or k.startswith("_")]
            if len(kw) != 1 or kw[0] not in ("enum", "const") or kw[0] in self.not_in_draft:
                return None
            vals = [b["const"]] if kw[0] == "const" else b["enum"]
            if not isinstance(vals, list):
                return None
            for v in vals:
                try:
                    k = json_key(v)
                    if k in seen:
                        continue
                except TypeError:  # not a JSON value (json_key holds no unhashable part for one)
                    return None
                seen.add(k)
                out.append(v)
            if len(out) > MAX_ENUM:
                return None
        return out

    def enum(self, s: dict, ptr: str) -> Node:
        vals = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(vals, list):
            raise GrammarError(f"enum at {ptr} must be an array")
        if len(vals) > MAX_ENUM:
            raise GrammarError(f"enum at {ptr} has more than {MAX_ENUM} values")
        rest = {k: v for k, v in s.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if "const" in s and "enum" in s:
            vals = [v for v in vals if any(json_equal(v, e) for e in s["enum"])]
        excluded = rest.pop("_not_strings", None)
        if excluded:
            vals = [v for v in vals if not (isinstance(v, str) and v in excluded)]
        for p in rest.pop("_not_pattern", ()):
            python = searcher(p, f"pattern at {ptr}")
            vals = [v for v in vals if not (isinstance(v, str) and self.pattern_matches(p, ptr, v, python))]
        t = rest.get("type")
        if t == "__none__" or (isinstance(t, list) and "__none__" in t):
            # the marker of an empty type intersection (allOf of disjoint types, `not` of every type): no value
            # satisfies it
            keep = [x for x in t if x != "__none__"] if isinstance(t, list) else []
            if not keep:
                return NOTHING
            rest["type"] = keep
        # 2 and 2.0 are one JSON value: an integral number takes both spellings, each one if the schema
        # accepts what it parses to (draft 4's `integer` is only the first).
        vals = spelled(vals)
        # Keys no validator reads (vendor extensions, `ignoreCase`) constrain nothing: without them a bare
        # `type` is checked here, and no keyword at all needs no check.
        rest = {k: v for k, v in rest.items() if asserts(k)}
        if rest:
            kinds = plain_types(rest)
            if kinds is not None:
                vals = [v for v in vals if of_types(v, kinds)]
            else:
                vals = self.valid_values(vals, rest, ptr)
        # Values written one way (strings, integral numbers, true, false, null) as one tree of their texts,
        # sharing prefixes, when there are enough of them for the tree to pay for its making; the others
        # (objects, arrays, other numbers: compact and spaced) beside it.
        texts, alts = [], []
        for v in vals:
            t = self.literal_text(v)
            if t is None:
                alts.append(self.literal(v))
            else:
                texts.append(t)
        if len(texts) >= LITERAL_TREE_MIN:
            alts.append(literal_alt(texts))
        else:
            alts += map(lit, texts)
        return alt(*alts) if alts else NOTHING

    def literal_text(self, v) -> str | None:
        """The one way `literal` writes v, if it has one: a string, an integral number, true, false, null."""
        if type(v) is str:
            text = json_string(v)
            self.budget.spend(1 + len(text) // 4)
            return text
        if v is None or type(v) is bool:
            return "null" if v is None else "true" if v else "false"
        if type(v) is int and abs(v) < 1e15:
            return str(v)
        return None

    def literal(self, v) -> Node:
        """The spellings of one enum/const value: an integral int as `2`, an integral float as `2.0` (see
        `spelled`), anything else as json.dumps writes it, compact and spaced."""
        text = self.literal_text(v)
        if text is not None:
            return lit(text)
        if isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer() and abs(v) < 1e15:
            return lit(str(int(v)) if isinstance(v, int) else f"{int(v)}.0")
        try:
            compact = COMPACT.encode(v)
        except ValueError:
            raise GrammarError(
                f"enum/const value {str(v)[:60]} is not JSON (NaN and Infinity are not)"
            ) from None
        spaced = SPACED.encode(v)
        self.budget.spend(1 + (len(compact) + len(spaced)) // 8)  # a node per character, 8 bytes each
        if self.ws == EMPTY or compact == spaced:
            return lit(compact)
        return alt(lit(compact), lit(spaced))

    # -- per type ----------------------------------------------------------------------------------------
    def t___none__(self, s, ptr):
        return NOTHING

    def t_null(self, s, ptr):
        return NULL

    def t_boolean(self, s, ptr):
        return BOOLEAN


NULL = lit("null")
BOOLEAN = alt(lit("true"), lit("false"))


# Keywords beside an enum/const that the validator decides (see _Compiler.validator_decides); the values of
# enum/const and of annotations are data, not schemas.
DECIDED = (
    "not",
    "if",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedItems",
    "unevaluatedProperties",
)
ENUM_DATA = ("enum", "const", "default", "examples", "example")
CONTAINS = frozenset(("contains", "minContains", "maxContains"))
_CONDITIONAL = frozenset(CONDITIONAL)

PROPERTY_ORDERS = ("schema", "any")
# The drafts a root `$schema` can name, and the keywords that did not exist yet in each (a validator for that
# draft reads them as unknown keywords: no assertion).
_DRAFTS = (
    ("draft-03", 3),
    ("draft-04", 4),
    ("draft-06", 6),
    ("draft-07", 7),
    ("2019-09", 2019),
    ("2020-12", 2020),
)
_NEWER = (
    (6, ("const", "contains", "propertyNames")),
    (7, ("if", "then", "else")),
    (
        2019,
        (
            "dependentRequired",
            "dependentSchemas",
            "unevaluatedProperties",
            "unevaluatedItems",
            "minContains",
            "maxContains",
        ),
    ),
    (2020, ("prefixItems",)),
)


def declared_draft(root) -> int | None:
    """The draft a root `$schema` names (3, 4, 6, 7, 2019, 2020), None when it names none."""
    uri = root.get("$schema") if isinstance(root, dict) else None
    if not isinstance(uri, str):
        return None
    return next((n for tag, n in _DRAFTS if tag in uri), None)


def schema_to_grammar(
    schema: dict | bool,
    strict: bool = False,
    lenient: bool = False,
    compact: bool = False,
    max_ws: int = 40,
    property_order: str = "schema",
) -> Grammar:
    """Lower a JSON Schema to a grammar IR. See GrammarCompiler.compile_json_schema for the options."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"JSON schema must be an object or boolean, got {type(schema).__name__}")
    if not isinstance(max_ws, int) or isinstance(max_ws, bool) or not 0 <= max_ws <= MAX_WS:
        raise GrammarError(f"max_ws must be an integer between 0 and {MAX_WS}")
    if property_order not in PROPERTY_ORDERS:
        raise GrammarError(f'property_order must be "schema" or "any", got {property_order!r}')
    with compile_budget() as b:
        b.stage = "checking the JSON schema's keywords"
        check_keywords(schema, declared_draft(schema))
        b.stage = "lowering the JSON schema"
        flags = (bool(strict), bool(lenient), bool(compact), max_ws, property_order == "any")
        c = _Compiler(schema, *flags)
        root = c.compile(schema, "")

        def explain() -> str:
            return empty_schema_message(schema, flags)

        if root == NOTHING:
            raise GrammarEmpty(explain())
        c.rules["root"] = root
        g = Grammar(c.rules, "root", c.warnings, frozenset(c.shared), c.indent_limit, explain)
        b.where = ""
        # The compiler's memos and validator go with it; the grammar (its IR) is what the later stages hold.
        b.release(c.scratch + (c._validator.charged if c._validator is not None else 0))
        return g


def empty_schema_message(schema, flags: tuple) -> str:
    """Why a schema accepts no value, for its error: the deepest sub-schema that every instance must hold
    (following required properties, and items an array must have) and that accepts no value on its own,
    with its keywords. Each candidate is compiled alone through the byte automaton's checks, inside the
    budget of the compile that found the schema empty."""
    from .nfa import build_nfa
    from .prepare import prepare_nfa

    c = _Compiler(schema, *flags)

    def accepts_nothing(sub, ptr: str) -> bool:
        try:
            node = c.compile(sub, ptr)
            if node == NOTHING:
                return True
            g = Grammar({**c.rules, "__part": node}, "__part", [], frozenset(c.shared), c.indent_limit)
            prepare_nfa(build_nfa(g))
        except GrammarEmpty:
            return True
        except GrammarError:
            return False  # refused for another reason: not the part to name
        return False

    try:
        return _deepest_empty(c, schema, accepts_nothing)
    except GrammarError:  # the budget ran out while looking: the plain sentence
        return "the JSON schema accepts no value (its keywords contradict each other)"


def _deepest_empty(c: _Compiler, schema, accepts_nothing) -> str:
    ptr, sub = "", schema
    for _ in range(60):  # (compile's own nesting limit)
        s = c.deref(sub, ptr)
        if not isinstance(s, dict):
            break
        parts = []
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        req = s.get("required") if isinstance(s.get("required"), list) else []
        for name in req:
            if isinstance(name, str) and name in props:
                parts.append((props[name], f"{ptr}/properties/{pointer_escape(name)}"))
        min_items = s.get("minItems", 0)
        prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else []
        if isinstance(min_items, int) and not isinstance(min_items, bool):
            parts += [(x, f"{ptr}/prefixItems/{k}") for k, x in enumerate(prefix[:min_items])]
            if min_items > len(prefix) and isinstance(s.get("items"), (dict, bool)):
                parts.append((s["items"], f"{ptr}/items"))
        for x, at in parts:
            if accepts_nothing(x, at):
                ptr, sub = at, x
                break
        else:
            break
    if not ptr:
        return "the JSON schema accepts no value (its keywords contradict each other)"
    s = c.deref(sub, ptr)
    why = (
        "its keywords contradict each other: " + ", ".join(sorted(k for k in s if k not in ANNOTATIONS))
        if isinstance(s, dict)
        else "it is the schema false"
    )
    return f"the JSON schema accepts no value: every instance must hold {ptr}, and that schema accepts none ({why})"


__all__ = ["PROPERTY_ORDERS", "empty_schema_message", "schema_to_grammar"]

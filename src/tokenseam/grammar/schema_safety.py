"""Guards for JSON schemas that come from requests: keyword values of the right type, `$ref` confined to the
document, and the `jsonschema` validator (which checks enum/const values) kept inside the compile budget.

`check_keywords` walks the schema once, before it is compiled: a keyword the compiler or the validator reads
must hold a value of its type (`format: 5` is an error, not an ignored annotation), and every `$ref`,
`$dynamicRef` and `$recursiveRef` must point inside the document (`#...`). The checks accept what any of
drafts 4 to 2020-12 allows (draft-04 boolean `exclusiveMinimum`, draft-07 array `items`), since schemas in the
wild mix them; annotations (`title`, `default`, `examples`, ...) are not checked.

`EnumValidator` is the validator the compiler asks which enum/const values a schema accepts. Left to its
defaults, `jsonschema` fetches any reference it cannot resolve locally, over HTTP or from a file, with no
timeout; evaluates keywords with no bound on time (allOf/$ref trees can be exponential); and matches `pattern`
and `patternProperties` with Python's backtracking `re` (exponential on patterns such as `(a+)+$`). Here:

- references are resolved by a registry holding only the document, whose retrieval refuses every URI (the
  bundled metaschemas are left out too, so even a `$ref` to a metaschema URL is refused, not followed);
- every keyword evaluation ticks the compile budget;
- `pattern`, `patternProperties` and `additionalProperties` match with `cpauto.Searcher` (linear time), and
  `unevaluatedProperties`, whose implementation calls `re` directly, is refused in a document that has
  `patternProperties`;
- a value is accepted only if it is valid with every regex read as Python's `re` reads it and, when the
  document has a regex, also with every regex read as ECMA-262 reads it (what the grammar's patterns require:
  no output can fail either kind of validator);
- an integral number is checked both as an int and as a float (`3` and `3.0` parse to different Python
  types, which draft 4's `integer` tells apart);
- `format` is asserted as the compiler asserts it (a stock validator reads it as an annotation);
- the keywords the compiler adds to merged schemas (`_not_strings`, `_not_pattern`, the `__none__` type) are
  read as the compiler means them, and with no root `$schema` a value must pass with draft-07's
  `dependencies` read beside the 2020-12 keywords and without it (the compiler's two readings);
- the validator runs over a view of the document without `$schema` below its root: `jsonschema` switches to
  its stock validator class for a sub-schema declaring a known `$schema`, which would escape all of the above.
"""

from __future__ import annotations

import functools
import threading

from . import cpauto
from .budget import current
from .errors import GrammarError
from .regex import parse_regex
from .schema_keywords import ANNOTATIONS, TYPES, pointer_escape

TYPE_NAMES = (*TYPES, "integer")
_NONNEG_INT = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")
_STRINGS = ("format", "pattern", "$id", "$schema", "$anchor", "$dynamicAnchor")
_BOOLEANS = ("uniqueItems", "$recursiveAnchor")
# Keywords whose value is one sub-schema, a list of them, or a map of names to them.
_ONE_SCHEMA = (
    "additionalProperties",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Keywords whose value is data, never a schema (nothing inside is a keyword).
_DATA = ("enum", "const", "default", "examples", "example")
# Keys the compiler itself adds to merged schemas; a request may not supply them.
RESERVED = ("_not_strings", "_not_pattern", "_contains", "_not_integer")
# Draft 3's own assertions, dropped in draft 4 (later readers ignore them as unknown keywords): refused under a
# draft-03 `$schema`, since the compiler does not build them.
DRAFT_3_ONLY = ("divisibleBy", "disallow", "extends")


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


# What check_keywords checks of each keyword it reads (one lookup per key; a key not here is an annotation or
# a vendor extension, not read as a schema and not checked).
_KIND: dict[str, str] = {
    **dict.fromkeys(_DATA, "data"),
    **dict.fromkeys(RESERVED, "reserved"),
    **dict.fromkeys(_REFS, "ref"),
    **dict.fromkeys(_STRINGS, "string"),
    **dict.fromkeys(_BOOLEANS, "boolean"),
    **dict.fromkeys(_NONNEG_INT, "count"),
    "minimum": "number",
    "maximum": "number",
    "exclusiveMinimum": "exclusive",
    "exclusiveMaximum": "exclusive",
    "multipleOf": "multipleOf",
    "type": "type",
    "required": "required",
    "dependentRequired": "dependentRequired",
    "dependencies": "dependencies",
    **dict.fromkeys(_ONE_SCHEMA, "schema"),
    "items": "items",
    **dict.fromkeys(_SCHEMA_LISTS, "schemas"),
    **dict.fromkeys(_SCHEMA_MAPS, "schema map"),
}


def check_keywords(root, draft: int | None = None) -> None:
    """Raise GrammarError for the first keyword whose value has the wrong type (see the module docstring), or,
    under `draft` 3 (the draft a root `$schema` names), that is one of draft 3's own assertions."""
    refused = DRAFT_3_ONLY if draft == 3 else ()
    b = current()
    stack = [(root, "#")]
    while stack:
        s, ptr = stack.pop()
        b.tick()
        if isinstance(s, bool):
            continue
        if not isinstance(s, dict):
            raise GrammarError(f"schema at {ptr} must be an object or boolean, got {_show(s)}")

        def bad(k: str, what: str, s=s, ptr=ptr) -> GrammarError:
            return GrammarError(f"keyword {k!r} at {ptr} must be {what}, got {_show(s[k])}")

        for k, v in s.items():
            kind = _KIND.get(k)
            if kind == "data":
                if k == "enum" and not isinstance(v, list):
                    raise bad(k, "an array")
                continue
            if kind == "reserved":
                raise GrammarError(f"keyword {k!r} at {ptr} is reserved for the compiler's own use")
            if refused and k in refused:
                raise GrammarError(
                    f"unsupported JSON Schema keyword {k!r} at {ptr}: draft 3 asserts it and the compiler does "
                    "not build it (write the schema for draft 4 or later)"
                )
            if kind is None:
                continue
            if kind == "ref":
                if not isinstance(v, str):
                    raise bad(k, "a string")
                if not v.startswith("#"):
                    raise GrammarError(
                        f"{k} {v!r} at {ptr} is not supported: only references inside the document "
                        "('#...') are resolved; nothing is fetched over the network or read "
                        "from files"
                    )
            elif kind == "string":
                if not isinstance(v, str):
                    raise bad(k, "a string")
            elif kind == "boolean":
                if not isinstance(v, bool):
                    raise bad(k, "true or false")
            elif kind == "count":
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise bad(k, "a non-negative integer")
            elif kind == "number":
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise bad(k, "a number")
            elif kind == "exclusive":
                if not isinstance(v, (int, float)):  # a number, or (draft 4) a boolean
                    raise bad(k, "a number (or, in draft 4, a boolean)")
            elif kind == "multipleOf":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise bad(k, "a positive number")
            elif kind == "type":
                names = [v] if isinstance(v, str) else v
                if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
                    raise bad(k, "a type name or a non-empty array of type names")
                for t in names:
                    if t not in TYPE_NAMES:
                        raise GrammarError(
                            f"keyword 'type' at {ptr} names unknown type {t!r} "
                            f"(known: {', '.join(TYPE_NAMES)})"
                        )
            elif kind == "required":
                if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
                    raise bad(k, "an array of strings")
            elif kind == "dependentRequired":
                if not isinstance(v, dict) or not all(
                    isinstance(x, list) and all(isinstance(r, str) for r in x) for x in v.values()
                ):
                    raise bad(k, "an object of arrays of strings")
            else:  # keywords holding schemas: checked in turn, with their pointers
                at = f"{ptr}/{pointer_escape(k)}"
                if kind == "dependencies":
                    if not isinstance(v, dict):
                        raise bad(k, "an object")
                    for name, x in v.items():
                        if isinstance(x, list):
                            if not all(isinstance(r, str) for r in x):
                                raise bad(k, "an object of schemas or arrays of strings")
                        else:
                            stack.append((x, f"{at}/{pointer_escape(name)}"))
                elif kind == "schema":
                    stack.append((v, at))
                elif kind == "items":
                    if isinstance(v, list):  # draft 2019-09 and earlier: one schema per position
                        stack.extend((x, f"{at}/{i}") for i, x in enumerate(v))
                    else:
                        stack.append((v, at))
                elif kind == "schemas":
                    if not isinstance(v, list) or (k in ("anyOf", "oneOf") and not v):
                        raise bad(
                            k,
                            "a non-empty array of schemas"
                            if k in ("anyOf", "oneOf")
                            else "an array of schemas",
                        )
                    stack.extend((x, f"{at}/{i}") for i, x in enumerate(v))
                else:  # a map of names to schemas
                    if not isinstance(v, dict):
                        raise bad(k, "an object of schemas")
                    stack.extend((x, f"{at}/{pointer_escape(name)}") for name, x in v.items())


class _RefusedRetrieval(Exception):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.uri = uri


def _refuse(uri: str):
    # Every URI the document itself does not hold ends here: nothing is fetched or read.
    raise _RefusedRetrieval(uri)


def refused_uri(exc: BaseException) -> str | None:
    """The URI whose retrieval was refused somewhere in the exception's chain of causes, if any."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, _RefusedRetrieval):
            return e.uri
        e = e.__cause__ or e.__context__
    return None


# -- linear-time regex matching for the validator and the compiler ---------------------------------------
_SEARCHERS: dict[tuple[str, str], cpauto.Searcher] = {}
_SEARCHERS_LOCK = threading.Lock()
MAX_SEARCHERS = 512
MAX_SEARCHER_STATES = 20_000  # larger pattern automata are built again when needed rather than kept
DIALECTS = ("python", "ecma")


def searcher(pattern: str, where: str, dialect: str = "python") -> cpauto.Searcher:
    """Whether `pattern` matches somewhere in a string, read as Python's `re` reads it (what the validator's
    `re.search` did) or, with dialect "ecma", as ECMA-262 reads it, in time linear in the string. Kept per
    pattern, across compiles (patterns recur)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"{where}: regex must be a string, got {_show(pattern)}")
    hit = _SEARCHERS.get((dialect, pattern))
    if hit is not None:
        return hit
    s = cpauto.Searcher(cpauto.from_ir(parse_regex(pattern, search=True, where=where, dialect=dialect)))
    if s.nfa.size <= MAX_SEARCHER_STATES:
        with _SEARCHERS_LOCK:
            if len(_SEARCHERS) >= MAX_SEARCHERS:
                _SEARCHERS.clear()
            _SEARCHERS[(dialect, pattern)] = s
    return s


def _regex_keywords(dialect: str) -> dict:
    """`pattern`, `patternProperties` and `additionalProperties` with their regexes read in `dialect`, and the
    compiler's `_not_pattern` (a string no reading of the pattern matches, whatever the dialect)."""
    from jsonschema.exceptions import ValidationError

    def pattern(validator, patrn, instance, schema):
        # A list: the patterns of merged allOf parts, each of which must match.
        if validator.is_type(instance, "string"):
            for p in patrn if isinstance(patrn, list) else [patrn]:
                if not searcher(p, "pattern", dialect).accepts(instance):
                    yield ValidationError(f"{instance!r} does not match {p!r}")

    def pattern_properties(validator, pprops, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        for patrn, sub in pprops.items():
            s = searcher(patrn, "patternProperties", dialect)
            for k, v in instance.items():
                if s.accepts(k):
                    yield from validator.descend(v, sub, path=k, schema_path=patrn)

    def additional_properties(validator, addl, instance, schema):
        # jsonschema's own, with the patternProperties match done by `searcher` instead of re.search.
        if not validator.is_type(instance, "object"):
            return
        props = schema.get("properties", {})
        matchers = [searcher(p, "patternProperties", dialect) for p in schema.get("patternProperties", {})]
        extras = {k for k in instance if k not in props and not any(m.accepts(k) for m in matchers)}
        if validator.is_type(addl, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], addl, path=extra)
        elif not addl and extras:
            yield ValidationError(
                f"additional properties are not allowed ({', '.join(sorted(map(repr, extras)))})"
            )

    def not_pattern(validator, pats, instance, schema):
        if isinstance(instance, str):
            for p in pats:
                if any(searcher(p, "pattern", d).accepts(instance) for d in DIALECTS):
                    yield ValidationError(f"{instance!r} matches {p!r}")

    return {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
        "_not_pattern": not_pattern,
    }


def _contains(validator, entries, instance, schema):
    # [[schema, start, stop]]: some item at a position in [start, stop) satisfies the schema.
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, list):
        return
    for sub, start, stop in entries:
        check = validator.evolve(schema=sub)
        if not any(check.is_valid(x) for x in instance[start:stop]):
            yield ValidationError(f"no item from position {start} satisfies {sub!r}")


def _not_integer(validator, flag, instance, schema):
    from jsonschema.exceptions import ValidationError

    if flag and validator.is_type(instance, "integer"):
        yield ValidationError(f"{instance!r} is an integer")


def _not_strings(validator, words, instance, schema):
    from jsonschema.exceptions import ValidationError

    if isinstance(instance, str) and instance in words:
        yield ValidationError(f"{instance!r} is excluded")


def _budgeted(fn):
    def keyword(validator, value, instance, schema):
        current().tick()
        return fn(validator, value, instance, schema)

    return keyword


_CLASSES: dict[tuple, type] = {}
_FORMAT_MATCHERS: dict[str, cpauto.Searcher] = {}  # one per format in FORMATS, at most


def _format(validator, fmt, instance, schema):
    """`format` asserted as the compiler asserts it: a string must match the format's expression in FORMATS
    (whole, as the compiled grammar does), a standard format with no expression cannot be checked (an error,
    as it is in the compiler), and any other format is an annotation."""
    from jsonschema.exceptions import ValidationError

    from .schema_strings import FORMATS, STANDARD_FORMATS

    if not isinstance(instance, str) or not isinstance(fmt, str):
        return
    if fmt in FORMATS:
        m = _FORMAT_MATCHERS.get(fmt)
        if m is None:
            ir = parse_regex(FORMATS[fmt], where=f"format {fmt}", dialect="json-schema")
            m = _FORMAT_MATCHERS[fmt] = cpauto.Searcher(cpauto.from_ir(ir))
        if not m.accepts(instance):
            yield ValidationError(f"{instance!r} is not a {fmt!r}")
    elif fmt in STANDARD_FORMATS:
        raise GrammarError(
            f"format {fmt!r} is not supported, so enum/const strings cannot be checked against it"
        )


@functools.cache
def validated_keywords() -> frozenset[str]:
    """Every keyword a validator EnumValidator builds may read, in any draft: the stock ones of each draft and
    the keywords those read beside them (`then` and `else` by `if`, `minContains` and `maxContains` by
    `contains`). The compiler's own keys start with `_`. A key outside these (a vendor extension such as
    `x-intellij-html-description`, `ignoreCase`) is skipped by every validator."""
    import jsonschema

    drafts = (
        jsonschema.Draft3Validator,
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
    return frozenset().union(*(d.VALIDATORS for d in drafts), ("then", "else", "minContains", "maxContains"))


def _validator_class(
    base: type, has_pattern_properties: bool, dialect: str = "python", dependencies: bool = False
) -> type:
    """`base` (a stock jsonschema validator class) with the keyword functions described in the module
    docstring, its regexes read in `dialect`, and draft-07's `dependencies` when asked; made once per base
    class and flags."""
    key = (base, has_pattern_properties, dialect, dependencies)
    cls = _CLASSES.get(key)
    if cls is not None:
        return cls
    import jsonschema

    kws = dict(base.VALIDATORS)
    for name, fn in _regex_keywords(dialect).items():
        if name in kws or name.startswith("_"):
            kws[name] = fn
    kws["format"] = _format
    kws["_not_strings"] = _not_strings
    kws["_contains"] = _contains
    kws["_not_integer"] = _not_integer
    if dependencies and "dependencies" not in kws:
        kws["dependencies"] = jsonschema.Draft7Validator.VALIDATORS["dependencies"]
    if "unevaluatedProperties" in kws and has_pattern_properties:

        def unevaluated(validator, value, instance, schema):
            raise GrammarError(
                "unevaluatedProperties cannot be evaluated for enum/const values in a schema with "
                "patternProperties"
            )

        kws["unevaluatedProperties"] = unevaluated
    # `__none__`: the compiler's marker of an empty type intersection, which no value has.
    checker = base.TYPE_CHECKER.redefine("__none__", lambda _checker, _instance: False)
    cls = jsonschema.validators.extend(
        base, {k: _budgeted(fn) for k, fn in kws.items()}, type_checker=checker
    )
    _CLASSES[key] = cls
    return cls


class EnumValidator:
    """The document's validator, for checking enum/const values against the schema around them.

    `dependencies`: whether draft-07's `dependencies` is read both ways, asserting and not (the compiler's
    reading without a root `$schema`: 2020-12, whose validators do not know it, and draft-07's), a value
    being accepted only if both accept it."""

    def __init__(self, root, dependencies: bool = False) -> None:
        import jsonschema
        import referencing
        import referencing.jsonschema

        self._memo: dict[int, tuple[object, object]] = {}
        self.charged = 0  # budget units spent on views
        self._has_pprops = False
        self._has_regex = False  # a pattern seen in a view: values are then checked in both regex readings
        self._has_deps = False  # `dependencies` seen in a view: then checked both ways if `dependencies`
        view = self.view(root, top=True)
        base = jsonschema.validators.validator_for(
            view if isinstance(view, dict) else {}, default=jsonschema.Draft202012Validator
        )
        self._both_deps = dependencies and "dependencies" not in base.VALIDATORS
        self._classes = {
            (dialect, deps): _validator_class(base, self._has_pprops, dialect, deps)
            for dialect in DIALECTS
            for deps in (False, True)
        }
        # The resource is made as jsonschema makes it, but in a registry of its own: without the bundled
        # metaschemas, and with a retrieval that refuses.
        spec = referencing.jsonschema.specification_with(
            base.ID_OF(base.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE
        )
        self._resolver = referencing.Registry(retrieve=_refuse).resolver_with_root(spec.create_resource(view))
        self._view = view
        self._roots: dict[int, object] = {}

    def _root(self, key: tuple[str, bool]):
        r = self._roots.get(key)
        if r is None:
            r = self._roots[key] = self._classes[key](self._view, _resolver=self._resolver)
        return r

    def view(self, x, top: bool = False):
        """The same schema without `$schema` below the document's root (see the module docstring), built
        once per object and shared: values of data keywords (enum, const, ...) are kept as they are."""
        if isinstance(x, list):
            return [self.view(v) for v in x]
        if not isinstance(x, dict):
            return x
        hit = self._memo.get(id(x))
        if hit is not None:
            return hit[1]
        n = 1 + len(x) // 4
        self.charged += n
        current().spend(n)
        out = {}
        for k, v in x.items():
            if k == "$schema" and not top:
                continue
            if k in _DATA:
                out[k] = v
            elif (k in _SCHEMA_MAPS or k == "dependencies") and isinstance(v, dict):
                if k == "dependencies":
                    self._has_deps = True
                if k == "patternProperties" and v:
                    self._has_pprops = self._has_regex = True
                out[k] = {name: self.view(sub) for name, sub in v.items()}
            else:
                if k == "pattern":
                    self._has_regex = True
                out[k] = self.view(v)
        self._memo[id(x)] = (x, out)  # the original is kept alive with its view, so its id stays unique
        return out

    def accepted(self, values: list, schema) -> list:
        """The values that `schema` (a part of the document, or a schema merged from its parts) accepts, with
        its regexes read as Python's `re` reads them and, if it has any, as ECMA-262 reads them."""
        view = self.view(schema)
        b = current()
        out = values
        readings = [
            (dialect, deps)
            for dialect in (DIALECTS if self._has_regex else DIALECTS[:1])
            for deps in ((False, True) if self._both_deps and self._has_deps else (False,))
        ]
        for key in readings:
            check = self._root(key).evolve(schema=view)
            kept = []
            for v in out:
                b.tick()
                if check.is_valid(v):
                    kept.append(v)
            out = kept
        return out


def asserts(key: str) -> bool:
    """Whether `key` can change what a schema accepts: not an annotation, and a keyword some draft's validator
    reads, or the compiler's own (`_`-prefixed). A vendor key (`x-intellij-html-description`, `preferredOrder`)
    asserts nothing: beside a `$ref` it must not make the reference a merged copy of its target."""
    return key not in ANNOTATIONS and (key in validated_keywords() or key.startswith("_"))

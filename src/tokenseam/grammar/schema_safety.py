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
- `pattern`, `patternProperties` and `additionalProperties` match with `cpauto.Searcher` (linear time, the
  pattern read as Python's `re` reads it), and `unevaluatedProperties`, whose implementation calls `re`
  directly, is refused in a document that has `patternProperties`;
- the validator runs over a view of the document without `$schema` below its root: `jsonschema` switches to
  its stock validator class for a sub-schema declaring a known `$schema`, which would escape all of the above.
"""

from __future__ import annotations

import threading

from . import cpauto
from .budget import current
from .errors import GrammarError
from .regex import parse_regex
from .schema_keywords import TYPES, pointer_escape

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
RESERVED = ("_not_strings", "_not_pattern")


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def check_keywords(root) -> None:
    """Raise GrammarError for the first keyword whose value has the wrong type (see the module docstring)."""
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
            if k in _DATA:
                if k == "enum" and not isinstance(v, list):
                    raise bad(k, "an array")
                continue
            at = f"{ptr}/{pointer_escape(k)}"
            if k in RESERVED:
                raise GrammarError(f"keyword {k!r} at {ptr} is reserved for the compiler's own use")
            if k in _REFS:
                if not isinstance(v, str):
                    raise bad(k, "a string")
                if not v.startswith("#"):
                    raise GrammarError(
                        f"{k} {v!r} at {ptr} is not supported: only references inside the document "
                        "('#...') are resolved; nothing is fetched over the network or read "
                        "from files"
                    )
            elif k in _STRINGS:
                if not isinstance(v, str):
                    raise bad(k, "a string")
            elif k in _BOOLEANS:
                if not isinstance(v, bool):
                    raise bad(k, "true or false")
            elif k in _NONNEG_INT:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise bad(k, "a non-negative integer")
            elif k in ("minimum", "maximum"):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise bad(k, "a number")
            elif k in ("exclusiveMinimum", "exclusiveMaximum"):
                if not isinstance(v, (int, float)):  # a number, or (draft 4) a boolean
                    raise bad(k, "a number (or, in draft 4, a boolean)")
            elif k == "multipleOf":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise bad(k, "a positive number")
            elif k == "type":
                names = [v] if isinstance(v, str) else v
                if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
                    raise bad(k, "a type name or a non-empty array of type names")
                for t in names:
                    if t not in TYPE_NAMES:
                        raise GrammarError(
                            f"keyword 'type' at {ptr} names unknown type {t!r} "
                            f"(known: {', '.join(TYPE_NAMES)})"
                        )
            elif k == "required":
                if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
                    raise bad(k, "an array of strings")
            elif k == "dependentRequired":
                if not isinstance(v, dict) or not all(
                    isinstance(x, list) and all(isinstance(r, str) for r in x) for x in v.values()
                ):
                    raise bad(k, "an object of arrays of strings")
            elif k == "dependencies":
                if not isinstance(v, dict):
                    raise bad(k, "an object")
                for name, x in v.items():
                    if isinstance(x, list):
                        if not all(isinstance(r, str) for r in x):
                            raise bad(k, "an object of schemas or arrays of strings")
                    else:
                        stack.append((x, f"{at}/{pointer_escape(name)}"))
            elif k in _ONE_SCHEMA:
                stack.append((v, at))
            elif k == "items":
                if isinstance(v, list):  # draft 2019-09 and earlier: one schema per position
                    stack.extend((x, f"{at}/{i}") for i, x in enumerate(v))
                else:
                    stack.append((v, at))
            elif k in _SCHEMA_LISTS:
                if not isinstance(v, list) or (k in ("anyOf", "oneOf") and not v):
                    raise bad(
                        k,
                        "a non-empty array of schemas" if k in ("anyOf", "oneOf") else "an array of schemas",
                    )
                stack.extend((x, f"{at}/{i}") for i, x in enumerate(v))
            elif k in _SCHEMA_MAPS:
                if not isinstance(v, dict):
                    raise bad(k, "an object of schemas")
                stack.extend((x, f"{at}/{pointer_escape(name)}") for name, x in v.items())
            # Any other keyword is an annotation or a vendor extension: not read as a schema, not checked.


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
_SEARCHERS: dict[str, cpauto.Searcher] = {}
_SEARCHERS_LOCK = threading.Lock()
MAX_SEARCHERS = 512
MAX_SEARCHER_STATES = 20_000  # larger pattern automata are built again when needed rather than kept


def searcher(pattern: str, where: str) -> cpauto.Searcher:
    """Whether `pattern` matches somewhere in a string, read as Python's `re` reads it (what the validator's
    `re.search` did), in time linear in the string. Kept per pattern, across compiles (patterns recur)."""
    if not isinstance(pattern, str):
        raise GrammarError(f"{where}: regex must be a string, got {_show(pattern)}")
    hit = _SEARCHERS.get(pattern)
    if hit is not None:
        return hit
    s = cpauto.Searcher(cpauto.from_ir(parse_regex(pattern, search=True, where=where, dialect="python")))
    if s.nfa.size <= MAX_SEARCHER_STATES:
        with _SEARCHERS_LOCK:
            if len(_SEARCHERS) >= MAX_SEARCHERS:
                _SEARCHERS.clear()
            _SEARCHERS[pattern] = s
    return s


def _pattern(validator, patrn, instance, schema):
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not searcher(patrn, "pattern").accepts(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator, pprops, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, sub in pprops.items():
        s = searcher(pattern, "patternProperties")
        for k, v in instance.items():
            if s.accepts(k):
                yield from validator.descend(v, sub, path=k, schema_path=pattern)


def _additional_properties(validator, addl, instance, schema):
    # jsonschema's own, with the patternProperties match done by `searcher` instead of re.search.
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    props = schema.get("properties", {})
    matchers = [searcher(p, "patternProperties") for p in schema.get("patternProperties", {})]
    extras = {k for k in instance if k not in props and not any(m.accepts(k) for m in matchers)}
    if validator.is_type(addl, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], addl, path=extra)
    elif not addl and extras:
        yield ValidationError(
            f"additional properties are not allowed ({', '.join(sorted(map(repr, extras)))})"
        )


def _budgeted(fn):
    def keyword(validator, value, instance, schema):
        current().tick()
        return fn(validator, value, instance, schema)

    return keyword


_CLASSES: dict[type, type] = {}


def _validator_class(base: type, has_pattern_properties: bool) -> type:
    """`base` (a stock jsonschema validator class) with the keyword functions described in the module
    docstring; made once per base class and flag."""
    key = (base, has_pattern_properties)
    cls = _CLASSES.get(key)
    if cls is not None:
        return cls
    import jsonschema

    kws = dict(base.VALIDATORS)
    for name, fn in (
        ("pattern", _pattern),
        ("patternProperties", _pattern_properties),
        ("additionalProperties", _additional_properties),
    ):
        if name in kws:
            kws[name] = fn
    if "unevaluatedProperties" in kws and has_pattern_properties:

        def unevaluated(validator, value, instance, schema):
            raise GrammarError(
                "unevaluatedProperties cannot be evaluated for enum/const values in a schema with "
                "patternProperties"
            )

        kws["unevaluatedProperties"] = unevaluated
    cls = jsonschema.validators.extend(base, {k: _budgeted(fn) for k, fn in kws.items()})
    _CLASSES[key] = cls
    return cls


class EnumValidator:
    """The document's validator, for checking enum/const values against the schema around them."""

    def __init__(self, root) -> None:
        import jsonschema
        import referencing
        import referencing.jsonschema

        self._memo: dict[int, tuple[object, object]] = {}
        self.charged = 0  # budget units spent on views
        self._has_pprops = False
        view = self.view(root, top=True)
        base = jsonschema.validators.validator_for(
            view if isinstance(view, dict) else {}, default=jsonschema.Draft202012Validator
        )
        cls = _validator_class(base, self._has_pprops)
        # The resource is made as jsonschema makes it, but in a registry of its own: without the bundled
        # metaschemas, and with a retrieval that refuses.
        spec = referencing.jsonschema.specification_with(
            base.ID_OF(base.META_SCHEMA) or "urn:unknown-dialect", default=referencing.Specification.OPAQUE
        )
        resolver = referencing.Registry(retrieve=_refuse).resolver_with_root(spec.create_resource(view))
        self._root = cls(view, _resolver=resolver)

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
                if k == "patternProperties" and v:
                    self._has_pprops = True
                out[k] = {name: self.view(sub) for name, sub in v.items()}
            else:
                out[k] = self.view(v)
        self._memo[id(x)] = (x, out)  # the original is kept alive with its view, so its id stays unique
        return out

    def accepted(self, values: list, schema) -> list:
        """The values that `schema` (a part of the document, or a schema merged from its parts) accepts."""
        check = self._root.evolve(schema=self.view(schema))
        b = current()
        out = []
        for v in values:
            b.tick()
            if check.is_valid(v):
                out.append(v)
        return out

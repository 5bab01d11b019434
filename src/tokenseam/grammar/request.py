"""Request-level helper for the server: which constraint (if any) an OpenAI/vLLM/llama-server body asks for.

Reads response_format, vLLM's structured_outputs and guided_json/regex/grammar/choice, llama-server
grammar/json_schema, tools+tool_choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .compiled import CompiledGrammar
from .compiler import GrammarCompiler, loads_schema
from .errors import GrammarError
from .json_schema import MAX_WS, PROPERTY_ORDERS

# A tool call is generated as one JSON object of this shape (inside the markers of `tokenseam.toolcalls`):
#     {"name": "<function name>", "arguments": {...}}
# "name" comes first and is one of the allowed function names; "arguments" follows the function's
# `parameters` schema (`{}` when the function declares none: OpenAI's empty parameter list). The server turns
# it into `tool_calls=[{"type": "function", "function": {"name": ..., "arguments": "<the arguments' JSON>"}}]`.


def tool_call_schema(functions: list[dict]) -> dict:
    """The JSON Schema of one call to any of `functions` (OpenAI `function` objects)."""
    branches = []
    for f in functions:
        params = f.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        branches.append(
            {
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _schema_arg(value, what: str):
    if isinstance(value, str):
        value = loads_schema(value, what)
    if not isinstance(value, (dict, bool)):
        raise GrammarError(f"{what} must be a JSON Schema object")
    return value


def _functions(body: dict) -> list[dict]:
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        raise _at(GrammarError("'tools' must be a non-empty array of functions"), "tools")
    out = []
    names = set()
    for i, t in enumerate(tools):
        if (
            not isinstance(t, dict)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), dict)
        ):
            raise _at(
                GrammarError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}'), f"tools[{i}]"
            )
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise _at(
                GrammarError(
                    f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-'; got {name!r}"
                ),
                f"tools[{i}].function.name",
            )
        if name in names:
            raise _at(
                GrammarError(f"tools[{i}].function.name {name!r} is given twice"), f"tools[{i}].function.name"
            )
        names.add(name)
        if "description" in f and not isinstance(f["description"], str):
            raise _at(
                GrammarError(f"tools[{i}].function.description must be a string"),
                f"tools[{i}].function.description",
            )
        if "parameters" in f and not isinstance(f["parameters"], (dict, bool)):
            raise _at(
                GrammarError(f"tools[{i}].function.parameters must be a JSON Schema object"),
                f"tools[{i}].function.parameters",
            )
        if "strict" in f and not isinstance(f["strict"], bool):
            raise _at(
                GrammarError(f"tools[{i}].function.strict must be true or false"),
                f"tools[{i}].function.strict",
            )
        out.append(f)
    return out


FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
JSON_OPTION_TYPES = {"compact": bool, "max_ws": int, "lenient": bool, "property_order": str}


def _json_options(body: dict) -> dict:
    """`json_schema_options` (tokenseam): how a JSON Schema constraint is compiled. See docs/structured-outputs.md."""
    opts = body.get("json_schema_options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise GrammarError('json_schema_options must be an object such as {"compact": true}')
    out = {}
    for k, v in opts.items():
        want = JSON_OPTION_TYPES.get(k)
        if want is None:
            raise GrammarError(
                f"json_schema_options.{k} is not an option (use {', '.join(JSON_OPTION_TYPES)})"
            )
        if k == "property_order":
            if v not in PROPERTY_ORDERS:
                raise GrammarError('json_schema_options.property_order must be "schema" or "any"')
        elif not isinstance(v, want) or (want is int and isinstance(v, bool)):
            raise GrammarError(
                f"json_schema_options.{k} must be {'true or false' if want is bool else 'an integer'}"
            )
        if k == "max_ws" and not 0 <= v <= MAX_WS:
            raise GrammarError(f"json_schema_options.max_ws must be an integer between 0 and {MAX_WS}")
        out[k] = v
    return out


# vLLM's `structured_outputs` (its constraint field since 0.12, where `guided_*` are ignored): exactly one
# constraint, and the two options that apply to JSON.
STRUCTURED_OUTPUTS_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
STRUCTURED_OUTPUTS_OPTIONS = {"disable_any_whitespace": "compact", "disable_additional_properties": "strict"}
NOT_GBNF = (
    "takes GBNF grammars (rules written `name ::= ...`, start rule `root`); this one looks like Lark/EBNF, "
    "which tokenseam does not compile"
)


def _structured_outputs(so) -> tuple:
    """(kind, payload, options) of a vLLM `structured_outputs` object; GrammarError for anything else."""
    if not isinstance(so, dict):
        raise GrammarError('structured_outputs must be an object such as {"json": {...}} or {"regex": "..."}')
    allowed = set(STRUCTURED_OUTPUTS_KINDS) | set(STRUCTURED_OUTPUTS_OPTIONS) | {"whitespace_pattern"}
    unknown = sorted(k for k in so if k not in allowed and not k.startswith("_"))
    if unknown:
        raise GrammarError(
            f"structured_outputs.{unknown[0]} is not a field of structured_outputs "
            f"(use one of {', '.join(STRUCTURED_OUTPUTS_KINDS)})"
        )
    given = [k for k in STRUCTURED_OUTPUTS_KINDS if so.get(k) is not None]
    if len(given) != 1:
        raise GrammarError(
            "structured_outputs needs exactly one of "
            + ", ".join(STRUCTURED_OUTPUTS_KINDS)
            + (f" (got {', '.join(given)})" if given else "")
        )
    kind = given[0]
    options = {}
    for name, option in STRUCTURED_OUTPUTS_OPTIONS.items():
        value = so.get(name, False)
        if not isinstance(value, bool):
            raise GrammarError(f"structured_outputs.{name} must be true or false")
        if value:
            options[option] = True
    if so.get("whitespace_pattern") is not None:
        raise GrammarError(
            "structured_outputs.whitespace_pattern is not supported (disable_any_whitespace is)"
        )
    if options and kind not in ("json", "json_object"):
        raise GrammarError(
            f"structured_outputs.{next(iter(k for k in STRUCTURED_OUTPUTS_OPTIONS if so.get(k)))} "
            f"applies to json and json_object, not to {kind}"
        )
    value = so[kind]
    if kind == "json":
        return "json", _schema_arg(value, "structured_outputs.json"), options
    if kind == "json_object":
        if value is not True:
            raise GrammarError("structured_outputs.json_object must be true")
        return "json", {"type": "object"}, options
    if kind == "regex":
        if not isinstance(value, str):
            raise GrammarError("structured_outputs.regex must be a string")
        return "regex", value, {}
    if kind == "choice":
        return "choice", value, {}
    if kind == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise GrammarError("structured_outputs.grammar must be a non-empty GBNF string")
        if "::=" not in value:
            raise GrammarError("structured_outputs.grammar " + NOT_GBNF)
        return "gbnf", value, {}
    raise GrammarError(
        "structured_outputs.structural_tag is not supported (use json, regex, choice or grammar)"
    )


def _collect(body: dict, route: str) -> list[tuple[str, tuple]]:
    """(source name, (kind, payload, options)) for every constraint the body asks for."""
    found: list[tuple[str, tuple]] = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
            raise GrammarError("response_format must be an object with a 'type'")
        t = rf["type"]
        if t == "json_object":
            schema = rf.get("schema", {"type": "object"})
            found.append(("response_format", ("json", _schema_arg(schema, "response_format.schema"), {})))
        elif t == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise GrammarError("response_format.json_schema must be an object with a 'schema'")
            schema = js.get("schema", rf.get("schema"))
            if schema is None:
                raise GrammarError("response_format.json_schema.schema is missing")
            strict = js.get("strict", False)
            if not isinstance(strict, bool):
                raise GrammarError("response_format.json_schema.strict must be a boolean")
            found.append(
                (
                    "response_format",
                    ("json", _schema_arg(schema, "response_format.json_schema.schema"), {"strict": strict}),
                )
            )
        elif t != "text":
            raise GrammarError(
                f"unsupported response_format type {t!r} (use text, json_object or json_schema)"
            )
    if body.get("structured_outputs") is not None:
        try:
            found.append(("structured_outputs", _structured_outputs(body["structured_outputs"])))
        except GrammarError as e:
            e.param = "structured_outputs"
            raise
    if body.get("guided_json") is not None:
        found.append(("guided_json", ("json", _schema_arg(body["guided_json"], "guided_json"), {})))
    if body.get("guided_regex") is not None:
        if not isinstance(body["guided_regex"], str):
            raise GrammarError("guided_regex must be a string")
        found.append(("guided_regex", ("regex", body["guided_regex"], {})))
    if body.get("guided_grammar") is not None:
        if not isinstance(body["guided_grammar"], str):
            raise GrammarError("guided_grammar must be a GBNF string")
        found.append(("guided_grammar", ("gbnf", body["guided_grammar"], {})))
    if body.get("guided_choice") is not None:
        found.append(("guided_choice", ("choice", body["guided_choice"], {})))
    # llama-server's native fields (documented for /completion; accepted on every route, as llama-server does).
    if body.get("grammar") is not None:
        if not isinstance(body["grammar"], str):
            raise GrammarError("grammar must be a GBNF string")
        if body["grammar"].strip():
            found.append(("grammar", ("gbnf", body["grammar"], {})))
    if body.get("json_schema") is not None:
        found.append(("json_schema", ("json", _schema_arg(body["json_schema"], "json_schema"), {})))
    tools = tool_request(body, route)
    if tools is not None and (tools.mode != "none" or not found):  # `none` gives way to another constraint
        found.append(("tool_choice", ("tools", tools, {})))
    return found


@dataclass
class ToolRequest:
    """What a chat request's `tools`, `tool_choice` and `parallel_tool_calls` ask for."""

    tools: list[dict]  # the tools, each {"type": "function", "function": {...}} (checked)
    mode: str  # auto, required or none (a named function is `required` with `callable` that one)
    parallel: bool
    callable: list[dict]  # the functions a call may name

    def call_schema(self) -> dict | None:
        return tool_call_schema(self.callable) if self.mode != "none" else None


def tool_request(body: dict, route: str) -> ToolRequest | None:
    """The tool request of a chat body with `tools`, else None. `tool_choice` defaults to `auto` when tools are
    given (OpenAI's rule). Raises GrammarError naming the field."""
    tc = body.get("tool_choice")
    if not route.endswith("/chat/completions") or body.get("tools") in (None, []):
        if tc not in (None, "none", "auto"):
            _functions(body)  # raises: forcing a call needs tools
        return None
    funcs = _functions(body)
    tools = [{"type": "function", "function": f} for f in funcs]
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _at(GrammarError("parallel_tool_calls must be true or false"), "parallel_tool_calls")
    if tc is None or tc in ("auto", "required", "none"):
        return ToolRequest(tools, tc or "auto", parallel, funcs)
    if (
        isinstance(tc, dict)
        and isinstance(tc.get("function"), dict)
        and isinstance(tc["function"].get("name"), str)
    ):
        name = tc["function"]["name"]
        chosen = [f for f in funcs if f["name"] == name]
        if not chosen:
            raise _at(
                GrammarError(f"tool_choice names function {name!r}, which is not in 'tools'"), "tool_choice"
            )
        return ToolRequest(tools, "required", parallel, chosen)
    raise _at(
        GrammarError(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        ),
        "tool_choice",
    )


_CALL_PTR = re.compile(r"#(?:/anyOf/(\d+))?/properties/arguments((?:/[^\s/,;:)'\"]+)*)")


def _in_tools(e: GrammarError, tools: ToolRequest) -> GrammarError:
    """A compile error of the tool-call schema, its JSON pointers rewritten from the call wrapper
    (`#/anyOf/i/properties/arguments/...`) to the request's field (`tools[k].function.parameters.properties.x`),
    which also becomes the error's `param`."""
    index = {f["name"]: k for k, t in enumerate(tools.tools) for f in [t["function"]]}
    first: list[str] = []

    def field(m: re.Match) -> str:
        branch = int(m.group(1) or 0)
        k = index[tools.callable[branch]["name"]] if branch < len(tools.callable) else 0
        path = f"tools[{k}].function.parameters" + m.group(2).replace("/", ".")
        first.append(path)
        return path

    out = GrammarError(_CALL_PTR.sub(field, str(e)))
    out.param = first[0] if first else "tools"
    return out


def _at(e: GrammarError, param: str) -> GrammarError:
    e.param = param
    return e


def constraint_from_request(compiler: GrammarCompiler, body: dict, route: str) -> CompiledGrammar | None:
    """The compiled grammar a request body asks for, or None. Bad or conflicting options raise GrammarError."""
    if not isinstance(body, dict):
        raise GrammarError("request body must be a JSON object")
    found = _collect(body, route)
    try:
        json_opts = _json_options(body)
        if json_opts and any(kind == "tools" for _, (kind, _, _) in found):
            raise GrammarError(
                "json_schema_options does not apply to tool calls (their arguments are always compact)"
            )
        if json_opts and not any(kind == "json" for _, (kind, _, _) in found):
            raise GrammarError(
                "json_schema_options needs a JSON Schema constraint (response_format, structured_outputs, guided_json, "
                "json_schema or a forced tool call)"
            )
    except GrammarError as e:
        e.param = "json_schema_options"
        raise
    if not found:
        return None
    if len(found) > 1:
        raise GrammarError(
            "conflicting output constraints in one request: "
            + ", ".join(name for name, _ in found)
            + " (use only one)"
        )
    source, (kind, payload, options) = found[0]
    if kind == "tools":
        try:
            return compiler.compile_tool_answer(payload.call_schema(), payload.mode, payload.parallel)
        except GrammarError as e:
            raise _in_tools(e, payload) from e
    try:
        if kind == "json":
            return compiler.compile_json_schema(payload, **{**json_opts, **options})
        if kind == "regex":
            return compiler.compile_regex(payload)
        if kind == "gbnf":
            return compiler.compile_gbnf(payload)
        return compiler.compile_choice(payload)
    except GrammarError as e:
        e.param = source  # the request field at fault (the server's error `param`)
        raise

"""Tool calls as text: the one format the prompt shows the model and the grammar makes it write.

A call is `<tool_call>{"name": "<function>", "arguments": {...}}</tool_call>`, the JSON compact, optionally with
a newline inside each marker (the Hermes/Qwen format; templates that render tools that way are used as they
are). Calls follow the answer's text, if any, one after the other.

- `render_messages`: the messages and `tools` of an OpenAI request in the form a chat template takes. A
  template that renders tools itself in this format (it reads `tools` and writes `<tool_call>`) gets the
  tools and the calls as Hugging Face templates take them (arguments as objects). Any other template gets
  the fallback: the tools described in the system message (`FALLBACK_PROMPT`), earlier calls written into
  the assistant turns in the format above, and tool results as user turns in `<tool_response>` blocks.
- `split_output`: generated text -> (content, calls, whether a call is still open).
- `held_back`: how much of a stream's text may not be sent yet, because it could be the start of a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"

FALLBACK_PROMPT = (
    "You can call functions. To call one, reply with the call alone, written "
    '{open}{{"name": <function name>, "arguments": <arguments as a JSON object>}}{close}, for example\n'
    "{example}\nYou may write several calls one after the other. A function's result comes back to you in a "
    "{result} block. When no call is needed, answer in plain text.\nThe functions:\n{functions}"
)


def _example_value(schema: Any) -> Any:
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    return {"string": "...", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(
        t, "..."
    )


def example_call(tool: dict) -> str:
    """A call to `tool` with its required arguments filled with placeholders (the fallback prompt's example)."""
    params = tool["function"].get("parameters") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    required = params.get("required") if isinstance(params, dict) else None
    args = {}
    if isinstance(props, dict) and isinstance(required, list):
        args = {k: _example_value(props.get(k)) for k in required if isinstance(k, str) and k in props}
    return call_text(tool["function"]["name"], args)


class ToolFormatError(ValueError):
    """A message's tool call or tool result is malformed; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def native_tools(template_source: str) -> bool:
    """Whether a chat template renders `tools` itself, in this module's call format."""
    return "tools" in template_source and OPEN in template_source


def _arguments(value: Any, where: str) -> Any:
    # OpenAI sends arguments as a JSON string; Hugging Face templates take an object.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ToolFormatError(f"{where} is not valid JSON", where) from None
    if isinstance(value, dict):
        return value
    raise ToolFormatError(f"{where} must be a JSON string", where)


def _calls(message: dict, i: int) -> list[dict]:
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ToolFormatError(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
    out = []
    for k, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{k}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolFormatError(
                f"{where}.function.name must be a non-empty string", f"{where}.function.name"
            )
        out.append(
            {
                "id": call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{k}",
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "arguments": _arguments(fn.get("arguments", "{}"), f"{where}.function.arguments"),
                },
            }
        )
    return out


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it (compact JSON, as the grammar generates it)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False, separators=(",", ":"))
    return OPEN + body + CLOSE


def describe_tools(tools: list[dict]) -> str:
    lines = []
    for t in tools:
        f = t["function"]
        entry = {"name": f["name"]}
        if isinstance(f.get("description"), str):
            entry["description"] = f["description"]
        entry["parameters"] = f.get("parameters", {"type": "object"})
        lines.append(json.dumps(entry, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)


def render_messages(
    messages: list[dict], tools: list[dict] | None, native: bool
) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) to render with the chat template (see the module docstring). Raises ToolFormatError."""
    if native:
        out = []
        for i, m in enumerate(messages):
            calls = _calls(m, i)
            out.append(
                {**m, "tool_calls": calls} if calls else {k: v for k, v in m.items() if k != "tool_calls"}
            )
        return out, tools or None
    out = []
    names: dict[str, str] = {}  # tool_call_id -> function name, for the results that answer them
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "assistant":
            calls = _calls(m, i)
            for c in calls:
                names[c["id"]] = c["function"]["name"]
            text = (m.get("content") or "") + "".join(
                call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls
            )
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            call_id = m.get("tool_call_id")
            result: dict[str, Any] = {}
            if isinstance(call_id, str) and call_id in names:
                result["name"] = names[call_id]
            result["content"] = m.get("content", "")
            block = RESULT_OPEN + json.dumps(result, ensure_ascii=False) + RESULT_CLOSE
            if out and out[-1]["role"] == "user" and out[-1].get("_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}  # parallel calls' results
            else:
                out.append({"role": "user", "content": block, "_results": True})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    out = [{k: v for k, v in m.items() if k != "_results"} for m in out]
    if tools:
        prompt = FALLBACK_PROMPT.format(
            open=OPEN,
            close=CLOSE,
            result=RESULT_OPEN,
            example=example_call(tools[0]),
            functions=describe_tools(tools),
        )
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


@dataclass
class Split:
    content: str  # the text before the first call (all of it when there is none)
    calls: list[tuple[str, str, int]]  # (function name, arguments as JSON text, where the call's text ends)
    rest: str  # what follows the last complete call: an open call, text, or a block that is not a call

    @property
    def is_tool_answer(self) -> bool:
        """Calls, and nothing after them but layout."""
        return bool(self.calls) and not self.rest.strip()


def _arguments_text(raw: str, name: str, arguments: Any) -> str:
    # The arguments exactly as written when the call is laid out as the grammar writes it (name first,
    # arguments last); re-serialized otherwise.
    body = raw.strip()
    head = '{"name":' + json.dumps(name, ensure_ascii=False) + ',"arguments":'
    if body.startswith(head) and body.endswith("}"):
        inner = body[len(head) : -1]
        try:
            if json.loads(inner) == arguments:
                return inner
        except ValueError:
            pass
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def split_output(text: str) -> Split:
    """The answer's text and its complete calls. A block that does not parse as {"name", "arguments"} (only
    possible without the grammar, e.g. under the test constraint hook) ends the calls: it and what follows
    are `rest`."""
    at = text.find(OPEN)
    if at < 0:
        return Split(text, [], "")
    calls: list[tuple[str, str, int]] = []
    pos = at
    while text.startswith(OPEN, pos):
        end = text.find(CLOSE, pos)
        if end < 0:
            break
        raw = text[pos + len(OPEN) : end]
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
            break
        done = end + len(CLOSE)
        calls.append((obj["name"], _arguments_text(raw, obj["name"], obj["arguments"]), done))
        pos = done + (len(text[done:]) - len(text[done:].lstrip()))
    return Split(text[:at], calls, text[calls[-1][2] if calls else at :])


def held_back(text: str) -> int:
    """Characters at the end of `text` that may be the beginning of `OPEN` (not to be streamed as content
    until the next characters say whether a call starts)."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0

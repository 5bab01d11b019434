"""ID-exact relay: with `return_token_ids`, every relayed event carries the ids generated since the last one
(`token_ids`, `[]` when none) and each choice's final event (the one with its `finish_reason`) carries the
whole list (`all_token_ids`), whatever shape the upstream streams in:

- tokenseam already streams this shape (it is checked, not trusted);
- vLLM streams each delta's ids as `token_ids` and has no final list: the gateway adds it;
- llama-server names them `tokens` (asked for with `return_tokens`): renamed.

An upstream that was asked for ids and sends none for a choice, or whose final list disagrees with the ids
it streamed, is an error (502 before the response, an error event in a stream, never stored in the cache):
ids are never silently lost or invented. The cache stores the normalized events, so a hit replays the same
ids event by event.
"""

from __future__ import annotations

from typing import Any


class LostIds(ValueError):
    """The upstream's ids are missing or inconsistent."""


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    return None


def _choice_ids(ch: dict[str, Any]) -> list[int] | None:
    got = _ids(ch.get("token_ids"))
    if got is None:
        got = _ids(ch.get("tokens"))
        if got is not None:
            del ch["tokens"]
    return got


class IdRelay:
    """One request's relay state (ids so far per choice index)."""

    def __init__(self, want: bool) -> None:
        self.want = want
        self.ids: dict[int, list[int]] = {}
        self.seen: set[int] = set()

    def event(self, ev: dict[str, Any]) -> dict[str, Any]:
        if not self.want:
            return ev
        for ch in ev.get("choices") or ():
            if not isinstance(ch, dict):
                continue
            i = ch.get("index", 0)
            i = i if isinstance(i, int) else 0
            acc = self.ids.setdefault(i, [])
            got = _choice_ids(ch)
            if got is not None:
                acc.extend(got)
                self.seen.add(i)
            ch["token_ids"] = list(got or [])
            if ch.get("finish_reason") is not None:
                full = _ids(ch.get("all_token_ids"))
                if full is not None and full != acc:
                    raise LostIds(
                        f"choice {i}: the upstream's final id list ({len(full)} ids) differs from the ids it "
                        f"streamed ({len(acc)})"
                    )
                if i not in self.seen:
                    raise LostIds(
                        f"choice {i}: the upstream sent no token ids although return_token_ids was set"
                    )
                ch["all_token_ids"] = list(acc)
        return ev

    def response(self, data: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed response: each choice's `token_ids` is the whole list."""
        if not self.want:
            return data
        for ch in data.get("choices") or ():
            if not isinstance(ch, dict):
                continue
            got = _choice_ids(ch)
            if got is None:
                raise LostIds(
                    f"choice {ch.get('index', 0)}: the upstream sent no token ids although return_token_ids was set"
                )
            ch["token_ids"] = got
        return data

"""Load a model and build the app: shared by `tokenseam serve`, the tests and the benchmarks."""

from __future__ import annotations

import gc
from pathlib import Path

from ..engine import BackendConfig, Engine, LlamaCppBackend
from ..engine.chat_template import load_template_option
from ..models import ALIASES, DEFAULT_MODEL, resolve_model
from .app import create_app
from .state import ServerState, overlap_compiles


def build_server(
    model: str | None = None,
    n_ctx: int = 4096,
    parallel: int = 8,
    threads: int = 0,
    max_queue: int = 64,
    n_batch: int = 512,
    prefix_cache_tokens: int = 16384,
    prefix_block: int = 16,
    resident_tokens: int = -1,
    cache_mode: str = "off",
    cache_truncated: bool | None = None,
    cache_store: str = "sqlite",
    cache_ttl: float | None = None,
    api_keys: list[str] | None = None,
    allowed_hosts: list[str] | None = None,
    cors_origins: list[str] | None = None,
    max_memory_mb: int | None = None,
    grammar_seconds: float | None = None,
    grammar_cache_mb: int | None = None,
    turn_memory_mb: int = 64,
    tokenize_memo_mb: int = 16,
    flash_attn: str = "auto",
    grammar_overlap: str = "auto",
    chat_template: str | None = None,
):
    """Load a model and build the app. The response cache is off unless `cache_mode` says otherwise
    (`tokenseam serve` turns it on: deterministic requests, SQLite store). `api_keys`, `allowed_hosts` and
    `cors_origins` configure the HTTP guard (see `create_app`); `max_memory_mb` caps the process's resident
    memory that grammar compiles may grow it to; `grammar_seconds` each compile's time budget; `grammar_cache_mb`
    the memory compiled grammars may hold (None: grammar.memory.DEFAULT_BUDGET_MB); `turn_memory_mb` the memory
    the ids of earlier chat answers may hold (0: chat histories are always re-tokenized); `tokenize_memo_mb` the
    memory for the ids of recent long prompts, whose beginnings later prompts reuse (0: every prompt is tokenized
    whole); `flash_attn`
    llama.cpp's flash attention ("auto", "on", "off": see LlamaCppBackend.flash_attention_for);
    `grammar_overlap` whether a request's grammar compiles while its prompt is read ("on", "off", or "auto":
    see `overlap_compiles`); `chat_template` a built-in template's name or a template file to render chats with
    instead of the GGUF's (ChatTemplateError if it cannot be used)."""
    overlap_compiles(grammar_overlap, threads)  # a bad setting fails before the model loads
    template = load_template_option(chat_template) if chat_template is not None else None
    path = resolve_model(model)
    backend = LlamaCppBackend(
        path,
        BackendConfig(
            n_ctx=n_ctx,
            n_seq=parallel,
            n_threads=threads,
            n_batch=n_batch,
            prefix_cache_tokens=prefix_cache_tokens,
            prefix_block=prefix_block,
            resident_tokens=resident_tokens,
            flash_attn=flash_attn,
        ),
    )
    engine = Engine(backend, max_queue=max_queue)
    name = model or DEFAULT_MODEL
    alias = name if name in ALIASES else None
    model_id = alias or Path(path).stem
    state = ServerState(
        engine,
        model_id,
        aliases=tuple(a for a in (alias, Path(path).stem) if a),
        max_memory_mb=max_memory_mb,
        grammar_seconds=grammar_seconds,
        grammar_cache_mb=grammar_cache_mb,
        turn_memory_mb=turn_memory_mb,
        tokenize_memo_mb=tokenize_memo_mb,
        grammar_overlap=grammar_overlap,
        chat_template=template,
    )
    state.warm_up()
    if cache_mode != "off":
        from ..respcache import ResponseCache, open_store

        state.response_cache = ResponseCache(
            open_store(cache_store),
            mode=cache_mode,
            ttl_seconds=cache_ttl,
            cache_truncated=cache_truncated,
            namespace=f"{model_id}:{backend.vocab.fingerprint}",
            registry=state.metrics.registry,
        )
    return create_app(state, api_keys=api_keys, allowed_hosts=allowed_hosts, cors_origins=cors_origins), state


# Collector thresholds for a serving process: a collection every 100,000 net allocations instead of 700, and
# the older generations 50 and 100 times rarer. A grammar compile allocates millions of small objects while
# its NFA is live, and at the default thresholds the collector rescans that growing graph again and again
# (about half of `build_nfa`'s time on large schemas).
SERVING_GC_THRESHOLDS = (100_000, 50, 100)


# A compile holding the interpreter lock makes the engine and event-loop threads wait up to the switch interval
# (5 ms by default) each time they need it; 0.5 ms keeps that wait small next to a decode step.
SERVING_SWITCH_INTERVAL = 0.0005


def settle_serving_process() -> None:
    """What `tokenseam serve` does to its process once the model is loaded, and what a benchmark that runs the
    server in its own process does to measure the same thing: the heap settled (`settle_heap`) and the
    interpreter's switch interval shortened."""
    import sys

    settle_heap()
    sys.setswitchinterval(SERVING_SWITCH_INTERVAL)


def settle_heap() -> None:
    """Prepare a long-running process that compiles grammars and decodes: collect once, move what is loaded for
    good (model, vocabulary tables, code) out of the collector's reach, so a full collection during decoding
    (70-200 ms measured) does not walk it, and collect less often (`SERVING_GC_THRESHOLDS`). The library itself
    never changes the collector; the process that owns it does, once, here."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVING_GC_THRESHOLDS)

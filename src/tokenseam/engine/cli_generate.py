"""`tokenseam generate "prompt"`: stream a completion to the terminal from a local model."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--model", default=None, help="smollm2 (default), gemma3, or a .gguf path")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message in the chat template"
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--show-ids", action="store_true", help="print the generated token ids at the end")
    p.add_argument(
        "--token-healing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="roll back the prompt's unstable tail and regenerate it (default: on, off with --chat)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..models import ModelNotFoundError, resolve_model
    from ..vocab import VocabularyError
    from . import (
        BackendConfig,
        ChoiceEvent,
        Engine,
        EngineError,
        GenerationRequest,
        LlamaCppBackend,
        SamplingParams,
    )
    from .chat_template import ChatTemplate
    from .llm_engine import run_sync

    if args.max_tokens < 1:
        print("error: --max-tokens must be at least 1", file=sys.stderr)
        return 2
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
    )
    try:
        backend = LlamaCppBackend(
            resolve_model(args.model), BackendConfig(n_ctx=4096, n_seq=1, n_threads=args.threads)
        )
    except (ModelNotFoundError, VocabularyError, EngineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    engine = Engine(backend)
    try:
        if args.chat:
            ids = ChatTemplate(backend.chat_template, backend.vocab, backend.tokenizer).encode(
                [{"role": "user", "content": args.prompt}]
            )
        else:
            ids = backend.tokenizer.encode(args.prompt, add_special=True)
        request = GenerationRequest(ids, params)
        if args.token_healing if args.token_healing is not None else not args.chat:
            from ..healing import HealingConstraint, heal_prompt

            healed = heal_prompt(ids, backend.vocab)
            if healed.healed and healed.kept_ids:
                removed = healed.removed_bytes
                request = GenerationRequest(
                    healed.kept_ids,
                    params,
                    text_skip_bytes=len(removed),
                    constraint_factory=lambda: HealingConstraint(backend.vocab, removed),
                )
                if args.show_ids:
                    print(f"[healed: removed {healed.removed_ids} = {removed!r}]", file=sys.stderr)
        all_ids: list[int] = []
        reason = None
        for ev in run_sync(engine, request):
            if isinstance(ev, ChoiceEvent):
                all_ids += ev.token_ids
                sys.stdout.write(ev.text)
                sys.stdout.flush()
                reason = ev.finish_reason or reason
            elif ev.error:
                print(f"\nerror: {ev.error}", file=sys.stderr)
                return 1
        sys.stdout.write("\n")
        if args.show_ids:
            print(f"[{len(all_ids)} tokens, finish_reason={reason}] {all_ids}", file=sys.stderr)
        return 0
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        engine.shutdown()
        backend.close()

"""The `vllm.general_plugins` entry point of the `tokenseam-vllm` distribution: adds the structured-output
backend "tokenseam" to an unmodified vLLM.

vLLM has no registration API for backends (their names are a closed Literal, the manager picks one with an
if/elif), so `register()` patches four places, each named in `INTERNALS` so a test can check that an
upgraded vLLM still has them:
1. the `backend` Literal of StructuredOutputsConfig gains "tokenseam" (`--structured-outputs-config
   '{"backend": "tokenseam"}'` then parses);
2. SamplingParams._validate_structured_outputs: with the tokenseam backend, every vocabulary-free compile check
   runs when the request arrives, so a grammar tokenseam cannot represent exactly is a 400 naming the
   keyword (never an engine error, never a looser grammar);
3. StructuredOutputManager.grammar_init / _create_grammar: the manager builds a TokenseamBackend and hands it
   the request's options (strict, compact, healing bytes), still on vLLM's compile thread pool;
4. the OpenAI front end's response_format conversion keeps `json_schema.strict` (vLLM drops it) as the
   request's `disable_additional_properties`, which the tokenseam backend reads as strict.

It runs in every vLLM process, so it imports vLLM only: the grammar engine (and numba, which must not load
in a vLLM worker) is imported by the backend, in the engine-core process, on first use.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import typing

from .xargs import HEALING_KEY, healing_bytes, property_order

log = logging.getLogger("tokenseam.vllm")

BACKEND = "tokenseam"

# (module, attribute path) of every vLLM internal the adapter touches; tests/vllm checks them all.
INTERNALS = (
    ("vllm.config.structured_outputs", "StructuredOutputsBackend"),
    ("vllm.config.structured_outputs", "StructuredOutputsConfig"),
    ("vllm.sampling_params", "SamplingParams._validate_structured_outputs"),
    ("vllm.sampling_params", "StructuredOutputsParams"),
    ("vllm.v1.structured_output", "StructuredOutputManager.grammar_init"),
    ("vllm.v1.structured_output", "StructuredOutputManager._create_grammar"),
    ("vllm.v1.structured_output.backend_types", "StructuredOutputBackend"),
    ("vllm.v1.structured_output.backend_types", "StructuredOutputGrammar"),
    ("vllm.v1.structured_output.backend_types", "StructuredOutputOptions"),
    ("vllm.v1.structured_output.request", "get_structured_output_key"),
    ("vllm.entrypoints.generate.base.protocol", "structured_outputs_from_response_format"),
    ("vllm.entrypoints.openai.chat_completion.protocol", "structured_outputs_from_response_format"),
    ("vllm.entrypoints.openai.completion.protocol", "structured_outputs_from_response_format"),
    ("vllm.exceptions", "VLLMValidationError"),
    ("vllm.tokenizers", "cached_tokenizer_from_config"),
    ("vllm.v1.sample.logits_processor", "LogitsProcessor"),
    ("vllm.v1.sample.logits_processor", "BatchUpdate"),
    ("vllm.v1.sample.logits_processor", "MoveDirectionality"),
)

# Attributes read on objects vLLM hands over (checked on instances by the same test).
SAMPLING_PARAMS_ATTRIBUTES = ("structured_outputs", "extra_args", "all_stop_token_ids")
STRUCTURED_OUTPUTS_FIELDS = (
    "json_object",
    "disable_any_whitespace",
    "disable_additional_properties",
    "_backend",
)

_registered = False


def register() -> None:
    """Patch vLLM (idempotent; vLLM may load plugins more than once per process)."""
    global _registered
    if _registered:
        return
    _registered = True
    # The grammar engine's numba functions are cached per environment, filled by `tokenseam vllm setup`.
    os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(sys.prefix, "tokenseam-numba-cache"))
    _add_backend_name()
    _patch_validation()
    _patch_manager()
    _patch_response_format()


def _add_backend_name() -> None:
    from pydantic.dataclasses import rebuild_dataclass
    from vllm.config import structured_outputs as so

    names = typing.get_args(so.StructuredOutputsBackend)
    if BACKEND in names:
        return
    literal = typing.Literal[names + (BACKEND,)]  # type: ignore[valid-type]
    cls = so.StructuredOutputsConfig
    so.StructuredOutputsBackend = literal
    cls.__annotations__["backend"] = literal
    cls.__dataclass_fields__["backend"].type = literal
    rebuild_dataclass(cls, force=True)


_checker = None


def _check(params) -> None:
    """Every vocabulary-free compile check of the request's grammar (front-end process)."""
    global _checker
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.request import get_structured_output_key

    from ..grammar import GrammarError
    from .requests import PARAM, Checker, plan

    so = params.structured_outputs
    kind, spec = get_structured_output_key(so)
    try:
        order = property_order(params.extra_args)
    except ValueError as e:
        raise VLLMValidationError(f"{e} (tokenseam backend)", parameter="vllm_xargs") from None
    try:
        p = plan(
            kind.name,
            spec,
            strict=bool(so.disable_additional_properties),
            compact=bool(so.disable_any_whitespace),
            property_order=order,
        )
        if _checker is None:
            _checker = Checker()
        _checker.check(p)
    except GrammarError as e:
        from ..grammar.json_schema import LENIENT_HINT

        # vLLM offers no lenient mode (a looser grammar than asked for is never served): drop that hint.
        message = str(e).replace(LENIENT_HINT, "")
        raise VLLMValidationError(f"{message} (tokenseam backend)", parameter=PARAM.get(kind.name)) from None


HEALING_PROCESSOR = "tokenseam.vllm.healing_processor:HealingLogitsProcessor"
# The grammar memory budget of the backend's compiler, in MB (as `tokenseam serve --grammar-cache-mb`), for the
# engine-core process; `tokenseam vllm serve --grammar-cache-mb` sets it (requests.grammar_cache_bytes reads it).
CACHE_MB_ENV = "TOKENSEAM_GRAMMAR_CACHE_MB"
MAX_CACHE_MB = 1 << 20


def _healing_processor_loaded(model_config) -> bool:
    """Whether vLLM was started with the healing processor (`--logits-processors`, by name or class)."""
    for proc in getattr(model_config, "logits_processors", None) or []:
        name = proc if isinstance(proc, str) else f"{proc.__module__}:{proc.__qualname__}"
        if name.replace(".HealingLogitsProcessor", ":HealingLogitsProcessor") == HEALING_PROCESSOR:
            return True
    return False


def _patch_validation() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    original = SamplingParams._validate_structured_outputs
    if getattr(original, "_tokenseam", False):
        return

    @functools.wraps(original)
    def validate(self, model_config, structured_outputs_config, tokenizer):
        try:
            removed = healing_bytes(self.extra_args)
        except ValueError as e:  # vLLM answers a bare ValueError from here with a 500
            raise VLLMValidationError(str(e), parameter=f"vllm_xargs.{HEALING_KEY}") from None
        if self.structured_outputs is None:
            if removed and not _healing_processor_loaded(model_config):
                raise VLLMValidationError(
                    f"vllm_xargs.{HEALING_KEY} needs the healing logits processor, which this server does not "
                    f"load (start vLLM with --logits-processors {HEALING_PROCESSOR}, as `tokenseam vllm serve` "
                    "does); it is refused rather than ignored",
                    parameter=f"vllm_xargs.{HEALING_KEY}",
                )
            return original(self, model_config, structured_outputs_config, tokenizer)
        if structured_outputs_config is None:
            return original(self, model_config, structured_outputs_config, tokenizer)
        backend = structured_outputs_config.backend
        if backend != BACKEND:
            if removed:
                raise VLLMValidationError(
                    f"vllm_xargs.{HEALING_KEY} with a grammar needs the tokenseam structured-output backend "
                    f"(this server runs {backend!r}): two masks on one request would conflict",
                    parameter=f"vllm_xargs.{HEALING_KEY}",
                )
            return original(self, model_config, structured_outputs_config, tokenizer)
        if getattr(model_config, "is_diffusion", False):
            raise VLLMValidationError("structured outputs are not supported for diffusion language models")
        if tokenizer is None:
            raise VLLMValidationError("structured outputs need a tokenizer (not with skip_tokenizer_init)")
        requested = self.structured_outputs._backend
        if requested and requested != BACKEND:
            raise VLLMValidationError(
                f"the request asks for backend {requested!r}; this server runs {BACKEND!r} "
                "(per-request backends are not supported)"
            )
        self.structured_outputs._backend = BACKEND
        if self.structured_outputs.json_object is False:
            raise VLLMValidationError("structured_outputs.json_object must be true if set")
        _check(self)
        self.structured_outputs.__post_init__()

    validate._tokenseam = True  # type: ignore[attr-defined]
    SamplingParams._validate_structured_outputs = validate


def _patch_manager() -> None:
    from vllm.v1.structured_output import StructuredOutputManager

    grammar_init = StructuredOutputManager.grammar_init
    if getattr(grammar_init, "_tokenseam", False):
        return
    create = StructuredOutputManager._create_grammar

    @functools.wraps(grammar_init)
    def init(self, request):
        so_request = request.structured_output_request
        if (
            self.backend is None
            and so_request is not None
            and request.sampling_params is not None
            and request.sampling_params.structured_outputs._backend == BACKEND
        ):
            from .backend import TokenseamBackend

            self.backend = TokenseamBackend(
                self.vllm_config,
                tokenizer=self.tokenizer,
                vocab_size=self.vllm_config.model_config.get_vocab_size(),
            )
        return grammar_init(self, request)

    @functools.wraps(create)
    def create_grammar(self, request):
        from .backend import TokenseamBackend

        if not isinstance(self.backend, TokenseamBackend):
            return create(self, request)
        params = request.sampling_params
        so = params.structured_outputs
        kind, spec = request.structured_output_request.structured_output_key
        try:
            return self.backend.compile_grammar(
                kind,
                spec,
                stop_token_ids=params.all_stop_token_ids,
                strict=bool(so.disable_additional_properties),
                compact=True if so.disable_any_whitespace else None,
                healing=healing_bytes(params.extra_args),
                property_order=property_order(params.extra_args),
            )
        except Exception:
            log.exception("tokenseam: failed to compile the grammar of request %s", request.request_id)
            raise

    init._tokenseam = True  # type: ignore[attr-defined]
    StructuredOutputManager.grammar_init = init
    StructuredOutputManager._create_grammar = create_grammar


def _patch_response_format() -> None:
    import importlib

    from vllm.entrypoints.generate.base import protocol as base

    original = base.structured_outputs_from_response_format
    if getattr(original, "_tokenseam", False):
        return

    @functools.wraps(original)
    def convert(structured_outputs, response_format):
        out = original(structured_outputs, response_format)
        js = getattr(response_format, "json_schema", None) if response_format is not None else None
        if out is not None and getattr(response_format, "type", None) == "json_schema" and js is not None:
            if js.strict:
                out.disable_additional_properties = True
        return out

    convert._tokenseam = True  # type: ignore[attr-defined]
    base.structured_outputs_from_response_format = convert
    for name in (
        "vllm.entrypoints.openai.chat_completion.protocol",
        "vllm.entrypoints.openai.completion.protocol",
    ):
        module = importlib.import_module(name)
        if getattr(module, "structured_outputs_from_response_format", None) is original:
            module.structured_outputs_from_response_format = convert

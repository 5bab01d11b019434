"""Background load for benchmarks: the embedded engine decoding N unconstrained streams in this process.

A grammar engine in `tokenseam serve` computes masks beside the engine thread, which holds the GIL for its
scheduling and sampling and shares the CPU caches with llama.cpp's decode. `BusyEngine` recreates that: it
keeps N streams generating (each finished stream is replaced at once) until closed, and counts the tokens, so
a report can say how much work ran beside the timed code.
"""

from __future__ import annotations

import threading
import time

PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle. Chapter 1:"


class BusyEngine:
    """N streams of sampled text (temperature 1, no end token) on the embedded engine, kept running."""

    def __init__(self, streams: int, model: str = "smollm2", threads: int = 1, max_tokens: int = 256) -> None:
        from ..engine.backend import BackendConfig, LlamaCppBackend
        from ..engine.llm_engine import Engine
        from ..engine.sampling import SamplingParams
        from ..engine.sequence import GenerationRequest
        from ..models import resolve_model
        from ..vocab import Tokenizer

        if streams < 1:
            raise ValueError("streams must be >= 1")
        self.streams = streams
        backend = LlamaCppBackend(
            resolve_model(model),
            BackendConfig(n_ctx=streams * (max_tokens + 64), n_seq=streams, n_threads=threads),
        )
        self.engine = Engine(backend, max_queue=2 * streams)
        prompt = Tokenizer.from_gguf(resolve_model(model)).encode(PROMPT)
        self._request = lambda seed: GenerationRequest(
            prompt_ids=list(prompt),
            params=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True),
        )
        self.tokens = 0
        self._free = threading.Semaphore(streams)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._feeder = threading.Thread(target=self._feed, name="busy-feeder", daemon=True)
        self._feeder.start()

    def _emit(self, events) -> None:
        from ..engine.sequence import ChoiceEvent, RequestDone

        n = 0
        for ev in events:
            if isinstance(ev, ChoiceEvent):
                n += len(ev.token_ids)
            elif isinstance(ev, RequestDone):
                self._free.release()
        if n:
            with self._lock:
                self.tokens += n

    def _feed(self) -> None:
        seed = 0
        while not self._stop.is_set():
            if not self._free.acquire(timeout=0.1):
                continue
            if self._stop.is_set():
                break
            seed += 1
            self.engine.submit(self._request(seed), self._emit)

    def wait_decoding(self, timeout: float = 60.0) -> bool:
        """Wait until every stream has decoded a token (its prompt is read); False on timeout."""
        end = time.perf_counter() + timeout
        while self.tokens < self.streams:
            if time.perf_counter() > end:
                return False
            time.sleep(0.05)
        return True

    def tokens_per_second(self) -> float:
        """Tokens decoded per second since the engine started."""
        return self.tokens / max(1e-9, time.perf_counter() - self._t0)

    def close(self) -> None:
        self._stop.set()
        self._feeder.join(timeout=5)
        self.engine.shutdown()

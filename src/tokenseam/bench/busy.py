"""Background load for benchmarks: the embedded engine decoding N unconstrained streams in this process.

A grammar engine in `tokenseam serve` computes masks beside the engine thread, which holds the GIL for its
scheduling and sampling and shares the CPU caches with llama.cpp's decode. `BusyEngine` recreates that: it
keeps N streams generating (each finished stream is replaced at once) until closed, and counts the tokens, so
a report can say how much work ran beside the timed code. It can be paused between timed stretches, so two
engines in two processes can take turns with only one of them beside decoding streams at a time.
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
        # pause(): the engine thread parks in its next emit (every step emits), so no decode runs until resume().
        self._cv = threading.Condition()
        self._paused = self._parked = False
        # Decoding time and tokens of the stretches before the current one, which began at `_since` (tokens are
        # added at a pause and the count at a resume taken off, so the sum covers decoding stretches only).
        self._active_s = 0.0
        self._active_tokens = 0
        self._free = threading.Semaphore(streams)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._since = time.perf_counter()
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
        with self._cv:
            if self._paused:
                self._parked = True
                self._cv.notify_all()
                while self._paused:
                    self._cv.wait()
                self._parked = False

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
        """Tokens decoded per second while decoding: since the engine started, less the time it was paused."""
        with self._cv:
            active, tokens = self._active_s, self._active_tokens
            if not self._paused:
                active += time.perf_counter() - self._since
                tokens += self.tokens
        return tokens / max(1e-9, active)

    def pause(self, timeout: float = 60.0) -> bool:
        """Stop decoding: returns once the engine thread is parked in a step's emit, after its decode (False if
        it did not get there within `timeout` seconds). Decoding goes on at resume()."""
        with self._cv:
            if not self._paused:
                self._paused = True
                self._active_s += time.perf_counter() - self._since
                self._active_tokens += self.tokens
            return self._cv.wait_for(lambda: self._parked, timeout)

    def resume(self) -> None:
        with self._cv:
            if self._paused:
                self._paused = False
                self._since = time.perf_counter()
                self._active_tokens -= self.tokens  # the tokens from now on are added at the next pause
                self._cv.notify_all()

    def close(self) -> None:
        self.resume()  # a parked engine thread would hold up its shutdown
        self._stop.set()
        self._feeder.join(timeout=5)
        self.engine.shutdown()

"""A real tokenseam server per model, on a free loopback port, shared by the server tests."""

from __future__ import annotations

import pytest

from tokenseam.constraint import bitmask_from_ids
from tokenseam.httpkit import BackgroundServer
from tokenseam.server.runtime import build_server


class ForcedIds:
    """Test-only constraint: allows exactly the given ids in order, then only end-of-generation."""

    def __init__(self, ids: list[int], eog: list[int], vocab_size: int) -> None:
        self.ids, self.eog, self.v, self.k = ids, eog, vocab_size, 0

    def fill_mask(self, out) -> None:
        bitmask_from_ids([self.ids[self.k]] if self.k < len(self.ids) else self.eog, self.v, out)

    def accept(self, token_id: int) -> bool:
        self.k += 1
        return True

    def is_finished(self) -> bool:
        return False

    def is_active(self) -> bool:
        return True


class RunningServer:
    def __init__(self, model: str, **kw) -> None:
        # grammars compile while the prompt is read whatever the core count ("auto" would turn that off on a
        # 2-core machine); test_grammar_overlap covers compiling first
        self.app, self.state = build_server(model, threads=2, grammar_overlap="on", **kw)
        eog = sorted(self.state.backend.eog_ids)

        def hook(parsed, body):
            ids = body.get("_force_ids")
            if ids is None:
                return None
            return lambda: ForcedIds(ids, eog, self.state.vocab.size)

        self.state.constraint_hook = hook
        self.bg = BackgroundServer(self.app).start()
        self.url = self.bg.url

    def stop(self) -> None:
        self.bg.stop()
        self.state.engine.shutdown()


@pytest.fixture(scope="session")
def smollm2_server():
    s = RunningServer("smollm2", n_ctx=1024, parallel=4)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def gemma3_server():
    s = RunningServer("gemma3", n_ctx=1024, parallel=2)
    yield s
    s.stop()


@pytest.fixture(params=["smollm2", "gemma3"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")

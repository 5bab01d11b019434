"""Start and stop a `tokenseam vllm serve` server from Python (the tests and `tokenseam bench vllm` use it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bench.common import ServerProcess, free_port
from .cli import serve_command


class VLLMServer(ServerProcess):
    """vLLM as `tokenseam vllm serve` starts it, on a free loopback port (a context manager).

    `extra`: vLLM flags (they replace tokenseam's defaults where they overlap, e.g. another
    `--structured-outputs-config`); `healing`: load the healing logits processor."""

    name = "vLLM"
    startup_seconds = 600.0  # eager startup takes 40-115 s on 2 quiet cores; a busy machine takes longer

    def __init__(
        self, venv: Path, model: str | None = None, extra: list[str] | None = None, healing: bool = True
    ) -> None:
        port = free_port()
        args = argparse.Namespace(
            venv=Path(venv), model=model, host="127.0.0.1", port=port, no_healing=not healing
        )
        self.cmd, env = serve_command(args, list(extra or []))
        super().__init__(self.cmd, port, env=env)

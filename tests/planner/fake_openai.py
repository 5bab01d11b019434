"""A small deterministic OpenAI-compatible server for the eval tests (stdlib only; also runnable as a script).

It knows the task set, so it can answer right or wrong on purpose: variants containing "EXAMPLES" are right
more often. Outages (503 after N answers), flaky 503s and 400s can be switched on to test retries and resume.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answers_right(variant: str, task_id: str) -> bool:
    """The fake model's deterministic correctness rule (tests recompute expected tables with it)."""
    h = int(hashlib.sha256(f"{variant}|{task_id}".encode()).hexdigest()[:8], 16) % 100
    return h < (80 if "EXAMPLES" in variant else 50)


class FakeState:
    def __init__(self, tasks: list[dict]):
        self.tasks = tasks
        self.lock = threading.Lock()
        self.requests = 0  # every POST, failed or not
        self.answered = 0
        self.fail_after: int | None = None  # answer this many, then 503 forever
        self.flaky_every: int | None = None  # the first request for every k-th new prompt gets a 503
        self.seen: set[str] = set()
        self.reject = False  # 400 on everything
        self.garbage = False  # 200 with a body that is not a completion
        self.bodies: list[dict] = []  # every request body received

    def respond(self, prompt: str) -> tuple[int, str]:
        with self.lock:
            self.requests += 1
            if self.reject:
                return 400, "bad request for testing"
            if self.flaky_every and prompt not in self.seen:
                self.seen.add(prompt)
                if len(self.seen) % self.flaky_every == 0:
                    return 503, "flaky"
            if self.fail_after is not None and self.answered >= self.fail_after:
                return 503, "outage"
            self.answered += 1
        body = prompt[: -len("\nAnswer:")] if prompt.endswith("\nAnswer:") else prompt
        for t in self.tasks:
            if body.endswith(t["input"]):
                variant = body[: -len(t["input"])]
                if answers_right(variant.rstrip("\n"), t["id"]):
                    return 200, f"Answer: {t['answer']}."
                return 200, "I am not sure, maybe 12345."
        return 200, "unknown task"


def make_handler(state: FakeState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):  # keep test output quiet
            pass

        def _send(self, code: int, obj) -> None:
            data = json.dumps(obj).encode() if not isinstance(obj, str) else obj.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {"status": "ok"}) if self.path == "/health" else self._send(404, {"error": "no"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            assert body.get("temperature") == 0
            with state.lock:
                state.bodies.append(body)
            if self.path == "/v1/chat/completions":
                content = body["messages"][-1]["content"]
                # Content parts (a request fragment's prefix, then the task) read as their joined text.
                prompt = content if isinstance(content, str) else "".join(p["text"] for p in content)
            elif self.path == "/v1/completions":
                prompt = body["prompt"]
            else:
                return self._send(404, {"error": "no route"})
            if state.garbage:
                return self._send(200, "<html>proxy login</html>")
            code, text = state.respond(prompt)
            if code != 200:
                return self._send(code, {"error": {"message": text}})
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                if self.path.endswith("chat/completions")
                else {"index": 0, "text": text, "finish_reason": "stop"}
            )
            self._send(200, {"object": "chat.completion", "choices": [choice]})

    return Handler


def start(tasks: list[dict], port: int = 0) -> tuple[ThreadingHTTPServer, FakeState]:
    state = FakeState(tasks)
    srv = ThreadingHTTPServer(("127.0.0.1", port), make_handler(state))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, state


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tasks", default=None)
    a = ap.parse_args()
    tasks = [json.loads(line) for line in open(a.tasks)] if a.tasks else []
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(FakeState(tasks)))
    server.serve_forever()

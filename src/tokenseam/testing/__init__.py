"""Test doubles shipped with the package, because the in-package benchmarks use them too (not runtime code).

`fake_upstream`: a deterministic fake OpenAI-compatible server and a threaded uvicorn runner.
"""

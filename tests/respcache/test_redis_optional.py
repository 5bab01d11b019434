"""The `redis` client is optional: the cache imports without it and a Redis URL then says what to install."""

from __future__ import annotations

import os
import subprocess
import sys

_SCRIPT = r"""
import sys
sys.modules["redis"] = None  # any `import redis` now raises ImportError
import tokenseam.respcache
from tokenseam.respcache import CacheStoreError, open_store
open_store("memory")
try:
    open_store("redis://user:hunter2@127.0.0.1:1/0")
except CacheStoreError as e:
    print(e)
else:
    raise SystemExit("no error")
"""


def test_respcache_without_redis():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "pip install 'tokenseam[redis]'" in r.stdout
    assert "hunter2" not in r.stdout

"""One set of Prometheus metrics per registry: an app built twice on the same registry (a test, a reload)
reuses the collectors instead of registering them again, which prometheus_client refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_BUILT: dict[tuple[int, Callable[..., Any]], tuple[Any, Any]] = {}


def metrics_for(registry: Any, build: Callable[[Any], T]) -> T:
    """`build(registry)`, once per (registry, build); None means prometheus_client's default registry."""
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    got = _BUILT.get((id(registry), build))
    if got is None or got[0] is not registry:
        got = (registry, build(registry))
        _BUILT[(id(registry), build)] = got
    return got[1]

"""Provider prompt-cache profiles: load the shipped `profiles.toml`, merge a user file over it, validate.

A profile says how a provider's prompt cache bills a prefix: its floor, block size, read and write multipliers, TTLs.
"""

from __future__ import annotations

import datetime as _dt
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import PlannerError

BUILTIN_NAME = "profiles.toml (built in)"
_REQUIRED = ("provider", "floor", "block", "read_multiplier", "writes", "verified", "source")
_KNOWN = set(_REQUIRED) | {"models", "block_status", "ttl_refresh_on_hit", "notes", "tokenizer"}
_BLOCK_STATUSES = ("documented", "historically documented", "undocumented")


@dataclass(frozen=True)
class WriteOption:
    """One way of writing the cache: its price multiplier and how long an entry lives (inf = no time limit)."""

    name: str
    multiplier: float
    ttl_seconds: float


@dataclass(frozen=True)
class Profile:
    """The cache-billing rules of one provider/model family, with the date and source of the figures."""

    name: str
    provider: str
    floor: int
    block: int
    read_multiplier: float
    writes: tuple[WriteOption, ...]
    verified: str
    source: str
    models: tuple[str, ...] = ()
    block_status: str = "documented"
    ttl_refresh_on_hit: bool = True
    notes: str = ""
    tokenizer: str | None = None
    origin: str = BUILTIN_NAME

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "provider": self.provider,
            "models": list(self.models),
            "floor": self.floor,
            "block": self.block,
            "block_status": self.block_status,
            "read_multiplier": self.read_multiplier,
            "writes": [
                {
                    "name": w.name,
                    "multiplier": w.multiplier,
                    "ttl_seconds": None if math.isinf(w.ttl_seconds) else w.ttl_seconds,
                }
                for w in self.writes
            ],
            "ttl_refresh_on_hit": self.ttl_refresh_on_hit,
            "verified": self.verified,
            "source": self.source,
            "notes": self.notes,
            "tokenizer": self.tokenizer,
            "origin": self.origin,
        }


@dataclass(frozen=True)
class ProfileSet:
    profiles: dict[str, Profile]
    aliases: dict[str, str]

    def get(self, name: str) -> Profile:
        key = self.aliases.get(name, name)
        if key not in self.profiles:
            known = ", ".join(sorted(self.profiles) + sorted(self.aliases))
            raise PlannerError(f"unknown profile {name!r}; known profiles: {known}")
        return self.profiles[key]


def _read_toml(text: str, origin: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlannerError(f"{origin}: not valid TOML: {e}") from None


def _number(
    raw: dict, field: str, where: str, *, integer: bool = False, minimum: float = 0.0, allow_inf: bool = False
) -> float:
    v = raw.get(field)
    if isinstance(v, bool) or not isinstance(v, int | float):
        kind = "an integer" if integer else "a number"
        raise PlannerError(f"{where}: field {field!r} must be {kind}, got {v!r}")
    if isinstance(v, float) and math.isnan(v):
        raise PlannerError(f"{where}: field {field!r} is NaN")
    if math.isinf(v) and not (allow_inf and v > 0):
        raise PlannerError(f"{where}: field {field!r} must be finite, got {v!r}")
    if integer and not isinstance(v, int):
        raise PlannerError(f"{where}: field {field!r} must be an integer, got {v!r}")
    if v < minimum:
        raise PlannerError(f"{where}: field {field!r} must be >= {minimum:g}, got {v!r}")
    return v


def _text(raw: dict, field: str, where: str, default: str | None = None) -> str:
    v = raw.get(field, default)
    if not isinstance(v, str):
        raise PlannerError(f"{where}: field {field!r} must be a string, got {v!r}")
    return v


def _validate(name: str, raw: dict[str, Any], origin: str) -> Profile:
    where = f"{origin}: profile {name!r}"
    missing = [f for f in _REQUIRED if f not in raw]
    if missing:
        raise PlannerError(f"{where}: missing field(s) {', '.join(repr(f) for f in missing)}")
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise PlannerError(
            f"{where}: unknown field(s) {', '.join(repr(f) for f in unknown)} "
            f"(known: {', '.join(sorted(_KNOWN))})"
        )
    floor = int(_number(raw, "floor", where, integer=True))
    block = int(_number(raw, "block", where, integer=True, minimum=1))
    read = float(_number(raw, "read_multiplier", where))
    writes_raw = raw["writes"]
    if not isinstance(writes_raw, list) or not writes_raw:
        raise PlannerError(
            f"{where}: field 'writes' must be a non-empty list of {{name, multiplier, ttl_seconds}} tables"
        )
    writes = []
    for i, w in enumerate(writes_raw):
        wwhere = f"{where} writes[{i}]"
        if not isinstance(w, dict):
            raise PlannerError(f"{wwhere}: must be a table with name, multiplier, ttl_seconds")
        extra = sorted(set(w) - {"name", "multiplier", "ttl_seconds"})
        if extra:
            raise PlannerError(f"{wwhere}: unknown field(s) {', '.join(repr(f) for f in extra)}")
        for f in ("name", "multiplier", "ttl_seconds"):
            if f not in w:
                raise PlannerError(f"{wwhere}: missing field {f!r}")
        ttl = float(_number(w, "ttl_seconds", wwhere, allow_inf=True))
        if ttl <= 0:
            raise PlannerError(f"{wwhere}: field 'ttl_seconds' must be > 0 (use inf for no time limit)")
        writes.append(WriteOption(_text(w, "name", wwhere), float(_number(w, "multiplier", wwhere)), ttl))
    verified = raw["verified"]
    if isinstance(verified, _dt.date) and not isinstance(verified, _dt.datetime):
        verified = verified.isoformat()
    elif isinstance(verified, str):
        try:
            _dt.date.fromisoformat(verified)
        except ValueError:
            raise PlannerError(
                f"{where}: field 'verified' must be a date YYYY-MM-DD, got {verified!r}"
            ) from None
    else:
        raise PlannerError(f"{where}: field 'verified' must be a date YYYY-MM-DD, got {verified!r}")
    models = raw.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise PlannerError(f"{where}: field 'models' must be a list of strings")
    status = _text(raw, "block_status", where, "documented")
    if status not in _BLOCK_STATUSES:
        raise PlannerError(f"{where}: field 'block_status' must be one of {', '.join(_BLOCK_STATUSES)}")
    refresh = raw.get("ttl_refresh_on_hit", True)
    if not isinstance(refresh, bool):
        raise PlannerError(f"{where}: field 'ttl_refresh_on_hit' must be true or false, got {refresh!r}")
    tok = raw.get("tokenizer")
    if tok is not None and not isinstance(tok, str):
        raise PlannerError(f"{where}: field 'tokenizer' must be a string")
    return Profile(
        name=name,
        provider=_text(raw, "provider", where),
        floor=floor,
        block=block,
        read_multiplier=read,
        writes=tuple(writes),
        verified=verified,
        source=_text(raw, "source", where),
        models=tuple(models),
        block_status=status,
        ttl_refresh_on_hit=refresh,
        notes=_text(raw, "notes", where, ""),
        tokenizer=tok or None,
        origin=origin,
    )


def _tables(doc: dict[str, Any], origin: str) -> tuple[dict[str, dict], dict[str, str]]:
    unknown = sorted(set(doc) - {"profiles", "aliases"})
    if unknown:
        raise PlannerError(
            f"{origin}: unknown top-level table(s) {', '.join(unknown)} (expected [profiles.NAME] "
            "and [aliases])"
        )
    profiles = doc.get("profiles", {})
    aliases = doc.get("aliases", {})
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise PlannerError(f"{origin}: 'profiles' must hold tables [profiles.NAME]")
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise PlannerError(f"{origin}: [aliases] must map names to profile names (strings)")
    return profiles, aliases


def load_profiles(extra: str | Path | None = None) -> ProfileSet:
    """The built-in profiles, with `extra` (a user TOML file) merged over them field by field."""
    builtin = resources.files("tokenseam.planner").joinpath("profiles.toml").read_text(encoding="utf-8")
    raw, aliases = _tables(_read_toml(builtin, BUILTIN_NAME), BUILTIN_NAME)
    origins = dict.fromkeys(raw, BUILTIN_NAME)
    raw = {k: dict(v) for k, v in raw.items()}
    if extra is not None:
        path = Path(extra)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlannerError(f"profiles file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlannerError(f"cannot read profiles file {path}: {e}") from None
        user_raw, user_aliases = _tables(_read_toml(text, str(path)), str(path))
        for name, table in user_raw.items():
            raw[name] = {**raw.get(name, {}), **table}
            origins[name] = str(path)
        aliases = {**aliases, **user_aliases}
    profiles = {name: _validate(name, table, origins[name]) for name, table in raw.items()}
    for a, target in aliases.items():
        if target not in profiles:
            raise PlannerError(f"alias {a!r} points at unknown profile {target!r}")
    return ProfileSet(profiles, dict(aliases))

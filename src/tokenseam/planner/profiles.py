"""Provider prompt-cache profiles: load the shipped `profiles.toml`, merge a user file over it, validate.

A profile says how a provider's prompt cache bills a prefix: its floor, block size, read and write multipliers, TTLs.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import fnmatch
import math
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import PlannerError

BUILTIN_NAME = "profiles.toml (built in)"
_REQUIRED = ("provider", "floor", "read_multiplier", "writes", "verified", "source")
_KNOWN = set(_REQUIRED) | {
    "block",
    "models",
    "block_status",
    "ttl_refresh_on_hit",
    "notes",
    "tokenizer",
    "caching",
    "automatic",
    "granularity",
    "max_breakpoints",
    "confirmed",
    "unconfirmed",
}
_BLOCK_STATUSES = ("documented", "historically documented", "undocumented")
CACHING_KINDS = ("implicit", "explicit")
GRANULARITIES = ("blocks", "exact", "units")
MAX_TOKENS = 100_000_000  # floors and blocks beyond any context window are typos
MAX_BREAKPOINTS = 64  # no provider documents more than 4; a larger figure in a profile file is a typo
_DATE_SUFFIX = re.compile(r"(-\d{8}|-\d{4}-\d{2}-\d{2}|@\d{8})$")


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
    caching: str = "implicit"
    automatic: bool = False
    granularity: str = "blocks"
    max_breakpoints: int = 0
    confirmed: bool | None = None  # None: the profile file does not say
    unconfirmed: str = ""

    @property
    def explicit(self) -> bool:
        """True when a prefix is cached only where the request places a breakpoint."""
        return self.caching == "explicit"

    def write(self, name: str | None) -> WriteOption:
        """The write option called `name` (the first one when None)."""
        if name is None:
            return self.writes[0]
        for w in self.writes:
            if w.name == name:
                return w
        raise PlannerError(
            f"profile {self.name!r} has no write option {name!r}; it has {', '.join(w.name for w in self.writes)}"
        )

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
            "caching": self.caching,
            "automatic": self.automatic,
            "granularity": self.granularity,
            "max_breakpoints": self.max_breakpoints,
            "verified": self.verified,
            "source": self.source,
            "confirmed": self.confirmed,
            "unconfirmed": self.unconfirmed,
            "notes": self.notes,
            "tokenizer": self.tokenizer,
            "origin": self.origin,
        }


@dataclass(frozen=True)
class ProfileSet:
    profiles: dict[str, Profile]
    aliases: dict[str, str]

    def get(self, name: str) -> Profile:
        """A profile by profile name, alias or model name (see `resolve`)."""
        return self.resolve(name)[0]

    def resolve(self, name: str) -> tuple[Profile, str]:
        """(profile, how it was found) for a profile name, an alias, or a model name.

        Model names are matched against each profile's `models` list, case-insensitively, after dropping a
        `provider/` prefix and a date suffix (`-20251001`, `-2026-04-01`): an exact entry first, then the
        longest matching glob. Profiles from a user file win over built-in ones. An unknown name is an error
        that lists the closest known names; there is no default profile."""
        if not isinstance(name, str) or not name.strip():
            raise PlannerError("the profile or model name is empty")
        if name in self.profiles:
            return self.profiles[name], "profile"
        if name in self.aliases:
            return self.profiles[self.aliases[name]], f"alias {name!r}"
        model = name.strip().lower().rsplit("/", 1)[-1]
        for candidate in dict.fromkeys((model, _DATE_SUFFIX.sub("", model))):
            hit = self._match_model(candidate)
            if hit is not None:
                return self.profiles[hit], f"model {name!r}"
        names = sorted(self.profiles) + sorted(self.aliases)
        literal = sorted({m.lower().rstrip("*-.") for p in self.profiles.values() for m in p.models})
        close = difflib.get_close_matches(model, names + literal, n=5, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise PlannerError(
            f"unknown profile {name!r} (not a profile, alias or known model name){hint}; known profiles: "
            f"{', '.join(names)}. Add the model to a profile's `models` list with --profiles FILE."
        )

    def _match_model(self, model: str) -> str | None:
        exact = [p.name for p in self.profiles.values() if model in (m.lower() for m in p.models)]
        pool = exact
        if not pool:
            scored = []
            for p in self.profiles.values():
                best = max(
                    (len(m.replace("*", "")) for m in p.models if fnmatch.fnmatchcase(model, m.lower())),
                    default=-1,
                )
                if best >= 0:
                    scored.append((best, p.name))
            if scored:
                top = max(s for s, _ in scored)
                pool = [n for s, n in scored if s == top]
        if not pool:
            return None
        user = [n for n in pool if self.profiles[n].origin != BUILTIN_NAME]
        pool = user or pool
        if len(pool) > 1:
            raise PlannerError(
                f"model {model!r} matches the models of several profiles ({', '.join(sorted(pool))}): "
                "pass the profile name"
            )
        return pool[0]


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
    if floor > MAX_TOKENS:
        raise PlannerError(f"{where}: field 'floor' must be <= {MAX_TOKENS:,} tokens, got {floor:,}")
    caching = _text(raw, "caching", where, "implicit")
    if caching not in CACHING_KINDS:
        raise PlannerError(
            f"{where}: field 'caching' must be one of {', '.join(CACHING_KINDS)}, got {caching!r}"
        )
    default_gran = "blocks" if raw.get("block", 1) != 1 else "exact"
    granularity = _text(raw, "granularity", where, default_gran)
    if granularity not in GRANULARITIES:
        raise PlannerError(
            f"{where}: field 'granularity' must be one of {', '.join(GRANULARITIES)}, got {granularity!r}"
        )
    if granularity == "blocks" and "block" not in raw:
        raise PlannerError(f"{where}: granularity 'blocks' needs the field 'block' (block size in tokens)")
    block = int(_number({"block": raw.get("block", 1)}, "block", where, integer=True, minimum=1))
    if block > MAX_TOKENS:
        raise PlannerError(f"{where}: field 'block' must be <= {MAX_TOKENS:,} tokens, got {block:,}")
    if granularity != "blocks" and block != 1:
        raise PlannerError(
            f"{where}: granularity {granularity!r} caches any length: 'block' must be 1, got {block}"
        )
    max_bp = int(
        _number({"max_breakpoints": raw.get("max_breakpoints", 0)}, "max_breakpoints", where, integer=True)
    )
    if max_bp > MAX_BREAKPOINTS:
        raise PlannerError(f"{where}: field 'max_breakpoints' must be <= {MAX_BREAKPOINTS}, got {max_bp}")
    if caching == "explicit" and max_bp < 1:
        raise PlannerError(
            f"{where}: an explicit cache needs 'max_breakpoints' >= 1 (where would a breakpoint go?)"
        )
    automatic = raw.get("automatic", False)
    if not isinstance(automatic, bool):
        raise PlannerError(f"{where}: field 'automatic' must be true or false, got {automatic!r}")
    confirmed = raw.get("confirmed")
    if confirmed is not None and not isinstance(confirmed, bool):
        raise PlannerError(f"{where}: field 'confirmed' must be true or false, got {confirmed!r}")
    unconfirmed = _text(raw, "unconfirmed", where, "")
    if confirmed is False and not unconfirmed.strip():
        raise PlannerError(
            f"{where}: confirmed = false needs 'unconfirmed' saying what could not be confirmed"
        )
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
    if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
        raise PlannerError(
            f"{where}: field 'models' must be a list of non-empty strings (model names or globs)"
        )
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
        caching=caching,
        automatic=automatic,
        granularity=granularity,
        max_breakpoints=max_bp,
        confirmed=confirmed,
        unconfirmed=unconfirmed,
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

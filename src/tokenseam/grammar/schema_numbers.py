"""JSON Schema numbers lowered to the grammar IR: integers in a range, decimals in a range (at most 15
significant digits, no exponent), multiples of an integer, and the `integer`/`number` types' keywords."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

from . import cpauto
from .errors import GrammarError
from .ir import (
    EMPTY,
    NOTHING,
    Auto,
    Node,
    Repeat,
    alt,
    cls,
    lit,
    opt,
    seq,
    star,
)

DIG = cls("0-9")
DIG19 = cls("1-9")


def _int_bound(x, lower: bool, exclusive: bool) -> int:
    d = Decimal(str(x))
    if lower:
        return math.floor(d) + 1 if exclusive else math.ceil(d)
    return math.ceil(d) - 1 if exclusive else math.floor(d)


def _digits_range(lo: str, hi: str) -> Node:
    """Digit strings of equal length between lo and hi (inclusive)."""
    if not lo:
        return EMPTY
    n = len(lo) - 1
    if lo[0] == hi[0]:
        return seq(lit(lo[0]), _digits_range(lo[1:], hi[1:]))
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return seq(cls(f"{lo[0]}-{hi[0]}"), Repeat(DIG, n, n)) if n else cls(f"{lo[0]}-{hi[0]}")
    parts = [seq(lit(lo[0]), _digits_range(lo[1:], "9" * n))]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        parts.append(seq(cls(f"{a}-{b}"), Repeat(DIG, n, n)))
    parts.append(seq(lit(hi[0]), _digits_range("0" * n, hi[1:])))
    return alt(*parts)


def _nonneg_range(a: int, b: int | None) -> Node:
    """Decimal integers without leading zeros in [a, b] (a >= 0, b None = unbounded)."""
    if b is not None and b < a:
        return NOTHING
    la = len(str(a))
    parts = []
    last = la if b is None else len(str(b))
    if b is not None and last > 40:
        b, last = None, la
    for L in range(la, last + 1):
        lo = max(a, 10 ** (L - 1) if L > 1 else 0)
        hi = 10**L - 1 if b is None else min(b, 10**L - 1)
        if lo <= hi:
            parts.append(_digits_range(str(lo), str(hi)))
    if b is None:
        parts.append(seq(DIG19, Repeat(DIG, la, None)))
    return alt(*parts) if parts else NOTHING


def int_range(lo: int | None, hi: int | None) -> Node:
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        parts.append(seq(lit("-"), _nonneg_range(-top, None if lo is None else -lo)))
    return alt(*parts) if parts else NOTHING


INT = seq(opt(lit("-")), alt(lit("0"), seq(DIG19, star(DIG))))
FRAC = seq(lit("."), Repeat(DIG, 1, None))
EXP = seq(cls("eE"), opt(cls("+-")), Repeat(DIG, 1, None))
NUMBER = seq(INT, opt(FRAC), opt(EXP))

# Numbers that are not integers (`not {type: integer}` over numbers). Up to draft 4 an integer is a number
# written without fraction or exponent (a validator sees `1.0` parse to a float, not an int), so the others
# are exactly the spellings with either. From draft 6 on an integer is an integral value (`1.0` and `1e2`
# are integers), and a spelling's value is integral or not depending on how its exponent compares with its
# digits, which no automaton decides; the spellings below have non-integral values whatever their digits:
# a fraction with a non-zero digit and no positive exponent (`1.50`, `2.5e-7`, `0.5E+0`), or an integer part
# ending in a non-zero digit and a negative exponent (`1e-05`), which covers what json.dumps writes.
# Validators parse numbers to doubles, where `1.00000000000000001` is 1.0 and `1e-400` is 0.0: at most 15
# significant digits and exponents down to -300 keep the parsed value non-integral too.
_NONZERO_FRAC = seq(lit("."), star(DIG), DIG19, star(DIG))
_EXP300 = seq(star(lit("0")), alt(Repeat(DIG, 1, 2), seq(cls("12"), DIG, DIG), lit("300")))
_EXP_NOT_POSITIVE = seq(cls("eE"), alt(seq(lit("-"), _EXP300), seq(opt(lit("+")), Repeat(lit("0"), 1, None))))
_ENDS_NONZERO = alt(DIG19, seq(DIG19, star(DIG), DIG19))
_NON_INTEGRAL = seq(
    opt(lit("-")),
    alt(
        seq(alt(lit("0"), seq(DIG19, star(DIG))), _NONZERO_FRAC, opt(_EXP_NOT_POSITIVE)),
        seq(_ENDS_NONZERO, cls("eE"), lit("-"), _EXP300),
    ),
)
NON_INT_DRAFT4 = seq(INT, alt(FRAC, EXP, seq(FRAC, EXP)))
# The same, without exponent, to intersect with the bounded-number automata (which have none).
_FRACTIONAL = {
    4: seq(opt(lit("-")), Repeat(DIG, 1, None), lit("."), Repeat(DIG, 1, None)),
    6: seq(opt(lit("-")), Repeat(DIG, 1, None), _NONZERO_FRAC),
}


def _frac_digits(x: Decimal) -> str:
    """Digits after the point of a non-negative decimal, without trailing zeros."""
    t = format(x - math.floor(x), "f")
    return t.split(".")[1].rstrip("0") if "." in t else ""


def _ge_digits(f: str, strict: bool) -> Node:
    """Non-empty digit strings d with 0.d >= 0.f (> when strict)."""
    if not f:
        return seq(star(DIG), DIG19, star(DIG)) if strict else Repeat(DIG, 1, None)
    return _rest_ge(f, strict)


def _rest_ge(g: str, strict: bool) -> Node:
    if not g:
        return seq(star(DIG), DIG19, star(DIG)) if strict else star(DIG)
    d = int(g[0])
    options = [seq(lit(g[0]), _rest_ge(g[1:], strict))]
    if d < 9:
        options.append(seq(cls(f"{d + 1}-9"), star(DIG)))
    return alt(*options)


def _le_digits(f: str, strict: bool, first: bool = True) -> Node:
    """Non-empty digit strings d with 0.d <= 0.f (< when strict)."""
    if not f:
        if first:
            return NOTHING if strict else Repeat(lit("0"), 1, None)
        return NOTHING if strict else star(lit("0"))
    d = int(f[0])
    options = [seq(lit(f[0]), _le_digits(f[1:], strict, False))]
    if d > 0:
        options.append(seq(cls(f"0-{d - 1}"), star(DIG)))
    if not first:
        options.append(EMPTY)  # a proper prefix of f (which ends in a non-zero digit) is smaller
    return alt(*options)


def _decimal_range(lo: Decimal, lo_ex: bool, hi: Decimal | None, hi_ex: bool) -> Node:
    """Non-negative decimals (integer part without leading zeros, optional fraction, no exponent) in the range."""
    lo_n, lo_f = math.floor(lo), _frac_digits(lo)
    hi_n = None if hi is None else math.floor(hi)
    hi_f = "" if hi is None else _frac_digits(hi)
    dot = lit(".")
    parts = []
    mid_hi = None if hi_n is None else hi_n - 1
    if mid_hi is None or mid_hi >= lo_n + 1:
        parts.append(seq(_nonneg_range(lo_n + 1, mid_hi), opt(seq(dot, Repeat(DIG, 1, None)))))
    low_int_ok = lo_f == "" and not lo_ex
    if hi_n is None or hi_n > lo_n:
        low = [seq(dot, _ge_digits(lo_f, lo_ex))]
        if low_int_ok:
            low.append(EMPTY)
        parts.append(seq(lit(str(lo_n)), alt(*low)))
        if hi_n is not None:
            high = [seq(dot, _le_digits(hi_f, hi_ex))]
            if not (hi_f == "" and hi_ex):
                high.append(EMPTY)
            parts.append(seq(lit(str(hi_n)), alt(*high)))
    else:
        both = cpauto.product(
            cpauto.determinize(cpauto.from_ir(_ge_digits(lo_f, lo_ex))),
            cpauto.determinize(cpauto.from_ir(_le_digits(hi_f, hi_ex))),
        )
        opts = [] if cpauto.is_empty(both) else [seq(dot, Auto(both))]
        if low_int_ok and not (hi_f == "" and hi_ex):
            opts.append(EMPTY)
        if opts:
            parts.append(seq(lit(str(lo_n)), alt(*opts)))
    return alt(*parts) if parts else NOTHING


def _sig_digits_dfa(limit: int) -> cpauto.CPNFA:
    """Number spellings ('-', digits, '.') with at most `limit` significant digits."""
    d = cpauto.CPNFA()
    lead = d.add()  # before the first non-zero digit
    counts = [d.add() for _ in range(limit + 1)]
    for q in [lead, *counts]:
        d.finals.add(q)
        d.edges[q].append((ord("-"), ord("."), q))  # '-' (0x2D) and '.' (0x2E); '/' never occurs in numbers
    d.edges[lead].append((ord("0"), ord("0"), lead))
    d.edges[lead].append((ord("1"), ord("9"), counts[1]))
    for k in range(1, limit):
        d.edges[counts[k]].append((ord("0"), ord("9"), counts[k + 1]))
    for q in range(d.size):
        d.edges[q].sort()
    d.start = lead
    return d


_SIG15 = _sig_digits_dfa(15)


def _mantissa_sig_digits_dfa(limit: int) -> cpauto.CPNFA:
    """Number spellings whose digits before any exponent have at most `limit` significant digits."""
    d = _sig_digits_dfa(limit)
    exp = d.add()
    d.finals.add(exp)
    for q in range(d.size - 1):
        d.edges[q].append((ord("E"), ord("E"), exp))
        d.edges[q].append((ord("e"), ord("e"), exp))
        d.edges[q].sort()
    d.edges[exp].append((ord("+"), ord("+"), exp))
    d.edges[exp].append((ord("-"), ord("-"), exp))
    d.edges[exp].append((ord("0"), ord("9"), exp))
    d.edges[exp].sort()
    return d


_NON_INTEGRAL_AUTO: list = []


def non_integral() -> Node:
    """The non-integral numbers from draft 6 on (see _NON_INTEGRAL), built once."""
    if not _NON_INTEGRAL_AUTO:
        base = cpauto.determinize(cpauto.from_ir(_NON_INTEGRAL))
        _NON_INTEGRAL_AUTO.append(Auto(cpauto.product(base, _mantissa_sig_digits_dfa(15))))
    return _NON_INTEGRAL_AUTO[0]


def _mod_dfa(k: int) -> cpauto.CPNFA:
    """Integers without leading zeros divisible by k (digits read left to right, residue as the state)."""
    d = cpauto.CPNFA()
    start, neg, zero = d.add(), d.add(), d.add()
    res = [d.add() for _ in range(k)]
    d.edges[start].append((ord("-"), ord("-"), neg))
    d.edges[start].append((ord("0"), ord("0"), zero))
    for src in (start, neg):
        for dig in range(1, 10):
            d.edges[src].append((48 + dig, 48 + dig, res[dig % k]))
    for r in range(k):
        for dig in range(10):
            d.edges[res[r]].append((48 + dig, 48 + dig, res[(10 * r + dig) % k]))
    d.finals = {zero, res[0]}
    d.start = start
    return d


class NumberLowering:
    """The `integer` and `number` types of the JSON Schema compiler (json_schema._Compiler)."""

    def _bounds(self, s, ptr):
        lo = hi = None
        lo_ex = hi_ex = False
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            v = s.get(key)
            if v is None or isinstance(v, bool):
                continue
            if not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
                raise GrammarError(f"{key} at {ptr} must be a number")
        mn, mx = s.get("minimum"), s.get("maximum")
        emn, emx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        cands_lo = []
        if mn is not None:
            cands_lo.append((Decimal(str(mn)), emn is True))
        if emn is not None and not isinstance(emn, bool):
            cands_lo.append((Decimal(str(emn)), True))
        cands_hi = []
        if mx is not None:
            cands_hi.append((Decimal(str(mx)), emx is True))
        if emx is not None and not isinstance(emx, bool):
            cands_hi.append((Decimal(str(emx)), True))
        if cands_lo:
            lo, lo_ex = max(cands_lo, key=lambda x: (x[0], x[1]))
        if cands_hi:
            hi, hi_ex = min(cands_hi, key=lambda x: (x[0], not x[1]))
        return lo, lo_ex, hi, hi_ex

    def _old_integers(self) -> bool:
        """Whether an integer is a spelling without fraction or exponent (drafts 3 and 4), not a value."""
        return self.draft is not None and self.draft <= 4

    def t_integer(self, s, ptr):
        if s.get("_not_integer"):
            return NOTHING
        lo, lo_ex, hi, hi_ex = self._bounds(s, ptr)
        ilo = None if lo is None else _int_bound(lo, True, lo_ex)
        ihi = None if hi is None else _int_bound(hi, False, hi_ex)
        if ilo is not None and ihi is not None and ilo > ihi:
            return NOTHING
        node = int_range(ilo, ihi)
        m = s.get("multipleOf")
        if m is not None:
            if isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0:
                raise GrammarError(f"multipleOf at {ptr} must be a positive number")
            dm = Decimal(str(m))
            if dm != dm.to_integral_value():
                self.unsupported("non-integer multipleOf on an integer", ptr)
                return node
            k = int(dm)
            if k == 1:
                return node
            if k > 5000:
                self.unsupported(f"multipleOf {k} (too large)", ptr)
                return node
            base = cpauto.determinize(cpauto.from_ir(node))
            return Auto(cpauto.product(base, _mod_dfa(k)))
        return node

    def t_number(self, s, ptr):
        m = s.get("multipleOf")
        if m is not None:
            try:
                integral = Decimal(str(m)) == Decimal(str(m)).to_integral_value()
            except InvalidOperation:
                integral = False
            if not integral:
                self.unsupported(
                    "non-integer multipleOf (validators divide in floats, where 0.07 is no multiple of 0.01, "
                    "or in decimals, where it is)",
                    ptr,
                )
                s = {k: v for k, v in s.items() if k != "multipleOf"}
            else:
                return self.t_integer(s, ptr)
        not_int = bool(s.get("_not_integer"))
        lo, lo_ex, hi, hi_ex = self._bounds(s, ptr)
        if lo is None and hi is None:
            if not_int:
                return NON_INT_DRAFT4 if self._old_integers() else non_integral()
            return NUMBER
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_ex or hi_ex))):
            return NOTHING
        for b in (lo, hi):
            if b is not None and len(b.normalize().as_tuple().digits) > 15:
                self.unsupported("number bound with more than 15 significant digits", ptr)
        # The same bounds recur (a schema merged into several allOf/oneOf branches): one automaton for each.
        frac = (4 if self._old_integers() else 6) if not_int else None
        key = (lo, lo_ex, hi, hi_ex, frac)
        hit = self.number_autos.get(key)
        if hit is None:
            hit = self._number_range(lo, lo_ex, hi, hi_ex)
            if frac is not None and hit != NOTHING:
                both = cpauto.product(hit.auto, cpauto.determinize(cpauto.from_ir(_FRACTIONAL[frac])))
                hit = NOTHING if cpauto.is_empty(both) else Auto(both)
            self.number_autos[key] = hit
        return hit

    @staticmethod
    def _number_range(lo, lo_ex, hi, hi_ex) -> Node:
        # Bounded numbers are written without exponent (a subset of the valid spellings), exactly in range.
        parts = []
        if hi is None or hi >= 0:
            plo, plo_ex = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_ex)
            parts.append(_decimal_range(plo, plo_ex, hi, hi_ex))
        if lo is None or lo < 0:
            nlo, nlo_ex = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, hi_ex)
            parts.append(seq(lit("-"), _decimal_range(nlo, nlo_ex, None if lo is None else -lo, lo_ex)))
        # Validators compare binary floats: decimals of at most 15 significant digits keep their order
        # when rounded to doubles, so longer spellings (which could round onto a bound) are not generated.
        node = alt(*parts)
        if node == NOTHING:
            return NOTHING
        dfa = cpauto.determinize(cpauto.from_ir(node), max_states=20000)
        return Auto(cpauto.product(dfa, _SIG15, max_states=40000))

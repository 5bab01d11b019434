"""JSON Schema numbers lowered to the grammar IR: integers in a range, decimals in a range (at most 15
significant digits, no exponent), multiples of an integer, and the `integer`/`number` types' keywords."""

from __future__ import annotations

import functools
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


def _same_length_dfa(bound: str, above: bool) -> cpauto.CPNFA:
    """Digit strings as long as `bound` (a decimal integer without leading zeros) that are >= it (`above`) or
    <= it, without a leading zero unless one digit long. One state per digit and a counting chain for the
    digits after the first that differs, not IR nested once per digit: a bound such as 1e300 has 301."""
    zero, n = ord("0"), len(bound)
    d = cpauto.CPNFA()
    eq = [d.add() for _ in range(n + 1)]  # eq[i]: the digits so far equal bound[:i]
    # free[i]: i digits read, already past the bound: any digits follow
    free = [d.add() for _ in range(n + 1)]
    d.finals.update((eq[n], free[n]))
    for i in range(n):
        d.edges[free[i]].append((zero, zero + 9, free[i + 1]))
        c = int(bound[i])
        d.edges[eq[i]].append((zero + c, zero + c, eq[i + 1]))
        lo, hi = (c + 1, 9) if above else (1 if i == 0 and n > 1 else 0, c - 1)
        if lo <= hi:
            d.edges[eq[i]].append((zero + lo, zero + hi, free[i + 1]))
    for q in range(d.size):
        d.edges[q].sort()
    d.start = eq[0]
    return d


def _nonneg_range(a: int, b: int | None) -> Node:
    """Decimal integers without leading zeros in [a, b] (a >= 0, b None = unbounded)."""
    if b is not None and b < a:
        return NOTHING
    sa = str(a)
    if b is not None and len(str(b)) == len(sa):
        return Auto(cpauto.product(_same_length_dfa(sa, True), _same_length_dfa(str(b), False)))
    parts = [Auto(_same_length_dfa(sa, True))]  # as long as a
    longest = None if b is None else len(str(b)) - 1  # the lengths between, all of whose numbers are in range
    if longest is None or longest > len(sa):
        parts.append(seq(DIG19, Repeat(DIG, len(sa), None if longest is None else longest - 1)))
    if b is not None:
        parts.append(Auto(_same_length_dfa(str(b), False)))  # as long as b
    return alt(*parts)


def int_range(lo: int | None, hi: int | None) -> Node:
    """JSON integer literals (no leading zeros; `-0` is 0) of the values in [lo, hi] (None: unbounded).
    Ranges whose bounds fit in 18 digits are remembered per process (IR nodes are immutable, and most integers
    of a schema share their bounds: an unbounded one took 27 µs to build each time); longer bounds, which make
    larger nodes, are built each time, so the memo stays small whatever requests send."""
    if (lo is None or -_SMALL < lo < _SMALL) and (hi is None or -_SMALL < hi < _SMALL):
        return _small_int_range(lo, hi)
    return _int_range(lo, hi)


_SMALL = 10**18


@functools.lru_cache(maxsize=64)
def _small_int_range(lo: int | None, hi: int | None) -> Node:
    return _int_range(lo, hi)


def _int_range(lo: int | None, hi: int | None) -> Node:
    parts = []
    if hi is None or hi >= 0:
        parts.append(_nonneg_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        top = -1 if hi is None else min(hi, -1)
        parts.append(seq(lit("-"), _nonneg_range(-top, None if lo is None else -lo)))
    if (lo is None or lo <= 0) and (hi is None or hi >= 0):
        parts.append(lit("-0"))  # a JSON integer literal too: the value 0
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
# One zero, as json.dumps writes an integral float: an unbounded run of zeros is a loop a model can fall into.
_ZERO_FRAC = lit(".0")
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
    return Auto(_fraction_dfa(f, above=True, strict=strict))


def _le_digits(f: str, strict: bool) -> Node:
    """Non-empty digit strings d with 0.d <= 0.f (< when strict)."""
    if not f:
        return NOTHING if strict else Repeat(lit("0"), 1, None)
    return Auto(_fraction_dfa(f, above=False, strict=strict))


def _fraction_dfa(f: str, above: bool, strict: bool) -> cpauto.CPNFA:
    """Non-empty digit strings d with 0.d >= 0.f (`above`) or <= 0.f, > or < when strict; f non-empty, without
    trailing zeros. Built as one state per digit of f, not as IR nested once per digit: a bound such as
    1e-300 has 300 of them."""
    zero = ord("0")
    d = cpauto.CPNFA()
    eq = [d.add() for _ in range(len(f) + 1)]  # eq[i]: d so far equals f[:i]
    past = d.add()  # d already beyond f in the allowed direction: any digits may follow
    d.finals.add(past)
    d.edges[past].append((zero, zero + 9, past))
    for i, ch in enumerate(f):
        c = int(ch)
        d.edges[eq[i]].append((zero + c, zero + c, eq[i + 1]))
        if above and c < 9:
            d.edges[eq[i]].append((zero + c + 1, zero + 9, past))
        if not above and c > 0:
            d.edges[eq[i]].append((zero, zero + c - 1, past))
        if not above and i:
            d.finals.add(eq[i])  # a proper prefix of f (which ends in a non-zero digit) is smaller
    end = eq[len(f)]  # equal to f: zeros keep it equal; a non-zero digit puts it above
    d.edges[end].append((zero, zero, end))
    if above:
        d.edges[end].append((zero + 1, zero + 9, past))
    if not strict:
        d.finals.add(end)
    for q in range(d.size):
        d.edges[q].sort()
    d.start = eq[0]
    return d


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
    """Integers without leading zeros (and `-0`) divisible by k (digits read left to right, residue as the state)."""
    d = cpauto.CPNFA()
    start, neg, zero = d.add(), d.add(), d.add()
    res = [d.add() for _ in range(k)]
    d.edges[start].append((ord("-"), ord("-"), neg))
    d.edges[start].append((ord("0"), ord("0"), zero))
    d.edges[neg].append((ord("0"), ord("0"), zero))  # `-0`
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
            if (
                isinstance(v, bool)
                and key.startswith("exclusive")
                and (self.draft is None or self.draft >= 6)
            ):
                # Draft 4's form. Later validators read no flag here: jsonschema compares with the boolean as 0
                # or 1, so neither reading is exact for both.
                msg = (
                    f"boolean {key!r} at {ptr or '#'} is draft 4's form: from draft 6 on, and without a $schema, "
                    "it is a number"
                )
                if not self.lenient:
                    raise GrammarError(
                        f"{msg}; name draft-04 in $schema, write the bound as a number, or pass lenient=True to "
                        "read it as draft 4 does"
                    )
                self.warnings.append(f"{msg} (read as draft 4 reads it: lenient)")
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
        # From draft 6 on `4.0` is an integer too, but an integer is written as one: a grammar taking `4.0`
        # would let a model write integers as floats (and a small model runs on with zeros to max_tokens).
        return self._integral(s, ptr, zero_fraction=False)

    def _integral(self, s, ptr, zero_fraction: bool):
        """The integral values of `s`: JSON integer literals, and with `zero_fraction` (a `number` with an
        integral `multipleOf`) the same followed by `.0`, which leaves the value (its range, its remainder) as
        the digits before it say. Exponent spellings (`1e2`) stay out: whether one is integral
        depends on its digits."""
        if s.get("_not_integer"):
            return NOTHING
        node = self._integer_digits(s, ptr)
        return seq(node, opt(_ZERO_FRAC)) if zero_fraction and node != NOTHING else node

    def _integer_digits(self, s, ptr):
        """The integers of `s` written as JSON integer literals (no fraction, no exponent)."""
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
                return self._integral(s, ptr, zero_fraction=True)  # a number: `14.0` in any draft
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

"""Resource quantities ("500m", "4Gi", "1e3"): the one parser and formatter of Pilotfish.

One, because every part reads the same strings (pod requests, node allocatable, TeamQuota
amounts) and a string that one part accepts and another refuses is an outage: a TeamQuota
that the CRD admitted but the gate controller could not read once stopped gate releases
for every team.

The language is the API server's, exactly (k8s.io/apimachinery/pkg/api/resource,
ParseQuantity):

    <quantity> ::= <sign>? <number> <suffix>
    <number>   ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>   ::= "" | n | u | m | k | M | G | T | P | E     decimal SI
                 | Ki | Mi | Gi | Ti | Pi | Ei                 binary SI
                 | (e | E) <sign>? <digits>                    decimal exponent (an int64)

with ParseQuantity's leniency kept too: a number without digits ("+", ".", "m", "Ki") is
zero, except with Pi, Ei or an exponent below -9 (its int32 view), which it refuses. The
API server stores those as "0", so Pilotfish only meets them in tests; CRD fields use the
stricter `PATTERN`.

Values are exact to the nano-unit and rounded up (away from zero) to it, as the API server
rounds. Magnitudes above MAX (2^63-1 units: the most an int64 holds in whole units, and the
API server's own cap for binary-SI quantities) saturate to SATURATED (2^63 units): more than
any node or quota can hold, one value that compares above every sane one. The API server
does not cap decimal exponents (it stores `1e10000000` as `10e9999999`), and computing
10**10000000 is what once froze the operator's and the extender's event loops.

Cost: linear in the length of the string and independent of its value. No power of ten
above 10**28 is ever computed; strings longer than READ_LIMIT (more than etcd stores in one
object) are refused outright; strings up to MAX_LENGTH are cached, since a cluster uses few
distinct ones.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Final, Literal

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]
DECIMAL_SI: Final = "DecimalSI"
BINARY_SI: Final = "BinarySI"
DECIMAL_EXPONENT: Final = "DecimalExponent"

NANO: Final = 10**9
MAX: Final = 2**63 - 1
SATURATED: Final = 2**63
MAX_NANOS: Final = MAX * NANO
SATURATED_NANOS: Final = SATURATED * NANO
# The longest quantity string in Pilotfish's own objects (the CRDs' maxLength). Every value
# up to MAX has a canonical form of at most 32 characters ("-9223372036854775807999999999e-9");
# the rest leaves room for other spellings ("0.000500Gi").
MAX_LENGTH: Final = 64
# The longest string read at all: beyond the largest object etcd stores (1.5 MiB).
READ_LIMIT: Final = 2 * 1024 * 1024

_DECIMAL: Final[dict[str, int]] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}  # fmt: skip
_BINARY: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX: Final = {e: s for s, e in _DECIMAL.items()}
_BINARY_SUFFIX: Final = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_SYNTAX: Final = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?)([0-9]+))?"
)
_INT64_MIN: Final = -(2**63)

GRAMMAR: Final = (
    "a quantity is an optionally signed decimal number followed by one suffix: "
    "n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or e/E and an integer exponent "
    "(such as 500m, 4Gi, 1.5, 2e3)"
)

# The same language for CRD fields, minus what no Pilotfish amount needs: a sign other than
# "+", a number without digits, an exponent of more than 18 digits (the API server reads
# exponents as int64). With maxLength MAX_LENGTH beside it; tests/test_quantity.py checks
# that every string it matches parses.
PATTERN: Final = (
    r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?0*[0-9]{1,18})?$"
)


class QuantityError(ValueError):
    """A string that is not a quantity; says which rule it breaks."""

    def __init__(self, value: object, rule: str) -> None:
        self.value = value
        self.rule = rule
        super().__init__(f"{shown(value)} is not a quantity: {rule}")


def shown(value: object, limit: int = 40) -> str:
    """A value for a message, cut short: the string may be megabytes long."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _int32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


def _scaled(digits: str, exp10: int, exp2: int) -> int:
    """ceil(digits * 10**exp10 * 2**exp2) in nano-units, saturated; `digits` has neither
    leading nor trailing zeros, so every power computed here is small."""
    length = len(digits)
    if length - 1 + exp10 >= 19:  # at least 10**19 > MAX
        return SATURATED_NANOS
    shift = exp10 + 9  # the value in nano-units is digits * 10**shift * 2**exp2
    if shift >= 0:  # here length + exp10 <= 19, so length <= 28 and shift <= 27
        nanos = int(digits) * 10**shift << exp2
    else:
        drop = -shift  # digits below the nano-unit
        split = length - drop  # how many digits are whole nano-units (<= 28)
        if split + 19 <= 0:  # below 10**-19 * 2**60 < 1 nano-unit: rounds up to one
            return 1
        head = int(digits[:split]) if split > 0 else 0
        if exp2 == 0:
            nanos = head + 1  # the dropped digits end in a non-zero one
        else:
            # Only the first exp2 digits of the dropped fraction decide its product with
            # 2**exp2: every multiple of 2**-exp2 has at most exp2 decimal places.
            pad = max(-split, 0)
            start = max(split, 0)
            first = "0" * min(pad, exp2) + digits[start : start + max(exp2 - pad, 0)]
            product = int(first.ljust(exp2, "0")) << exp2
            nanos = (head << exp2) + product // 10**exp2
            if drop > exp2 or product % 10**exp2:
                nanos += 1
    return SATURATED_NANOS if nanos > MAX_NANOS else nanos


def _scan(text: str) -> tuple[int, Format]:
    if not text:
        raise QuantityError(text, "it is empty")
    if len(text) > READ_LIMIT:
        raise QuantityError(text, f"it is longer than {READ_LIMIT} characters")
    found = _SYNTAX.fullmatch(text)
    if found is None:
        raise QuantityError(text, GRAMMAR)
    sign, whole, fraction, si, exp_sign, exp_digits = found.groups()
    fraction = fraction or ""
    exp2 = 0
    fmt: Format
    if exp_digits is not None:
        significant = exp_digits.lstrip("0")
        exp10 = int(significant) if 0 < len(significant) <= 19 else 0
        if exp_sign == "-":
            exp10 = -exp10
        if len(significant) > 19 or not _INT64_MIN <= exp10 <= MAX:
            raise QuantityError(text, "its exponent is beyond a 64-bit integer")
        fmt = DECIMAL_EXPONENT
    elif si in _BINARY:
        exp10, exp2, fmt = 0, _BINARY[si], BINARY_SI
    else:
        exp10, fmt = _DECIMAL[si or ""], DECIMAL_SI
    if not whole and not fraction:
        if exp2 >= 50 or (fmt == DECIMAL_EXPONENT and _int32(exp10) < -9):
            raise QuantityError(text, "its number has no digits")
        return 0, fmt
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return 0, fmt
    significant = digits.rstrip("0")
    nanos = _scaled(significant, exp10 + len(digits) - len(significant) - len(fraction), exp2)
    return (-nanos if sign == "-" else nanos), fmt


_scan_cached: Final = lru_cache(maxsize=4096)(_scan)


def scan(text: str) -> tuple[int, Format]:
    """The value in nano-units (rounded up, saturated) and the form it was written in."""
    return _scan_cached(text) if len(text) <= MAX_LENGTH else _scan(text)


def _clamp(nanos: int) -> int:
    if nanos > MAX_NANOS:
        return SATURATED_NANOS
    if nanos < -MAX_NANOS:
        return -SATURATED_NANOS
    return nanos


def _units(value: int) -> int:
    if abs(value) > MAX:
        return SATURATED_NANOS if value > 0 else -SATURATED_NANOS
    return value * NANO


def _fraction_nanos(value: Fraction) -> int:
    scaled = value * NANO
    up = math.ceil(abs(scaled))
    return _clamp(-up if scaled < 0 else up)


def nanos(value: str | int | float | Fraction) -> int:
    """A quantity in nano-units: a string as above, or a number as JSON carries one."""
    if isinstance(value, str):
        return scan(value)[0]
    if isinstance(value, bool):
        raise QuantityError(value, "a boolean is not a number")
    if isinstance(value, int):
        return _units(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(value, "it is not a finite number")
        return _fraction_nanos(Fraction(value))
    if isinstance(value, Fraction):
        return _fraction_nanos(value)
    raise QuantityError(value, "it is neither a string nor a number")


def parse(value: str | int | float | Fraction) -> Fraction:
    """A quantity as an exact number of units (cores, bytes, ...)."""
    return Fraction(nanos(value), NANO)


def milli(value: str | int | float | Fraction) -> int:
    """In milli-units, rounded up: the scheduler's MilliValue (CPU in millicores)."""
    return -(-nanos(value) // 10**6)


def whole(value: str | int | float | Fraction) -> int:
    """In whole units, rounded up: the scheduler's Value (bytes, devices)."""
    return -(-nanos(value) // NANO)


def is_beyond(value: Fraction | int) -> bool:
    """More than any node or quota could hold: what admission refuses."""
    return value > MAX or value < -MAX


def format_for(resource: str) -> Format:
    """The form the API server's own objects use for a resource: bytes in binary SI."""
    binary = ("memory", "ephemeral-storage", "batch.pilotfish.io/memory")
    return BINARY_SI if resource in binary or resource.startswith("hugepages-") else DECIMAL_SI


def _format_nanos(nanos: int, fmt: Format) -> str:
    nanos = _clamp(nanos)
    if nanos == 0:
        return "0"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if fmt == BINARY_SI and nanos >= 1024 * NANO and nanos % NANO == 0:
        units, power = nanos // NANO, 0
        while power < 6 and units % 1024 == 0:
            units //= 1024
            power += 1
        return f"{sign}{units}{_BINARY_SUFFIX[power]}"
    text = str(nanos)
    mantissa = text.rstrip("0")
    exponent = len(text) - len(mantissa) - 9
    adjust = exponent % 3  # down to a multiple of 3, as SI suffixes go
    mantissa += "0" * adjust
    exponent -= adjust
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def canonical(value: Fraction | int, fmt: Format = DECIMAL_SI) -> str:
    """The string the API server would print for `value` units in `fmt`: "1500m", "2",
    "4Gi"; rounded up to the nano-unit and saturated like a parsed value. What Pilotfish
    writes into its own objects, and what it shows people."""
    nanos = _units(value) if isinstance(value, int) else _fraction_nanos(value)
    return _format_nanos(nanos, fmt)


def canonicalize(text: str) -> str:
    """`text` in canonical form, as the API server re-serialises a pod's quantities
    (except that it keeps some spellings it deems canonical already, such as "+1" and "01",
    and reads exponents modulo 2**32)."""
    nanos, fmt = scan(text)
    return _format_nanos(nanos, fmt)

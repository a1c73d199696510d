"""The one quantity parser and formatter: the API server's language, exact values, bounded cost.

The table's verdicts and canonical forms are what k8s.io/apimachinery's ParseQuantity and
Quantity.String() give for the same strings (e2e/test_quantity_table.py asks the real API
server the same questions), so a row here that changes is a disagreement with Kubernetes.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pilotfish import quantity as q
from pilotfish.api.base import QUANTITY_PATTERN
from tests import builders

PATTERN = re.compile(builders.go_regex(QUANTITY_PATTERN))
SAT = q.SATURATED_NANOS

# (text, nano-units or None when the API server refuses it, its canonical form)
TABLE: list[tuple[str, int | None, str]] = [
    ("0", 0, "0"),
    ("1", 10**9, "1"),
    ("500m", 5 * 10**8, "500m"),
    ("1.5", 15 * 10**8, "1500m"),
    ("1.", 10**9, "1"),
    (".5", 5 * 10**8, "500m"),
    ("+1", 10**9, "1"),
    ("01", 10**9, "1"),
    ("-1", -(10**9), "-1"),
    ("-0", 0, "0"),
    ("1.G", 10**18, "1G"),
    ("2Gi", 2 * 2**30 * 10**9, "2Gi"),
    ("1.5Gi", 3 * 2**29 * 10**9, "1536Mi"),
    ("0.5Ki", 512 * 10**9, "512"),
    ("1024Ki", 2**20 * 10**9, "1Mi"),
    ("1025Ki", 1025 * 2**10 * 10**9, "1025Ki"),
    ("128974848", 128974848 * 10**9, "128974848"),
    ("129e6", 129 * 10**15, "129e6"),
    ("1E3", 10**12, "1e3"),
    ("1e+3", 10**12, "1e3"),
    ("001e3", 10**12, "1e3"),
    ("1e-3", 10**6, "1e-3"),
    ("1e-10", 1, "1e-9"),
    ("-1e-10", -1, "-1e-9"),
    ("100u", 10**5, "100u"),
    ("10n", 10, "10n"),
    ("0.1n", 1, "1n"),
    ("1E", 10**27, "1E"),
    ("7Ei", 7 * 2**60 * 10**9, "7Ei"),
    ("1000m", 10**9, "1"),
    ("1e000000000000000000000000000001", 10 * 10**9, "10"),
    ("1e9223372036854775807", SAT, "9223372036854775808"),
    ("1e-9223372036854775808", 1, "1e-9"),
    ("1e10000000", SAT, "9223372036854775808"),
    ("10e9999999", SAT, "9223372036854775808"),
    ("1e400", SAT, "9223372036854775808"),
    ("8Ei", SAT, "8Ei"),
    ("9223372036854775807", q.MAX_NANOS, "9223372036854775807"),
    ("9223372036854775808", SAT, "9223372036854775808"),
    ("-1e400", -SAT, "-9223372036854775808"),
    # ParseQuantity's leniency: no digits is zero, unless it would need its slow path.
    ("+", 0, "0"),
    (".", 0, "0"),
    ("m", 0, "0"),
    ("Ki", 0, "0"),
    (".Ti", 0, "0"),
    ("e-9", 0, "0"),
    ("Pi", None, ""),
    ("+Ei", None, ""),
    ("e-10", None, ""),
    # Not quantities.
    ("", None, ""),
    ("1e1.5", None, ""),
    ("1e9223372036854775808", None, ""),
    ("1e-9223372036854775809", None, ""),
    ("1K", None, ""),
    ("1ki", None, ""),
    ("1KI", None, ""),
    ("1e", None, ""),
    ("1e+", None, ""),
    ("1e--1", None, ""),
    ("1Mi5", None, ""),
    ("1e5m", None, ""),
    ("1mE5", None, ""),
    (" 1", None, ""),
    ("1 ", None, ""),
    ("1\n", None, ""),
    ("1.5.5", None, ""),
    ("..", None, ""),
    ("--1", None, ""),
    ("+-1", None, ""),
    ("0x10", None, ""),
    ("1_000", None, ""),
    ("\uff11", None, ""),
    ("1Zi", None, ""),
    ("lots", None, ""),
    (
        "1" * 65,
        SAT,
        "9223372036854775808",
    ),  # beyond MAX_LENGTH: the CRDs refuse it, the parser reads it
]


def accepts(text: str) -> bool:
    try:
        q.scan(text)
    except q.QuantityError:
        return False
    return True


def crd_accepts(text: str) -> bool:
    """The CRD's pattern and maxLength, as the API server applies them."""
    return len(text) <= q.MAX_LENGTH and PATTERN.search(text) is not None


def in_crd_language(text: str) -> bool:
    """What the CRD pattern should match: the parser's language, non-negative, with digits,
    an exponent of at most 18 significant digits, at most MAX_LENGTH characters."""
    if not accepts(text) or text.startswith("-") or len(text) > q.MAX_LENGTH:
        return False
    number = re.match(r"\+?([0-9.]*)", text)
    assert number is not None
    if not re.search("[0-9]", number.group(1)):
        return False
    exponent = re.search(r"[eE][+-]?([0-9]+)$", text)
    return exponent is None or len(exponent.group(1).lstrip("0")) <= 18


@pytest.mark.parametrize(("text", "nanos", "canonical"), TABLE)
def test_table(text: str, nanos: int | None, canonical: str) -> None:
    if nanos is None:
        with pytest.raises(q.QuantityError, match="is not a quantity"):
            q.scan(text)
        return
    assert q.nanos(text) == nanos
    assert q.parse(text) == Fraction(nanos, q.NANO)
    assert q.canonicalize(text) == canonical


@pytest.mark.parametrize(("text", "nanos", "canonical"), TABLE)
def test_crd_pattern_matches_the_parsers_language(
    text: str, nanos: int | None, canonical: str
) -> None:
    assert crd_accepts(text) == in_crd_language(text)


@given(
    st.one_of(
        st.text(alphabet="0123456789.+-eEinumkKMGTP", max_size=12),
        st.from_regex(QUANTITY_PATTERN, fullmatch=True),
        st.text(max_size=8),
    )
)
def test_crd_pattern_and_parser_agree_on_any_string(text: str) -> None:
    assert crd_accepts(text) == in_crd_language(text)


def test_errors_name_the_value_and_the_rule() -> None:
    with pytest.raises(q.QuantityError) as bad:
        q.parse("1e1.5")
    assert str(bad.value).startswith("1e1.5 is not a quantity: a quantity is an optionally")
    with pytest.raises(q.QuantityError, match="exponent is beyond a 64-bit integer"):
        q.parse("1e99999999999999999999")
    with pytest.raises(q.QuantityError, match=r"\(100000 characters\)"):
        q.parse("x" * 100000)
    with pytest.raises(q.QuantityError, match="longer than"):
        q.parse("1" * (q.READ_LIMIT + 1))


@pytest.mark.parametrize(
    ("value", "nanos"),
    [
        (3, 3 * 10**9),
        (0, 0),
        (2**63 - 1, q.MAX_NANOS),
        (2**63, SAT),
        (10**400, SAT),
        (-(10**400), -SAT),
        (0.25, 25 * 10**7),
        (1e300, SAT),
        (Fraction(1, 3), 333333334),
        (Fraction(-1, 3), -333333334),
    ],
)
def test_numbers_as_json_carries_them(value: int | float | Fraction, nanos: int) -> None:
    assert q.nanos(value) == nanos


@pytest.mark.parametrize("value", [True, None, float("nan"), float("inf"), [], {}])
def test_non_numbers_are_refused(value: object) -> None:
    with pytest.raises(q.QuantityError):
        q.nanos(value)  # type: ignore[arg-type]


def test_rounding_up_like_the_scheduler() -> None:
    assert q.milli("100u") == 1
    assert q.milli("0.0015") == 2
    assert q.whole("1.5") == 2
    assert q.milli("2") == 2000
    assert q.milli("1e400") == SAT // 10**6
    assert q.whole("-1.5") == -1


def test_beyond_the_bound() -> None:
    assert not q.is_beyond(q.parse("9223372036854775807"))
    assert q.is_beyond(q.parse("9223372036854775808"))
    assert q.is_beyond(q.parse("1e10000000"))
    assert q.is_beyond(q.parse("-1e10000000"))
    assert not q.is_beyond(q.parse("1e-10000000"))


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        ("cpu", Fraction(3, 2), "1500m"),
        ("cpu", Fraction(2), "2"),
        ("cpu", Fraction(10**18), "1E"),
        ("memory", Fraction(4 * 2**30), "4Gi"),
        ("memory", Fraction(1000), "1k"),
        ("memory", Fraction(1, 2), "500m"),
        ("hugepages-2Mi", Fraction(2**21), "2Mi"),
        ("nvidia.com/gpu", Fraction(8), "8"),
        ("cpu", Fraction(0), "0"),
        ("cpu", Fraction(10) ** 400, "9223372036854775808"),
        ("memory", Fraction(10) ** 400, "8Ei"),
    ],
)
def test_canonical_form_by_resource(resource: str, value: Fraction, text: str) -> None:
    assert q.canonical(value, q.format_for(resource)) == text


FORMATS = st.sampled_from([q.DECIMAL_SI, q.BINARY_SI, q.DECIMAL_EXPONENT])
NANOS = st.one_of(
    st.integers(min_value=-q.MAX_NANOS, max_value=q.MAX_NANOS),
    st.integers(min_value=0, max_value=10**6).map(lambda n: n * 10**9),
    st.integers(min_value=0, max_value=2**20).map(lambda n: n * 2**30 * 10**9),
    st.sampled_from([SAT, -SAT, q.MAX_NANOS, 1, -1]),
)


@given(NANOS, FORMATS)
def test_canonical_form_round_trips(nanos: int, fmt: q.Format) -> None:
    text = q.canonical(Fraction(nanos, q.NANO), fmt)
    assert q.nanos(text) == nanos
    # Read back, a binary-SI "125000" is decimal: canonical then as "125k", and stays so.
    again = q.canonicalize(text)
    assert q.canonicalize(again) == again
    assert fmt == q.BINARY_SI or again == text
    assert len(text) <= 32
    if nanos >= 0:  # what Pilotfish writes, the CRD accepts
        assert PATTERN.search(text)


SUFFIXES = {
    **{s: Fraction(10) ** e for s, e in q._DECIMAL.items()},
    **{s: Fraction(2) ** e for s, e in q._BINARY.items()},
}


@st.composite
def sane(draw: st.DrawFn) -> tuple[str, Fraction]:
    """A quantity string and its exact value, computed without the parser."""
    whole = draw(st.integers(min_value=0, max_value=10**12))
    digits = draw(st.text(alphabet="0123456789", max_size=12))
    number = f"{whole}.{digits}" if digits or draw(st.booleans()) else str(whole)
    value = Fraction(f"{whole}.{digits or '0'}")
    if draw(st.booleans()):
        exponent = draw(st.integers(min_value=-30, max_value=6))
        return f"{number}e{exponent}", value * Fraction(10) ** exponent
    suffix = draw(st.sampled_from(sorted(SUFFIXES)))
    return f"{number}{suffix}", value * SUFFIXES[suffix]


def rounded_up(value: Fraction) -> Fraction:
    """The value rounded up to the nano-unit, as the API server keeps it; saturated."""
    nanos = -(-value.numerator * q.NANO // value.denominator)
    return Fraction(nanos if value <= q.MAX else SAT, q.NANO)


@given(sane(), sane())
def test_values_are_exact_and_ordered_like_fractions(
    a: tuple[str, Fraction], b: tuple[str, Fraction]
) -> None:
    (text_a, exact_a), (text_b, exact_b) = a, b
    assert q.parse(text_a) == rounded_up(exact_a)
    if exact_a <= exact_b:
        assert q.parse(text_a) <= q.parse(text_b)
    if all(v <= q.MAX and (v * q.NANO).denominator == 1 for v in (exact_a, exact_b)):
        assert (q.parse(text_a) < q.parse(text_b)) == (exact_a < exact_b)


ADVERSARIAL = [
    "9" * 10000,
    "1e99999999",
    "1e-99999999",
    "1e9223372036854775807",
    "-1e-9223372036854775808",
    "0." + "0" * 100000 + "1Ki",
    "." + "7" * 100000 + "Ei",
    "1" * 100000 + "e-99990",
    "1" + "0" * (q.READ_LIMIT - 1),
    "1" * (q.READ_LIMIT + 1),
    "1e" + "9" * 100000,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: f"{t[:12]}...{len(t)}")
def test_cost_does_not_depend_on_the_value(text: str) -> None:
    """The issue's bound as behaviour: no string, however absurd its value, takes long to
    read (the slowest here is megabytes long, and linear in that)."""
    started = time.perf_counter()
    try:
        nanos = q.nanos(text)
    except q.QuantityError:
        nanos = None
    assert time.perf_counter() - started < 0.25
    assert nanos is None or abs(nanos) <= SAT

"""Kubernetes resource quantities, as byte counts.

Pods state their per-GPU memory need as a Kubernetes quantity (``gpusched.io/gpu-memory-per-gpu:
40Gi``). This module turns such strings into whole bytes with the same suffix rules the API
server uses (binary ``Ki Mi Gi Ti Pi Ei``, decimal ``k M G T P E``, a plain number, or a decimal
exponent such as ``4e9``), so a value that ``kubectl`` accepts means the same here.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from types import MappingProxyType

from gpusched_api.untrusted import shown

_BINARY = MappingProxyType({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60})
_DECIMAL = MappingProxyType({"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18})
# A number, then either a suffix or a decimal exponent (never both), as in apimachinery.
_QUANTITY = re.compile(
    r"^(?P<num>\+?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE](?P<exp>[+-]?\d+))?$"
)

MIB = 2**20
GIB = 2**30
# apimachinery prints no quantity longer than a few dozen characters: the bound keeps Decimal
# arithmetic on an author's megabyte-long number from ever starting.
MAX_QUANTITY_CHARS = 64


def _match(pattern: re.Pattern[str], text: object, what: str) -> re.Match[str] | None:
    """``text`` matched against ``pattern``; ValueError for a non-string or one past the bound."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string, got {shown(text)}")
    if len(text) > MAX_QUANTITY_CHARS:
        raise ValueError(f"{shown(text, 24)} is longer than any {what} ({MAX_QUANTITY_CHARS} characters at most)")
    return pattern.match(text.strip())


def parse_quantity_bytes(text: str) -> int:
    """Parse a Kubernetes quantity such as ``"40Gi"``, ``"1.5Gi"`` or ``"4e10"`` into bytes.

    Fractions of a byte round up (a need is never understated). Raises ``ValueError`` with the
    offending text and an example for anything else: empty strings, negative values, unknown or
    wrongly cased suffixes (``"40GB"``, ``"40gi"``), milli-units (``"500m"`` of a byte).
    """
    match = _match(_QUANTITY, text, "quantity")
    if match is None:
        raise ValueError(
            f"{shown(text)} is not a Kubernetes quantity; use a number with an optional suffix "
            "Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), e.g. '40Gi'"
        )
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"{shown(text)} is not a Kubernetes quantity") from exc
    suffix = match["suffix"] or ""
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if exponent > 30:
            raise ValueError(f"{shown(text)} is too large to be a byte count")
        value = number * (Decimal(10) ** exponent)
    else:
        value = number * (_BINARY.get(suffix) or _DECIMAL[suffix])
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def format_gib(num_bytes: int) -> str:
    """Render bytes as GiB with one decimal (``"40.0 GiB"``), the unit used in every reason."""
    return f"{num_bytes / GIB:.1f} GiB"


# CPU quantities also take the small decimal suffixes (``m`` milli, ``u`` micro, ``n`` nano).
_CPU_QUANTITY = re.compile(
    r"^(?P<num>\+?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+))?$"
)
_SMALL = MappingProxyType({"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")})


def parse_cpu_milli(text: str) -> int:
    """Parse a Kubernetes CPU quantity (``"64"``, ``"63500m"``, ``"0.5"``) into millicores.

    Fractions of a millicore round up, as apimachinery's ``MilliValue`` does. Raises ``ValueError``
    naming the text and an example for anything else (empty, negative, ``"2 cores"``, ``"500M m"``).
    """
    match = _match(_CPU_QUANTITY, text, "CPU quantity")
    if match is None:
        raise ValueError(f"{shown(text)} is not a Kubernetes CPU quantity; use cores ('4', '0.5') or millicores ('500m')")
    number = Decimal(match["num"])
    suffix = match["suffix"] or ""
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if exponent > 18:
            raise ValueError(f"{shown(text)} is too large to be a CPU quantity")
        value = number * (Decimal(10) ** exponent)
    else:
        value = number * (_SMALL.get(suffix) or _BINARY.get(suffix) or _DECIMAL[suffix])
    return int((value * 1000).to_integral_value(rounding=ROUND_CEILING))


def binary_quantity(n: int) -> str:
    """``n`` bytes as the apiserver's canonical binary quantity: the largest power of 1024 that
    divides it (``42949672960`` -> ``40Gi``), a plain number below 1024 (as Go's ``Quantity``)."""
    if n < 1024:
        return str(n)
    for exponent, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if n % 1024 ** exponent == 0:
            return f"{n // 1024 ** exponent}{suffix}"
    return str(n)

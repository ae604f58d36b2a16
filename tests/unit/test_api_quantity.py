import pytest

from gpusched_api.quantity import format_gib, parse_quantity_bytes


@pytest.mark.parametrize(("text", "expected"), [
    ("40Gi", 40 * 2**30),
    ("1.5Gi", 3 * 2**29),
    ("512Mi", 512 * 2**20),
    ("1Ti", 2**40),
    ("4Ki", 4096),
    ("40G", 40 * 10**9),
    ("500M", 500 * 10**6),
    ("2k", 2000),
    ("1024", 1024),
    ("4e9", 4 * 10**9),
    ("0.5", 1),  # fractions of a byte round up
    (" 8Gi ", 8 * 2**30),
], ids=lambda v: repr(v) if isinstance(v, str) else None)
def test_parses_kubernetes_quantities(text: str, expected: int) -> None:
    assert parse_quantity_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "Gi", "40GB", "40gi", "-1Gi", "forty", "1.2.3Gi", "500m", "1e99"])
def test_rejects_garbage_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match="quantity|too large"):
        parse_quantity_bytes(text)


def test_format_gib_uses_one_decimal() -> None:
    assert format_gib(40 * 2**30) == "40.0 GiB"

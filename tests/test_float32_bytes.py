"""D3: float32 bits and bytes, against constants worked out by hand.

6.342e-5 = 1.03907328 × 2^-14 (6.342e-5 × 16384 = 1.03907328, in [1, 2)): sign 0, biased
exponent 127 - 14 = 113 = 0b01110001, fraction round(0.03907328 × 2^23) = round(327770.43)
= 327770 = 0x05005A. Bits 0 01110001 00001010000000001011010 = 0x3885005A, so the bytes are
38 85 00 5A big-endian and 5A 00 85 38 little-endian; the stored value is
(2^23 + 327770) / 2^37 = 4358189 / 2^36.
"""

import csv
import struct
import sys

import pytest

from dmls.special.float32_bytes.measure import float32_fields, run


def test_6_342e_5_matches_the_hand_computation():
    f = float32_fields(6.342e-5)
    assert (f["sign"], f["exponent_biased"], f["exponent"]) == (0, 113, -14)
    assert (f["fraction"], f["fraction_hex"]) == (327770, "0x05005A")
    assert f["bits_hex"] == "0x3885005A"
    assert f["bits_binary"] == "0 01110001 00001010000000001011010"
    assert f["bytes_big_endian"] == "38 85 00 5a"
    assert f["bytes_little_endian"] == "5a 00 85 38"
    assert f["stored_value_fraction"] == f"4358189/{2**36}"
    assert f["round_trip_exact"]
    assert f["round_trip_little_endian"] == f["round_trip_big_endian"] == 4358189 / 2**36
    # float32 keeps 24 significant bits: the rounding error is below 2^-24 relative.
    assert 0 < abs(f["relative_rounding_error"]) < 2**-24


def test_sign_and_exponent_of_other_values():
    assert float32_fields(1.0)["bits_hex"] == "0x3F800000"
    minus = float32_fields(-2.5)  # -1.25 × 2^1
    assert (minus["sign"], minus["exponent_biased"], minus["fraction_hex"]) == (1, 128, "0x200000")
    assert minus["bytes_big_endian"] == "c0 20 00 00"


@pytest.mark.parametrize("value", [0.0, float("inf"), 1e-45])
def test_non_normal_numbers_are_refused(value):
    with pytest.raises(ValueError, match="not a normal float32"):
        float32_fields(value)


def test_the_host_byte_order_is_reported_and_matches_native_bytes():
    f = float32_fields(6.342e-5)
    assert f["host_byte_order"] == sys.byteorder
    assert f["native_matches"] == sys.byteorder
    native = struct.pack("=f", 6.342e-5).hex(" ")
    assert f["native_bytes"] == native


def test_run_writes_the_byte_table_and_the_figure(tmp_path):
    result = run({"value": 6.342e-5}, tmp_path)
    assert result["rows"][0]["status"] == "ok"
    with open(tmp_path / "bytes.csv") as f:
        table = {r["order"]: r["bytes_hex"] for r in csv.DictReader(f)}
    assert table["big-endian (network)"] == "38 85 00 5a"
    assert (tmp_path / "bits.png").stat().st_size > 0

"""D3: a float32 as IEEE-754 bits and as bytes on the wire, computed on this host.

binary32: 1 sign bit, 8 exponent bits (bias 127), 23 fraction bits; a normal number is
(-1)^sign × (1 + fraction / 2^23) × 2^(exponent - 127). `struct` packs with an explicit byte
order ('<' little-endian as on x86, '>' big-endian, the network order); numpy's native
`tobytes()` shows which of the two this host uses.
"""

from __future__ import annotations

import struct
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.patches import Rectangle

from dmls.files import new_figure, save_figure, write_csv

EXPONENT_BIAS = 127
FRACTION_BITS = 23


def float32_fields(value: float) -> dict[str, Any]:
    """Bits, bytes and the exact stored value of `value` rounded to float32."""
    big = struct.pack(">f", value)
    little = struct.pack("<f", value)
    bits = struct.unpack(">I", big)[0]
    sign, exponent, fraction = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent in (0, 0xFF):
        raise ValueError(f"{value!r} is not a normal float32 (zero, subnormal, inf or NaN)")
    stored = Fraction(struct.unpack(">f", big)[0])
    rebuilt = (
        (-1) ** sign
        * (1 + Fraction(fraction, 2**FRACTION_BITS))
        * Fraction(2) ** (exponent - EXPONENT_BIAS)
    )
    if rebuilt != stored:  # the formula in the docstring is the one the bytes obey
        raise AssertionError(f"fields of {value!r} rebuild {rebuilt}, not {stored}")
    native = np.float32(value).tobytes()
    intended = Fraction(repr(value))
    return {
        "value": value,
        "bits_hex": f"0x{bits:08X}",
        "bits_binary": f"{sign:01b} {exponent:08b} {fraction:023b}",
        "sign": sign,
        "exponent_biased": exponent,
        "exponent": exponent - EXPONENT_BIAS,
        "fraction": fraction,
        "fraction_hex": f"0x{fraction:06X}",
        "significand": float(1 + Fraction(fraction, 2**FRACTION_BITS)),
        "stored_value_exact": str(Decimal(float(stored))),
        "stored_value_fraction": f"{stored.numerator}/{stored.denominator}",
        "relative_rounding_error": float((stored - intended) / intended),
        "bytes_little_endian": little.hex(" "),
        "bytes_big_endian": big.hex(" "),
        "round_trip_little_endian": struct.unpack("<f", little)[0],
        "round_trip_big_endian": struct.unpack(">f", big)[0],
        "round_trip_exact": struct.unpack("<f", little)[0] == float(stored)
        and struct.unpack(">f", big)[0] == float(stored),
        "host_byte_order": sys.byteorder,
        "native_bytes": native.hex(" "),
        "native_matches": "little" if native == little else "big" if native == big else "neither",
    }


def run(cfg: dict[str, Any], out_dir: Path, **_: Any) -> dict[str, Any]:
    fields = float32_fields(cfg["value"])
    write_csv(
        out_dir / "bytes.csv",
        [
            {"order": "little-endian (x86)", "bytes_hex": fields["bytes_little_endian"]},
            {"order": "big-endian (network)", "bytes_hex": fields["bytes_big_endian"]},
            {"order": f"native ({sys.byteorder}, numpy)", "bytes_hex": fields["native_bytes"]},
        ],
        ["order", "bytes_hex"],
    )
    save_figure(_bit_layout(fields), out_dir / "bits.png")
    row = {"status": "ok", "reason": None, **fields}
    return {"rows": [row]}


def _bit_layout(fields: dict[str, Any]):
    """The 32 bits as boxes, coloured by field (sign, exponent, fraction)."""
    bits = fields["bits_binary"].replace(" ", "")
    fig = new_figure(10, 1.6)
    ax = fig.add_subplot()
    colours = ["#d62728"] + ["#1f77b4"] * 8 + ["#2ca02c"] * 23
    for i, (bit, colour) in enumerate(zip(bits, colours, strict=True)):
        ax.add_patch(Rectangle((i, 0), 1, 1, facecolor=colour, edgecolor="white"))
        ax.text(i + 0.5, 0.5, bit, ha="center", va="center", fontsize=9, color="white")
    ax.set_xlim(0, 32)
    ax.set_ylim(0, 1)
    ax.set_xticks(
        [0.5, 5, 20.5],
        ["sign", f"exponent {fields['exponent_biased']}", f"fraction {fields['fraction_hex']}"],
    )
    ax.set_yticks([])
    ax.set_title(
        f"{fields['value']!r} as float32 = {fields['bits_hex']}: "
        f"little-endian {fields['bytes_little_endian']}, big-endian {fields['bytes_big_endian']}",
        fontsize=9,
    )
    return fig

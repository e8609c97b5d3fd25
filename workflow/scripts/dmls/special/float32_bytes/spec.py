"""The declaration of D3 (the bytes of a float32, computed by measure.py beside it): the
facts its answer is filled from and what its report section shows (dmls/study_spec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmls.report.comparisons import NotMeasured
from dmls.report.special_answers import finished_rows, skip_reason
from dmls.report.study import OK
from dmls.report.wording import (
    fmt_sig,
    minus,
)
from dmls.study_spec import Facts, StudySpec, Table


def facts(summary: dict[str, Any], folder: Path) -> Facts:
    """D3: the value's bits by field, its bytes in both orders, and the round trip. Cases:
    "exact" (both byte orders give back the stored float32), "inexact"."""
    rows = finished_rows(summary)
    r = rows[0]
    if r["status"] != OK:
        raise NotMeasured(skip_reason(rows))
    sign, exponent, fraction = r["bits_binary"].split()
    facts = {
        "value": repr(r["value"]),
        "bits_hex": r["bits_hex"],
        "sign": f"{sign} ({'negative' if r['sign'] else 'positive'})",
        "exponent": minus(f"{exponent} (biased {r['exponent_biased']}, so 2^{r['exponent']})"),
        "fraction": f"{fraction} ({r['fraction_hex']}, significand {r['significand']!r})",
        "little": r["bytes_little_endian"],
        "big": r["bytes_big_endian"],
        "host": f"{r['host_byte_order']}-endian",
        "stored": repr(r["round_trip_little_endian"]),
        "error": fmt_sig(r["relative_rounding_error"], 3),
    }
    exact = r["round_trip_exact"] in (True, "True") and (
        r["round_trip_little_endian"] == r["round_trip_big_endian"]
    )
    return ("exact" if exact else "inexact"), facts


SPEC = StudySpec(
    name="float32_bytes",
    cases=("exact", "inexact"),
    facts=facts,
    tables=(
        Table(
            "The bytes of the float32 in both byte orders",
            "bytes.csv",
        ),
    ),
    shown_facts=(
        "value",
        "bits_hex",
        "bits_binary",
        "sign",
        "exponent_biased",
        "exponent",
        "fraction_hex",
        "significand",
        "stored_value_exact",
        "stored_value_fraction",
        "relative_rounding_error",
        "bytes_little_endian",
        "bytes_big_endian",
        "round_trip_little_endian",
        "round_trip_big_endian",
        "round_trip_exact",
        "host_byte_order",
        "native_matches",
    ),
)

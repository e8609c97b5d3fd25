"""D7: what makes serialization hard, shown by running it (the written assignment's question 5).

Four parts, each a table of what happened on this host's Python:
- representation: the same values through `struct` (both byte orders), numpy's `tobytes`,
  `pickle` and JSON (read back by Python, and by a receiver whose numbers are float64, as
  JavaScript's are): bytes, round trip exact or not, what a wrong byte order reads, the error
  where a format refuses a value;
- references: an object referenced twice and a list that contains itself, through pickle and
  JSON: identity kept, duplicated or refused;
- depth: the deepest nesting of lists each format writes and reads back at Python's default
  recursion limit, found by bisection in a fresh interpreter (so the caller's stack and a crash
  of the probe change nothing here);
- trust: a model's state_dict through torch.save and torch.load(weights_only=True), and a
  pickle whose loading runs code (it makes a directory), loaded by pickle and by torch.load.
Every row says what the sender and the receiver must agree on for the bytes to mean anything.
"""

from __future__ import annotations

import io
import json
import logging
import math
import pickle
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmls.files import write_csv
from dmls.special import error_line

log = logging.getLogger(__name__)

# What a receiver needs besides the bytes, per format.
AGREE = {
    "struct": "the format string: each field's type, width and byte order (the bytes carry none)",
    "numpy": "dtype, byte order and shape (tobytes writes the elements only)",
    "pickle": "Python, the same classes importable on both sides, and trust: loading runs code",
    "JSON": "UTF-8 text and a schema: field names and types, the range of numbers",
    "JSON, strict": "as JSON; NaN and infinities have no spelling, so they travel as null or text",
    "JSON, float64 reader": "as JSON, and that integers beyond 2^53 travel as strings",
    "torch.save": "torch, the state_dict's keys and shapes; weights_only=True to load tensors only",
}
REPRESENTATION_COLUMNS = (
    "value", "type", "format", "code", "bytes", "round_trip", "read_back", "other_order_reads",
    "error", "agree",
)  # fmt: skip
REFERENCE_COLUMNS = (
    "case", "format", "bytes", "round_trip", "identity_kept", "error", "agree"
)  # fmt: skip
DEPTH_COLUMNS = ("format", "phase", "deepest", "tried_up_to", "recursion_limit", "error", "agree")
TRUST_COLUMNS = ("case", "format", "loader", "bytes", "result", "code_ran", "error", "agree")
# A float with a short decimal, D3's float, the first integer a float64 can't hold, one past
# int64, and NaN.
VALUES = (0.1, 6.342e-5, 2**53 + 1, 2**64, math.nan)
# The bisection's upper end: deeper than any default limit, small enough to build in a blink.
MAX_DEPTH = 1 << 20


def _same(a: Any, b: Any) -> bool:
    """Equal in type and value; NaN equals NaN (its bits are what travels)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _codecs(value: Any) -> list[tuple[str, str, Callable, Callable, Callable | None]]:
    """(format, code, write, read, read with the other byte order) for one value."""
    code = "q" if isinstance(value, int) else "d"
    dtype = np.int64 if isinstance(value, int) else np.float64
    plain = int if isinstance(value, int) else float

    def struct_pair(order: str, other: str):
        return (
            lambda v: struct.pack(order + code, v),
            lambda b: struct.unpack(order + code, b)[0],
            lambda b: struct.unpack(other + code, b)[0],
        )

    return [
        ("struct", f"'<{code}' little-endian", *struct_pair("<", ">")),
        ("struct", f"'>{code}' big-endian (network)", *struct_pair(">", "<")),
        (
            "numpy",
            f"{np.dtype(dtype).name}, native order ({sys.byteorder})",
            lambda v: np.array([v], dtype=dtype).tobytes(),
            lambda b: plain(np.frombuffer(b, dtype=dtype)[0]),
            lambda b: plain(np.frombuffer(b, dtype=np.dtype(dtype).newbyteorder())[0]),
        ),
        (
            "pickle",
            f"protocol {pickle.HIGHEST_PROTOCOL}",
            lambda v: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL),
            pickle.loads,
            None,
        ),
        (
            "JSON",
            "json.dumps (Python's default; NaN as the token NaN, which RFC 8259 lacks)",
            lambda v: json.dumps(v).encode(),
            json.loads,
            None,
        ),
        (
            "JSON, strict",
            "RFC 8259: json.dumps(allow_nan=False)",
            lambda v: json.dumps(v, allow_nan=False).encode(),
            json.loads,
            None,
        ),
        (
            "JSON, float64 reader",
            "json.loads(parse_int=float), as JavaScript reads numbers",
            lambda v: json.dumps(v).encode(),
            lambda b: json.loads(b, parse_int=float),
            None,
        ),
    ]


def representation(values: Sequence[Any]) -> list[dict[str, Any]]:
    """Each value through each format: bytes, round trip, and what fails."""
    rows = []
    for value in values:
        for fmt, code, write, read, misread in _codecs(value):
            row: dict[str, Any] = {
                "value": _label(value),
                "type": type(value).__name__,
                "format": fmt,
                "code": code,
            }
            try:
                data = write(value)
            except (ValueError, OverflowError, struct.error) as e:
                rows.append(row | {"round_trip": "refused", "error": error_line(e, qualified=True)})
                continue
            back = read(data)
            exact = _same(value, back)
            row |= {
                "bytes": len(data),
                "round_trip": "exact" if exact else "changed",
                "read_back": _label(back),
                "other_order_reads": _label(misread(data)) if misread else None,
            }
            rows.append(row)
    for row in rows:
        row["agree"] = AGREE[row["format"]]
    return rows


def _label(value: Any) -> str:
    """A value as a reader recognises it: 2^53 + 1 named, NaN spelled as Python makes one."""
    if isinstance(value, float) and math.isnan(value):
        return "float('nan')"
    if isinstance(value, int) and value > 2**53:
        k = value.bit_length() - 1
        if value - 2**k in (0, 1):
            return f"{value} (2^{k}{' + 1' if value - 2**k else ''})"
    return repr(value)


def references(payload_floats: int = 1000) -> list[dict[str, Any]]:
    """A list referenced twice, and a list that contains itself, through pickle and JSON."""
    shared = [float(i) for i in range(payload_floats)]
    cases = {
        "shared": ({"first": shared, "second": shared}, lambda o: o["first"] is o["second"]),
        "cycle": (_cycle(), lambda o: o[0] is o),
    }
    codecs: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
        "pickle": (lambda o: pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads),
        "JSON": (lambda o: json.dumps(o).encode(), json.loads),
    }
    rows = []
    for case, (obj, identical) in cases.items():
        for fmt, (write, read) in codecs.items():
            row: dict[str, Any] = {"case": case, "format": fmt, "agree": AGREE[fmt]}
            try:
                data = write(obj)
            except (ValueError, RecursionError) as e:
                rows.append(row | {"round_trip": "refused", "error": error_line(e, qualified=True)})
                continue
            back = read(data)
            kept = identical(back)
            rows.append(
                row
                | {
                    "bytes": len(data),
                    "round_trip": "identity kept" if kept else "duplicated",
                    "identity_kept": kept,
                }
            )
    return rows


def _cycle() -> list:
    loop: list = []
    loop.append(loop)
    return loop


# Run in a fresh interpreter: for each format, the deepest nested list [[...[]...]] it writes,
# and the deepest it reads (input made by hand: JSON text, pickle opcodes), by bisection, each
# with its error one level deeper.
_DEPTH_PROBE = textwrap.dedent(
    """
    import json, pickle, sys

    def nested(depth):
        value = []
        for _ in range(depth):
            value = [value]
        return value

    def depth_of(value):
        n = 0
        while value:
            value, n = value[0], n + 1
        return n

    # Input of a given depth without writing it: JSON's brackets; pickle's opcodes, one
    # EMPTY_LIST per level and one APPEND per level below the first, after the protocol 2 header.
    WRITE = {
        "pickle": lambda d: pickle.dumps(nested(d), protocol=pickle.HIGHEST_PROTOCOL),
        "JSON": lambda d: json.dumps(nested(d)),
    }
    READ = {
        "pickle": lambda d: pickle.loads(b"\\x80\\x02" + b"]" * (d + 1) + b"a" * d + b"."),
        "JSON": lambda d: json.loads("[" * (d + 1) + "]" * (d + 1)),
    }

    def attempt(step, depth):
        try:
            value = step(depth)
        except (RecursionError, MemoryError, ValueError) as e:
            return type(e).__name__ + ": " + str(e).splitlines()[0]
        if isinstance(value, list) and depth_of(value) != depth:
            return "read back a different depth"
        return None

    def deepest(step, limit):
        if attempt(step, limit) is None:
            return limit, None
        lo, hi = 0, limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if attempt(step, mid) is None else (lo, mid)
        return lo, attempt(step, hi)

    limit = int(sys.argv[1])
    out = {"recursion_limit": sys.getrecursionlimit()}
    for fmt in WRITE:
        for phase, steps in (("write", WRITE), ("read", READ)):
            out[fmt + "_" + phase] = deepest(steps[fmt], limit)
    print(json.dumps(out))
    """
)


def depth(max_depth: int = MAX_DEPTH) -> list[dict[str, Any]]:
    """The deepest nesting each format writes and reads, in a fresh interpreter at its default
    recursion limit; `max_depth` where it never failed."""
    done = subprocess.run(
        [sys.executable, "-c", _DEPTH_PROBE, str(max_depth)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RuntimeError(f"the depth probe ended with exit {done.returncode}: {reason}")
    found = json.loads(done.stdout)
    return [
        {
            "format": fmt,
            "phase": {"write": "writing", "read": "reading"}[phase],
            "deepest": found[f"{fmt}_{phase}"][0],
            "tried_up_to": max_depth,
            "recursion_limit": found["recursion_limit"],
            "error": found[f"{fmt}_{phase}"][1],
            "agree": AGREE[fmt],
        }
        for fmt in ("pickle", "JSON")
        for phase in ("write", "read")
    ]


class RunsOnLoad:
    """A pickle that runs code when loaded: unpickling calls os.mkdir(marker), as a hostile
    file could call anything importable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.mkdir, (str(self.marker),)


def trust(out_dir: Path) -> list[dict[str, Any]]:
    """A state_dict through torch.save / torch.load(weights_only=True); a code-running pickle
    through pickle.loads and torch.load(weights_only=True)."""
    import torch

    from dmls.training.models import course_cnn

    torch.manual_seed(0)
    state = course_cnn().state_dict()
    saved = _torch_bytes(state)
    back = torch.load(io.BytesIO(saved), weights_only=True)
    exact = back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    rows: list[dict[str, Any]] = [
        {
            "case": "state_dict of the course CNN",
            "format": "torch.save",
            "loader": "torch.load(weights_only=True)",
            "bytes": len(saved),
            "result": f"{len(state)} tensors, all equal" if exact else "tensors differ",
            "code_ran": False,
        }
    ]
    for fmt, loader, dump, load in (
        ("pickle", "pickle.loads", pickle.dumps, pickle.loads),
        (
            "torch.save",
            "torch.load(weights_only=True)",
            _torch_bytes,
            lambda b: torch.load(io.BytesIO(b), weights_only=True),
        ),
    ):
        marker = out_dir / f"ran-on-load-{fmt.replace('.', '-')}"
        if marker.exists():
            marker.rmdir()
        data = dump(RunsOnLoad(marker))
        row: dict[str, Any] = {
            "case": "a pickle that calls os.mkdir when loaded",
            "format": fmt,
            "loader": loader,
            "bytes": len(data),
        }
        try:
            load(data)
            row["result"] = "loaded"
        except pickle.UnpicklingError as e:
            row |= {"result": "refused", "error": _unsupported(e)}
        row["code_ran"] = marker.exists()
        if marker.exists():
            marker.rmdir()
        rows.append(row)
    for row in rows:
        row["agree"] = AGREE[row["format"]]
    return rows


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unsupported(exc: BaseException) -> str:
    """torch.load's refusal: the line naming the global it refused, else its first sentence."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = next((line for line in lines if "GLOBAL" in line), None)
    if named:  # "Trying to load unsupported GLOBAL posix.mkdir whose module posix is blocked."
        return f"{type(exc).__name__}: {named.removeprefix('Trying to load ').rstrip('.')}"
    return f"{type(exc).__name__}: {lines[0].split('. ')[0] if lines else ''}"


def run(cfg: dict[str, Any], out_dir: Path, **_: Any) -> dict[str, Any]:
    parts: dict[str, list[dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    for name, make, columns in (
        ("representation", lambda: representation(VALUES), REPRESENTATION_COLUMNS),
        ("references", references, REFERENCE_COLUMNS),
        ("depth", depth, DEPTH_COLUMNS),
        ("trust", lambda: trust(out_dir), TRUST_COLUMNS),
    ):
        log.info("D7: %s", name)
        try:
            parts[name] = make()
        except Exception as e:  # a part that fails is recorded; the others stand
            log.exception("D7: %s failed", name)
            rows.append({"part": name, "status": "failed", "reason": error_line(e, qualified=True)})
            continue
        write_csv(out_dir / f"{name}.csv", parts[name], list(columns))
        rows.append({"part": name, "status": "ok", "reason": None})
    return {"rows": rows, **parts}

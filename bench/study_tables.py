"""Print the GPU-relevant numbers of studies C, D1 and B4 from a results folder, as text.

python3 bench/study_tables.py RESULTS_DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from dmls import summary


def table(header: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def main(results: Path) -> None:
    studies = results / "studies"
    for name in ("fused_conv", "lenet_memory", "profiler"):
        path = studies / name / "summary.json"
        if not path.exists():
            print(f"\n{name}: no summary ({path} missing)")
            continue
        s = summary.read(path)
        print(f"\n{s['title']} [{s['status']}] on {s['host']['gpus'] or 'no GPU'}")
        if name == "fused_conv":
            print(
                table(
                    ["depth", "mode", "status", "forward_ms", "backward_ms", "test_acc", "reason"],
                    [
                        [
                            r["depth"],
                            r["mode"],
                            r["status"],
                            r.get("forward_ms"),
                            r.get("backward_ms"),
                            r.get("test_accuracy"),
                            r["reason"],
                        ]
                        for r in s["rows"]
                    ],
                )
            )
        elif name == "lenet_memory":
            print(
                table(
                    [
                        "device",
                        "optimizer",
                        "precision",
                        "recompute",
                        "status",
                        "peak_KiB",
                        "estimate_KiB",
                        "activations_KiB",
                        "other_KiB",
                    ],
                    [
                        [
                            r["device"],
                            r["optimizer"],
                            r["precision"],
                            r["recompute"],
                            r["status"],
                            *(
                                r[k] / 1024 if r.get(k) is not None else None
                                for k in (
                                    "peak_bytes",
                                    "estimate_total_bytes",
                                    "activations_bytes",
                                    "other_bytes",
                                )
                            ),
                        ]
                        for r in s["rows"]
                    ],
                )
            )
        else:
            rows = []
            for r in s["rows"]:
                for kind, v in (r.get("by_kind") or {}).items():
                    gpu = r["device"] == "cuda"
                    where = "device" if gpu else "cpu"
                    rows.append(
                        [
                            r["device"],
                            r["activation"],
                            kind,
                            v[f"{where}_time_ms_mean"],
                            v[f"{where}_memory_kib_mean"],
                        ]
                    )
                if r["status"] != "ok":
                    rows.append([r["device"], r["activation"], r["status"], None, r["reason"]])
            print(table(["device", "activation", "kind", "time_ms", "memory_KiB"], rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""fp8 against bf16 on A3's model and setting (DDP on 2 GPUs, batch 32 per GPU), each with the
steps the engine can run: eager, a CUDA graph of the eager step, and a CUDA graph of the
compiled step (#17's target: the fp8 epoch at most 1.5x bf16's).

    python3 bench/fp8_speed.py [--epochs 4] [--out fp8.json]      # a host with 2 GPUs (sm 89+)

Each row is one training of the pipeline's own engine (bench/epoch_speed.py's DDP path: ranks
started by torch.multiprocessing.spawn, whose docstring says why) on a
synthetic CIFAR-sized set; its steady epoch is the median of epochs 2..E.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epoch_speed import ROOT, a1_spec, cifar_sized_data, train_ddp

sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

DDP = {"launcher": "torchrun", "nproc_per_node": 2, "loader": "device"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", nargs="+", default=["eager", "graph", "compile"])
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp8"])
    parser.add_argument("--out", type=Path, default=Path("fp8_speed.json"))
    args = parser.parse_args()
    work = cifar_sized_data("fp8-speed-")
    data_dir = work / "data"
    rows = []
    for step in args.steps:
        for precision in args.precisions:
            name = f"{precision}_{step}"
            spec = a1_spec(
                name,
                **DDP,
                precision=precision,
                step=step,
                epochs=args.epochs,
                dataset="synthetic_cifar",
            )
            try:
                result = train_ddp(spec, data_dir, work)
            except Exception as e:  # a row that can't run says why, the others still run
                rows.append({"name": name, "error": f"{type(e).__name__}: {e}"})
                print(f"{name}: {rows[-1]['error']}", flush=True)
                continue
            epochs = [h["train_time_s"] for h in result["history"]]
            row = {
                "name": name,
                "status": result["status"],
                "step": result["step"]["mode"] + ("+compile" if result["step"]["compiled"] else ""),
                "eager_reason": result["step"]["eager_reason"],
                "first_epoch_s": epochs[0],
                "steady_epoch_s": result["timing"]["steady_epoch_s"],
                "epochs_s": epochs,
                "test_accuracy": result["final"]["test_accuracy"],
                "fp8_linear_layers": result["fp8_linear_layers"],
                "effective_precision": result["effective_precision"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

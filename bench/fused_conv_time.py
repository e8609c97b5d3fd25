"""Where study C's time goes (issue #41), part by part, on this host: what each mode's training
step and test-set evaluation cost at each depth, and what loading the fused kernel costs.

    python3 bench/fused_conv_time.py --data-dir DIR [--steps 120] [--threads N] [--out c.json]

DIR holds the prepared data (rules/data.smk's output, or datasets.prepare; the config's
fashion_mnist unless --dataset). For every depth and mode of the study's default config
(config/config.yaml), in this process, the study's own training (dmls/special/fused_conv/measure.py
`train`) runs `--steps` steps of batch 64 from the same weights:
- forward and backward per step, as the study times them (CUDA events, perf_counter on the
  CPU), over the steps after the config's warm-up;
- the whole step's wall time (forward, backward, optimizer step, the batch's indexing), from the
  training's wall less its evaluation;
- the evaluation of the whole test set (the study's _accuracy), timed alone.
Before them, loading the extension (torch's build cache under TORCH_EXTENSIONS_DIR: a compile
when empty). From these, what C's protocol costs per depth and mode (the speed repeats, then
the accuracy trainings of `accuracy_modes`), and what training every mode fully `repeats`
times cost before issue #41.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls.config import spec  # noqa: E402
from dmls.data import datasets  # noqa: E402
from dmls.special.fused_conv import measure as fused_conv  # noqa: E402
from dmls.special.fused_conv.kernels.fused_conv_relu import fuse_conv_relu, load_extension  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--dataset", help="the prepared data set (default: the config's)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path("fused_conv_time.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = spec.special_study_config("fused_conv") | (
        {"dataset": args.dataset} if args.dataset else {}
    )
    dataset = datasets.load(args.data_dir, cfg["dataset"])
    tensors = fused_conv._tensors(dataset, cfg)
    n_train = len(tensors[0])
    out: dict[str, Any] = {"threads": args.threads, "n_train": n_train, "config": cfg,
                           "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                           else "cpu", "torch": torch.__version__, "rows": []}  # fmt: skip
    start = time.perf_counter()
    if torch.cuda.is_available():
        load_extension()
    out["extension_load_s"] = time.perf_counter() - start
    print(
        f"{out['device']}, torch {out['torch']}, {args.threads} threads; extension "
        f"{out['extension_load_s']:.1f} s",
        flush=True,
    )
    steps_full = fused_conv.training_steps(n_train, cfg)
    for depth in cfg["depths"]:
        torch.manual_seed(cfg["seed"])
        shape, classes = dataset.manifest["input_shape"], dataset.manifest["num_classes"]
        baseline = fused_conv.build_cnn(depth, cfg, shape, classes)
        for name in cfg["modes"]:
            mode = fused_conv.MODES[name]
            if mode.device == "cuda" and not torch.cuda.is_available():
                continue
            model = fused_conv.copy.deepcopy(baseline)
            if mode.fused:
                fuse_conv_relu(model)
            result = fused_conv.train(
                model,
                mode,
                tensors,
                cfg,
                seed=cfg["seed"],
                steps=args.steps,
                timed_from=cfg["warmup_steps"],
            )
            device = torch.device(mode.device)
            x_test, y_test = tensors[2].to(device), tensors[3].to(device)
            t0 = time.perf_counter()
            with torch.backends.cudnn.flags(enabled=mode.cudnn, allow_tf32=cfg["tf32"]):
                fused_conv._accuracy(model, x_test, y_test)
            if device.type == "cuda":
                torch.cuda.synchronize()
            evaluation = time.perf_counter() - t0
            step = result["wall_time_s"] / result["steps"]
            training = steps_full * step + evaluation  # one full training, then the test set
            trained = name in cfg["accuracy_modes"]
            row = {"depth": depth, "mode": name, "steps": result["steps"],
                   "timed_steps": result["timed_steps"], "forward_ms": result["forward_ms"],
                   "backward_ms": result["backward_ms"], "step_ms": 1e3 * step,
                   "evaluation_s": evaluation,
                   # C's protocol: the speed repeats, then the accuracy trainings of its modes.
                   "protocol_s": cfg["repeats"] * (cfg["warmup_steps"] + cfg["timed_steps"])
                   * step + trained * cfg["accuracy_seeds"] * training,
                   # Before issue #41: every mode trained fully, `repeats` times.
                   "every_mode_trained_s": cfg["repeats"] * training}  # fmt: skip
            out["rows"].append(row)
            print(
                f"depth {depth:>2} {name:<9} forward {row['forward_ms']:7.2f} ms, backward "
                f"{row['backward_ms']:7.2f} ms, whole step {row['step_ms']:7.2f} ms; test set "
                f"{evaluation:5.2f} s; in C's protocol {row['protocol_s']:6.1f} s (every "
                f"mode trained fully: {row['every_mode_trained_s']:6.1f} s)",
                flush=True,
            )
    total = out["extension_load_s"] + sum(r["protocol_s"] for r in out["rows"])
    before = out["extension_load_s"] + sum(r["every_mode_trained_s"] for r in out["rows"])
    print(
        f"C's protocol, from these: about {total:.0f} s (every mode trained fully, "
        f"{cfg['repeats']} times: about {before:.0f} s)",
        flush=True,
    )
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

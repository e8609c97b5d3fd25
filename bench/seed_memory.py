"""Why the first seed of a graph-step job peaks higher than the later ones: a minimal repro.

The example report (4x H200) showed seed 0 of every CUDA-graph run peaking ~44 MiB above seeds
1 and 2 (250.6 against 206.1 MiB for ddp_2gpu), while eager runs were flat. Graph runs set
`cudnn.benchmark`, eager ones don't. This script trains the course CNN for a few eager steps
per "seed" in one process, the way a job trains its seeds (fresh model and optimizer, the
garbage collected and the cache emptied between seeds), with cuDNN's benchmark mode on and
off, each in a fresh process, and prints each seed's peak allocated memory: over the whole
seed, and from its second step on.

    python bench/seed_memory.py [--seeds 3] [--steps 5] [--batch 32]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

MIB = 2**20


def seeds(benchmark: bool, n_seeds: int, steps: int, batch: int) -> list[dict[str, float]]:
    import torch

    from dmls.training.models import CourseCNN

    torch.backends.cudnn.benchmark = benchmark
    device = torch.device("cuda")
    x = torch.randn(batch, 1, 28, 28, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    rows = []
    for seed in range(n_seeds):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        torch.manual_seed(seed)
        model = CourseCNN((1, 28, 28), 10, [32, 64, 128], 256, 0.0, True, "relu")
        model = model.to(device, memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        after_first = None
        for step in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step == 0:
                torch.cuda.synchronize()
                whole_first = torch.cuda.max_memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            after_first = torch.cuda.max_memory_allocated(device)
        torch.cuda.synchronize()
        rows.append(
            {
                "seed": seed,
                "peak_mib": max(whole_first, after_first) / MIB,
                "first_step_peak_mib": whole_first / MIB,
                "later_steps_peak_mib": after_first / MIB,
            }
        )
        del model, opt, loss
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rows = seeds(args.child == "on", args.seeds, args.steps, args.batch)
        print(json.dumps(rows))
        return 0
    for mode in ("on", "off"):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--seeds",
            str(args.seeds),
            "--steps",
            str(args.steps),
            "--batch",
            str(args.batch),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(f"cudnn.benchmark {mode}, batch {args.batch}:")
        for row in json.loads(out.strip().splitlines()[-1]):
            print(
                "  seed {seed}: peak {peak_mib:8.2f} MiB  (first step {first_step_peak_mib:8.2f},"
                " later steps {later_steps_peak_mib:8.2f})".format(**row)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why A3's fp16 trains many times slower than fp32 on a CPU: one training step of A3's model,
as the CPU preset resolves it, timed and profiled in fp32, bf16 and fp16 autocast.

    python3 bench/cpu_autocast.py [--steps 20] [--threads 1] [--out cpu_autocast.json]

The model and batch are A3's (`studies.precision`, config/config.yaml merged with
config/cpu.yaml: the course CNN at batch 32 per rank, CIFAR-shaped input), built by the engine's
own `build_model` and stepped under the engine's `Autocast` with a GradScaler for fp16, as
training/parallel.py does; random data, one process, `--threads` intra-op threads (the preset's
two ranks on two cores take one each). Per precision: the mean milliseconds of a step after 3
warm-up steps, and torch.profiler's self CPU time per step of the ops that take the most,
with the kernel each convolution dispatched to (aten::mkldnn_convolution is oneDNN's;
aten::slow_conv2d_forward / _backward are ATen's reference im2col loops). The CPU's
instruction sets that decide which kernels exist are printed from /proc/cpuinfo.

Then, for one of the model's convolutions (32 -> 64 channels, 3x3, a 16x16 map, batch 32), the
implementation oneDNN ran for each propagation in each precision (its ONEDNN_VERBOSE log, one
process per precision): "jit:..." and "brg_...", its generated kernels; "ref:any", its
reference C++ loops; none where ATen did not call oneDNN.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))

from dmls.config.spec import resolve_runs  # noqa: E402
from dmls.supervisor.hardware import cpu_flags  # noqa: E402

PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
# The instruction sets that decide whether oneDNN has a half-precision kernel on this CPU.
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")


def a3_spec() -> Any:
    """A3's fp32 run as the CPU preset resolves it (config.yaml, then cpu.yaml over it)."""
    from snakemake.utils import update_config, validate

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "cpu.yaml").read_text()))
    config["studies"] = {"precision": config["studies"]["precision"]}
    validate(config, str(ROOT / "config" / "schemas" / "config.schema.yaml"))
    return resolve_runs(config)["precision/fp32"]


def measure(spec: Any, precision: str, steps: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dmls.training.models import build_model
    from dmls.training.precision import Autocast

    torch.manual_seed(0)
    model = build_model(spec.model, (3, 32, 32), 10)
    name = PRECISIONS[precision]
    autocast = Autocast("cpu", getattr(torch, name) if name else None, cache_enabled=True)
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(spec.batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (spec.batch_size,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    ms = (time.perf_counter() - start) / steps * 1e3
    n = max(steps // 4, 2)  # profiled steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops) / n / 1e3
    top = [{"op": e.key, "self_ms": e.self_cpu_time_total / n / 1e3} for e in ops[:6]]
    return {"step_ms": ms, "profiled_ms": total, "top": top}


# One convolution forward and backward, twice (the first builds oneDNN's primitives), in the
# precision given; run with ONEDNN_VERBOSE=1, which logs each primitive it executes.
ONE_CONV = """
import sys, torch
torch.set_num_threads(1)
dtype = getattr(torch, sys.argv[1])
conv = torch.nn.Conv2d(32, 64, 3, padding=1).to(dtype)
x = torch.randn(32, 32, 16, 16, dtype=dtype, requires_grad=True)
for _ in range(2):
    conv(x).sum().backward()
"""


def onednn_implementations(precision: str) -> dict[str, str]:
    """Which implementation oneDNN executed for each propagation of one convolution in
    `precision` ({} where ATen did not call oneDNN), from its verbose log."""
    import os
    import subprocess

    dtype = PRECISIONS[precision] or "float32"
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", ONE_CONV, dtype],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        # onednn_verbose,[time,]primitive,exec,cpu,convolution,<implementation>,<propagation>,..
        fields = line.split(",")
        if "exec" in fields and "convolution" in fields:
            at = fields.index("convolution")
            found.setdefault(fields[at + 2], fields[at + 1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("cpu_autocast.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    spec = a3_spec()
    out: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(FLAGS) or [],
        "torch": torch.__version__,
        "threads": args.threads,
        "batch_size": spec.batch_size,
        "steps": args.steps,
        "precisions": {},
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {spec.batch_size}; "
        f"CPU flags: {', '.join(out['cpu_flags']) or 'none of ' + ', '.join(FLAGS)}"
    )
    for precision in PRECISIONS:
        print(f"{precision}: stepping...", flush=True)
        got = measure(spec, precision, args.steps)
        out["precisions"][precision] = got
        base = out["precisions"]["fp32"]["step_ms"]
        print(f"{precision}: {got['step_ms']:.1f} ms a step ({got['step_ms'] / base:.2f}x fp32)")
        for op in got["top"]:
            print(f"    {op['op']:<36} {op['self_ms']:8.1f} ms self CPU a step")
        got["onednn"] = onednn_implementations(precision)
        ran = "; ".join(f"{k} {v}" for k, v in got["onednn"].items()) or "none (ATen's own)"
        print(f"    oneDNN's convolution: {ran}")
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The studies that are not training runs of the engine: B4 (profiler), C (fused kernel),
D1–D7 (the written assignment's computable parts).

Each study is a function `run(cfg, out_dir, *, data_dir, threads)` in its own module that
writes its tables and figures into `out_dir` and returns its rows, each with a status (`ok`,
`skipped` where this host can't do that part, or `failed`) and a reason; its declaration
(dmls/special/catalog.py) names that function. `run_study` adds what every summary carries
(config, host, versions, timing) and writes `summary.json` last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

import torch

from dmls import bytecode, joblog, summary
from dmls.files import read_json
from dmls.special.catalog import STUDIES
from dmls.supervisor import launch, processes, slots
from dmls.supervisor.hardware import Host, describe

# The GPUs and cores a timed study's job reserved (slots.Reservation.to_dict, as JSON), handed to
# the study's process, which records them in its summary.json (`reserved`).
RESERVED = "DMLS_RESERVED"


class StudyIncomplete(RuntimeError):
    """Raised under `strict` when a study skipped or failed a part."""


def run_study(
    name: str,
    cfg: dict[str, Any],
    out_dir: Path,
    *,
    data_dir: Path | None = None,
    threads: int = 1,
    strict: bool = False,
) -> dict[str, Any]:
    """Run one study into `out_dir` and write its summary.json (dmls/summary.py); return the
    summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started, start = dt.datetime.now(dt.UTC), time.perf_counter()
    load = list(os.getloadavg())  # what else ran on the host as it began, as measured
    result = STUDIES[name].measure()(cfg, out_dir, data_dir=data_dir, threads=threads)
    host = Host.probe()
    written = summary.new(
        name,
        cfg["title"],
        result,
        config=cfg,
        host={"hostname": host.hostname, "gpus": list(host.cuda_devices), **describe()},
        threads=threads,
        started_at=started.isoformat(timespec="seconds"),
        wall_time_s=time.perf_counter() - start,
        reserved=json.loads(os.environ[RESERVED]) if RESERVED in os.environ else None,
        load_average_before=load,
    )
    summary.write(out_dir / "summary.json", written)
    incomplete = [r for r in result["rows"] if r["status"] != "ok"]
    if strict and incomplete:
        raise StudyIncomplete(
            f"{name}: {len(incomplete)} part(s) not ok, first: {incomplete[0]['reason']}"
        )
    return written


def main_from_snakemake(snakemake: Any, log: IO[str]) -> None:
    """Entry of the special-study rules (workflow/scripts/run_special_study.py; `params.study`
    names the study). The study runs in a process of its own (`study_command`), as a training
    run's ranks do: its environment (the extension the build job compiled, the bytecode cache,
    the GPUs reserved) and its cores are given to that command, never set in this one. Its
    output goes to the rule's `log`, open (dmls.joblog)."""
    env: dict[str, str] = {}
    prebuilt = getattr(snakemake.input, "extension", None)
    if prebuilt and (record := read_json(Path(prebuilt)))["status"] == "ok":
        # Load the extension the build job compiled (rules/special_studies.smk) instead of compiling
        # it again while this study holds a GPU.
        env["TORCH_EXTENSIONS_DIR"] = record["build_root"]
    if snakemake.config["runtime"]["bytecode_cache"]:
        env |= bytecode.environment()  # (dmls/bytecode.py; the ranks it starts inherit it)
    if torch.cuda.device_count() == 0:  # (NVML's count: CUDA is not initialised here)
        # torch.profiler's kineto logs "ERROR ... gpuGetDeviceCount failed with code 35" at
        # every profiled region of a host without a GPU (B4, D1): that it found none. Its level
        # 5 drops it; a host with a GPU keeps kineto's errors.
        env["KINETO_LOG_LEVEL"] = "5"
    manifest = getattr(snakemake.input, "manifest", None)
    command = study_command(
        snakemake.params.study,
        snakemake.params.cfg,
        Path(snakemake.output.summary).parent,
        data_dir=Path(manifest).parent if manifest else None,
        threads=snakemake.threads,
        strict=snakemake.config["strict"],
        env=env,
    )
    timed = snakemake.config["isolation"] != "none" and snakemake.params.get("timed", False)
    with contextlib.ExitStack() as held:
        reservation = None
        if timed:
            # Timed like a training run: its own cores and GPUs (supervisor/slots.py), held
            # until the study ends. The GPUs are counted by device_count, which asks NVML
            # without initialising CUDA here.
            gpu_names = slots.visible_gpus(torch.cuda.device_count())
            # One GPU, or as many as the study's processes use (the collectives' sweep).
            wanted = snakemake.params.get("gpus", 1)
            reserving = slots.reserve(
                min(wanted, len(gpu_names)),
                snakemake.threads,
                gpu_names=gpu_names,
                on_wait=logging.info,
            )
            reservation = held.enter_context(reserving)
            logging.info("reserved %s", reservation.to_dict())
        log.flush()
        held_env = None  # the study's process sees its GPUs, runs on its cores, records both
        if reservation:
            held_env = reservation.environment() | {RESERVED: json.dumps(reservation.to_dict())}
        outcome = processes.start_and_wait(
            [command],
            log,
            env=held_env,
            in_child=reservation.pin if reservation else None,
            heartbeat=joblog.heartbeat(f"study {snakemake.params.study}", log),
        )
    if not outcome.ok:
        raise StudyIncomplete(
            f"{snakemake.params.study}: its process exited with code {outcome.exit_codes[0]} "
            f"(the traceback is above, in {log.name})"
        )


def study_command(
    name: str,
    cfg: dict[str, Any],
    out_dir: Path,
    *,
    data_dir: Path | None,
    threads: int,
    strict: bool,
    env: dict[str, str],
) -> launch.Command:
    """The command that runs study `name` (`run_study`) in a process of its own, with `env`."""
    argv = [
        sys.executable,
        "-m",
        "dmls.special.runner",
        name,
        json.dumps(cfg),
        str(out_dir),
        "--threads",
        str(threads),
        *(["--data-dir", str(data_dir)] if data_dir else []),
        *(["--strict"] if strict else []),
    ]
    return launch.Command(argv, env | launch.python_path())


def main(argv: list[str] | None = None) -> None:
    """`python -m dmls.special.runner STUDY CFG_JSON OUT_DIR [--data-dir D] [--threads N]
    [--strict]`: run one study (`study_command` builds this), logging to stderr."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("cfg", type=json.loads, help="the study's config (JSON)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=joblog.FORMAT)
    run_study(
        args.study,
        args.cfg,
        args.out_dir,
        data_dir=args.data_dir,
        threads=args.threads,
        strict=args.strict,
    )


if __name__ == "__main__":
    main()

"""Per-node entry point of a multi-node run under Slurm (see dmls/supervisor/launch.py).

`srun` starts this once per node. Which node it is (SLURM_NODEID) and which node hosts the
rendezvous (the step's first) are known only inside each task, so this node's torchrun /
accelerate command is built here, then replaces this process.

python node_agent.py --device cpu --port 21234 --threads-per-process 2 -- <train.py arguments>
"""

import argparse
import os

from dmls.config.spec import RunSpec
from dmls.supervisor import launch
from dmls.supervisor.slurm import SrunTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", required=True, choices=["cpu", "cuda"])
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--threads-per-process", required=True, type=int)
    parser.add_argument("worker_args", nargs=argparse.REMAINDER, help="-- then train.py's")
    args = parser.parse_args()
    worker_args = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    spec = RunSpec.from_json(worker_args[worker_args.index("--spec") + 1])
    task = SrunTask.current()
    command = launch.agent_command(
        spec,
        worker_args,
        device=args.device,
        node_rank=task.node_rank,
        master_addr=task.first_node,
        port=args.port,
        threads_per_process=args.threads_per_process,
    )
    print(f"node {task.node_rank} ({os.uname().nodename}) $ {' '.join(command.argv)}", flush=True)
    os.execve(command.argv[0], command.argv, os.environ | command.env)


if __name__ == "__main__":
    main()

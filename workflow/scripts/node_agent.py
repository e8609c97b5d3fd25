"""Per-node entry point of a multi-node run, or of a special study's ranks, under Slurm (see
dmls/supervisor/launch.py).

`srun` starts this once per node. Which node it is (SLURM_NODEID) and which node hosts the
rendezvous (the step's first) are known only inside each task, so this node's torchrun /
accelerate command is built here, then replaces this process. Here, and only here, the
rendezvous host of a Slurm step is chosen.

python node_agent.py --device cpu --port 21234 --threads-per-process 2 -- <rank.py arguments>
python node_agent.py --port 21234 --threads-per-process 1 --group NAME --nnodes 2 \
                     --nproc-per-node 1 -- <module> <its arguments>
"""

import argparse
import os

from dmls.config.spec import RunSpec
from dmls.supervisor import launch
from dmls.supervisor.slurm import SrunTask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], help="a training run's device")
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--threads-per-process", required=True, type=int)
    parser.add_argument("--group", help="a special study's group of ranks, by name")
    parser.add_argument("--nnodes", type=int, help="the group's nodes")
    parser.add_argument("--nproc-per-node", type=int, help="the group's ranks per node")
    parser.add_argument(
        "worker_args", nargs=argparse.REMAINDER, help="-- then rank.py's, or a module and its"
    )
    args = parser.parse_args()
    worker_args = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    task = SrunTask.current()
    where = dict(
        node_rank=task.node_rank,
        master_addr=task.first_node,
        port=args.port,
        threads_per_process=args.threads_per_process,
    )
    if args.group:
        command = launch.group_agent_command(
            worker_args[0],
            worker_args[1:],
            name=args.group,
            nodes=args.nnodes,
            nproc_per_node=args.nproc_per_node,
            **where,
        )
    else:
        spec = RunSpec.from_json(worker_args[worker_args.index("--spec") + 1])
        command = launch.agent_command(spec, worker_args, device=args.device, **where)
    print(f"node {task.node_rank} ({os.uname().nodename}) $ {' '.join(command.argv)}", flush=True)
    os.execve(command.argv[0], command.argv, os.environ | command.env)


if __name__ == "__main__":
    main()

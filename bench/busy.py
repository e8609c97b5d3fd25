"""Other work on the machine, for a DAG that should share it (bench/grader_cpu.yaml): N
processes that each keep one core busy until killed.
    python3 bench/busy.py N
"""

import multiprocessing
import sys


def spin() -> None:
    x = 0
    while True:
        x = (x * 31 + 7) % 1_000_003


if __name__ == "__main__":
    workers = [multiprocessing.Process(target=spin) for _ in range(int(sys.argv[1]))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

"""How long the quick commands take: CPU time of ``attnconv --help`` and ``attnconv models``
beside ``python -c "import torch"``, in one run.

Each command runs as a fresh process, the commands interleaved, ``--repeats`` rounds; the figure
is the median over the rounds of the child's CPU time (user + system, seconds, from
``getrusage(RUSAGE_CHILDREN)``), which other jobs on a shared machine stretch far less than wall
time. Printed beside it: the ratio to importing torch and the difference from it (issue 40: within
2 s). ``attnconv models --num-classes 100`` counts every preset on the meta device, as
``attnconv models`` did before its counts were stored (``attnconv.models.costs``): the before.

    python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

ATTNCONV = [sys.executable, "-m", "attnconv"]
COMMANDS: dict[str, list[str]] = {
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    "attnconv --help": [*ATTNCONV, "--help"],
    "attnconv models": [*ATTNCONV, "models"],
    "attnconv models --num-classes 100 (meta-device counts: the before)": [
        *ATTNCONV,
        "models",
        "--num-classes",
        "100",
    ],
}


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU seconds of running ``command`` to its end (output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def machine() -> str:
    """``lscpu``'s model name (``/proc/cpuinfo``'s where lscpu is missing), CPUs, load average."""
    name = "unknown CPU"
    try:
        listing = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        lines = listing.splitlines()
    except (OSError, subprocess.CalledProcessError):
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name":
            name = value.strip()
            break
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return f"{name}, {os.cpu_count()} CPUs, load average {load} (1, 5, 15 min)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    print(f"machine: {machine()}")
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            times[name].append(cpu_seconds(command))
    median = {name: statistics.median(values) for name, values in times.items()}
    baseline = median['python -c "import torch"']
    width = max(map(len, COMMANDS))
    print(f"{'command':<{width}}  CPU s (median of {args.repeats})  x import torch  - import torch")
    for name, seconds in median.items():
        print(
            f"{name:<{width}}  {seconds:>22.2f}  {seconds / baseline:>14.2f}  "
            f"{seconds - baseline:>+14.2f}"
        )


if __name__ == "__main__":
    main()

"""Several training runs at once on one GPU, within a time limit, each resumable anywhere.

    python benchmarks/gpu_runs.py PLAN.json --out DIR [--from DIR] [--limit SECONDS]
                                  [--parallel N] [--dry-run]

A lent GPU comes for minutes at a time and its files come back only from one folder: this driver
starts the runs of the plan on the GPU, ``--parallel`` at once in the plan's order (a run starts
when another ends), lets each write its run folder under ``--out``
(``attnconv train`` keeps ``checkpoints/last.pt`` at the end of every epoch), stops them all at
``--limit`` seconds, and writes ``DIR/runs.json``: each run's state, epochs done, the machine of
each epoch and, for a finished run, its test accuracy. Run folders carried back in with
``--from`` continue where they stopped (``attnconv train --resume``), here or on any other
machine, a CPU included; a finished one is copied and left. So a cut run loses at most the epoch
it was in.

The plan is JSON: ``{"runs": [{"folder": "fashion-mnist/quadratic-fashion/seed-0", "train":
["--preset", "quadratic-fashion", "seed=0", "precision=fp32"]}, ...]}``; ``train`` holds the
arguments of ``attnconv train`` but ``--out`` (the driver gives ``DIR/FOLDER``).
``benchmarks/plans/equal-budget.json`` holds the equal-budget runs of docs/reproducing.md.

``--dry-run`` runs the plan where there is no GPU, on the CPU: a rehearsal of the driver on tiny
plans (``benchmarks/test_gpu_runs.py`` runs one), not a measurement. Without ``--dry-run`` and
without a CUDA GPU it prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 30.0  # after the limit: time for a stopped run to exit before it is killed
POLL_S = 1.0


def load_plan(path: Path) -> list[dict]:
    """The runs of the plan file, each ``{"folder": str, "train": [str, ...]}``; SystemExit with one
    line naming what is wrong."""
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"gpu_runs.py: cannot read the plan {path}: {err}") from None
    runs = plan.get("runs") if isinstance(plan, dict) else None
    if not isinstance(runs, list) or not runs:
        raise SystemExit(f"gpu_runs.py: {path} must hold {{\"runs\": [...]}} with at least one run")
    folders = set()
    for index, run in enumerate(runs):
        ok = (
            isinstance(run, dict)
            and isinstance(run.get("folder"), str)
            and run["folder"]
            and not Path(run["folder"]).is_absolute()
            and ".." not in Path(run["folder"]).parts
            and isinstance(run.get("train"), list)
            and all(isinstance(a, str) for a in run["train"])
            and "--out" not in run["train"]
        )
        if not ok:
            raise SystemExit(
                f"gpu_runs.py: run {index} of {path} must be {{\"folder\": a relative path, "
                f"\"train\": [attnconv train arguments but --out]}}, got {run!r}"
            )
        if run["folder"] in folders:
            raise SystemExit(f"gpu_runs.py: folder {run['folder']!r} appears twice in {path}")
        folders.add(run["folder"])
    return runs


def run_state(folder: Path) -> str:
    """``"finished"`` (summary.json), ``"interrupted"`` (checkpoints/last.pt) or ``"new"``."""
    if (folder / "summary.json").is_file():
        return "finished"
    if (folder / "checkpoints" / "last.pt").is_file():
        return "interrupted"
    return "new"


def epoch_records(folder: Path) -> list[dict]:
    """The per-epoch records of the run (``metrics.jsonl``), those that parse."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "epoch" in record:
            records.append(record)
    return records


def bring_in(source: Path, destination: Path) -> None:
    """Copy a carried run folder (without its tensorboard logs and lock) into ``destination``."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("tensorboard", ".lock"))


def command(run: dict, folder: Path, state: str) -> list[str]:
    """The ``attnconv train`` command line that starts or resumes ``run`` in ``folder`` (on the
    device ``auto`` picks: the GPU where there is one, so a run carried to a CPU resumes there)."""
    base = [sys.executable, "-m", "attnconv", "train"]
    if state == "interrupted":
        return [*base, "--resume", str(folder)]
    train = list(run["train"])  # KEY=VALUE overrides must stay one run of arguments
    last = max((i for i, a in enumerate(train) if "=" in a and not a.startswith("-")), default=None)
    at = len(train) if last is None else last + 1
    train[at:at] = ["tensorboard=false"]
    return [*base, *train, "--out", str(folder)]


def stop(processes: dict[str, subprocess.Popen]) -> None:
    """SIGTERM every running process group, then SIGKILL what is left after ``GRACE_S``."""
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in processes.values()):
        time.sleep(0.2)
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def report(runs: list[dict], out: Path, codes: dict[str, int | None], started: float) -> list[dict]:
    """One entry per run: folder, state, epochs done (of the run's records), machines, test
    accuracy when finished, the process's exit status (None: not started, already finished)."""
    rows = []
    for run in runs:
        folder = out / run["folder"]
        records = epoch_records(folder)
        summary = {}
        if (folder / "summary.json").is_file():
            summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        rows.append(
            {
                "folder": run["folder"],
                "state": run_state(folder),
                "epochs_done": len(records),
                "machines": sorted({str(r.get("machine")) for r in records if r.get("machine")}),
                "test_acc": summary.get("test_acc"),
                "exit_status": codes.get(run["folder"]),
            }
        )
    (out / "runs.json").write_text(
        json.dumps({"wall_s": round(time.monotonic() - started, 1), "runs": rows}, indent=1) + "\n"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu_runs.py", description=__doc__.split("\n\n")[1].strip()
    )
    parser.add_argument("plan", type=Path, help="the plan file (JSON, see the module docstring)")
    parser.add_argument("--out", type=Path, required=True, help="where the run folders go")
    parser.add_argument("--from", dest="carried", type=Path,
                        help="run folders carried back in (a previous --out): continued or kept")
    parser.add_argument("--limit", type=float, default=540.0,
                        help="seconds after which every run still training is stopped "
                        "(default 540: a 10-minute device call with time to spare)")
    parser.add_argument("--parallel", type=int, default=8,
                        help="runs training at once (default 8: small models share a GPU well)")
    parser.add_argument("--dry-run", action="store_true", help="run the plan on the CPU")
    args = parser.parse_args(argv)
    if not args.limit > 0:
        parser.error(f"--limit must be a positive number of seconds, got {args.limit}")
    if args.parallel < 1:
        parser.error(f"--parallel must be at least 1, got {args.parallel}")
    runs = load_plan(args.plan)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_runs.py: no CUDA GPU visible; nothing was run: use --dry-run to rehearse "
                  "on the CPU", file=sys.stderr)
            return 2
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.out / "logs"
    logs.mkdir(exist_ok=True)
    cores = os.cpu_count() or 1
    environment = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": str(max(1, cores // min(args.parallel, len(runs)))),
        "PYTHONUNBUFFERED": "1",
    }
    pending = []
    for run in runs:
        folder = args.out / run["folder"]
        if args.carried is not None and (args.carried / run["folder"]).is_dir():
            bring_in(args.carried / run["folder"], folder)
        if run_state(folder) == "finished":
            print(f"{run['folder']}: finished, kept")
        else:
            pending.append(run)
    processes: dict[str, subprocess.Popen] = {}
    deadline = started + args.limit
    while time.monotonic() < deadline:
        running = sum(p.poll() is None for p in processes.values())
        while pending and running < args.parallel:
            run = pending.pop(0)
            folder = args.out / run["folder"]
            state = run_state(folder)
            folder.parent.mkdir(parents=True, exist_ok=True)
            log = (logs / (run["folder"].replace("/", "__") + ".log")).open("a")
            print(f"{run['folder']}: {'resuming' if state == 'interrupted' else 'starting'}")
            processes[run["folder"]] = subprocess.Popen(
                command(run, folder, state), stdout=log, stderr=subprocess.STDOUT,
                env=environment, cwd=ROOT, start_new_session=True,
            )  # fmt: skip
            running += 1
        if not running and not pending:
            break
        time.sleep(POLL_S)
    stop(processes)
    codes = {name: process.returncode for name, process in processes.items()}
    rows = report(runs, args.out, codes, started)
    for row in rows:
        accuracy = "" if row["test_acc"] is None else f", test {100 * row['test_acc']:.2f}%"
        print(f"{row['folder']}: {row['state']}, {row['epochs_done']} epochs{accuracy}")
    failed = [r for r in rows if r["exit_status"] not in (None, 0) and r["state"] == "new"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

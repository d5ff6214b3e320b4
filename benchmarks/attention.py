"""Speed and memory of MultiHeadSelfAttention2d: fast paths next to the dense path, same run.

For every score type and image size it times forward+backward of the whole layer (projections
included) with ``impl="auto"`` (the fast exact path) and ``impl="dense"`` (explicit per-image N×N
reference, subnormal-safe), and at the paper's size also the naive dense baseline of
``naive_attention.py`` (per-image float32 probabilities, no subnormal handling). Each measurement
runs in a fresh subprocess so that its peak memory (CPU: peak resident set growth; CUDA: peak
allocated) is its own.

    python benchmarks/attention.py                 # everything (~10 min on 2 cores)
    python benchmarks/attention.py --sizes paper   # only batch 100, 16×16, 9 heads, dim 400

Targets (this project's 2-core machine): isotropic gaussian fast ≥ 2.5× dense at 32×32 and ≥ 6× at
64×64 with ≥ 2.5× less peak memory at 64×64; at the paper size fast ≥ 5× the naive baseline.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnconv import MultiHeadSelfAttention2d

SCORES = {
    "gaussian": {"positional": "gaussian"},
    # Trained Gaussian heads contract (s > 1): more probabilities underflow into subnormals.
    "gaussian s=2": {"positional": "gaussian", "spread": 2.0},
    "gaussian_full": {"positional": "gaussian_full"},
    "learned": {"positional": "learned"},
    "content": {"positional": None, "content": True},
    "learned+content": {"positional": "learned", "content": True, "content_positional": True},
}
# name: (batch, height, width, heads, dim)
SIZES = {
    "paper": (100, 16, 16, 9, 400),
    "32x32": (8, 32, 32, 9, 400),
    "64x64": (2, 64, 64, 9, 400),
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(score: str, size: str, path: str, repeats: int, device: str) -> dict:
    """Seconds per forward+backward and peak extra memory (bytes) of one configuration."""
    batch, height, width, heads, dim = SIZES[size]
    torch.manual_seed(0)
    options = dict(SCORES[score])
    spread = options.pop("spread", None)
    layer = MultiHeadSelfAttention2d(dim, heads, max_size=max(height, width), **options)
    if spread is not None:
        with torch.no_grad():
            layer.spread.fill_(spread)
    layer = layer.to(device)
    if path == "naive":
        sys.path.insert(0, str(Path(__file__).parent))
        from naive_attention import use_naive_attention

        use_naive_attention(layer)
    else:
        layer.impl = "auto" if path == "auto-bf16" else path
    x = torch.randn(batch, height, width, dim, device=device, requires_grad=True)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=path == "auto-bf16")

    def step() -> None:
        with autocast:
            loss = layer(x).float().square().mean()
        loss.backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    step()  # warm-up, also the memory measurement
    peak = (
        torch.cuda.max_memory_allocated() - base
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    )
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"seconds": min(times), "peak_bytes": max(peak, 1)}


def run_isolated(score: str, size: str, path: str, repeats: int, device: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            score,
            size,
            path,
            "--repeats",
            str(repeats),
            "--device",
            device,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--scores", nargs="+", choices=list(SCORES), default=list(SCORES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--one", nargs=3, metavar=("SCORE", "SIZE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.repeats, args.device)))
        return

    print(f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__}")
    header = (
        f"{'score':<16}{'size':<7}{'fast s':>9}{'dense s':>9}{'speed-up':>9}"
        f"{'fast MB':>9}{'dense MB':>10}{'mem ratio':>10}{'naive s':>9}{'vs naive':>9}"
    )
    print(header)
    print("-" * len(header))
    results = {}
    bf16_results = {}
    for size in args.sizes:
        for score in args.scores:
            fast = run_isolated(score, size, "auto", args.repeats, args.device)
            dense = run_isolated(score, size, "dense", args.repeats, args.device)
            naive = (
                run_isolated(score, size, "naive", args.repeats, args.device)
                if size == "paper"
                else None
            )
            results[score, size] = (fast, dense, naive)
            if naive is not None and score.startswith("gaussian"):
                bf16 = run_isolated(score, size, "auto-bf16", args.repeats, args.device)
                bf16_results[score] = bf16
            naive_cols = (
                f"{naive['seconds']:>9.3f}{naive['seconds'] / fast['seconds']:>8.1f}x"
                if naive
                else f"{'':>9}{'':>9}"
            )
            print(
                f"{score:<16}{size:<7}{fast['seconds']:>9.3f}{dense['seconds']:>9.3f}"
                f"{dense['seconds'] / fast['seconds']:>8.1f}x"
                f"{fast['peak_bytes'] / 2**20:>9.0f}{dense['peak_bytes'] / 2**20:>10.0f}"
                f"{dense['peak_bytes'] / fast['peak_bytes']:>9.1f}x{naive_cols}",
                flush=True,
            )

    for score, bf16 in bf16_results.items():
        naive = results[score, "paper"][2]
        print(
            f"{score:<16}paper  fast path under bf16 autocast: {bf16['seconds']:.3f} s, "
            f"{naive['seconds'] / bf16['seconds']:.1f}x the float32 naive baseline"
        )
    print("\nTargets (isotropic gaussian):")
    checks = []
    if ("gaussian", "32x32") in results:
        fast, dense, _ = results["gaussian", "32x32"]
        checks.append(("32x32 speed-up vs dense >= 2.5x", dense["seconds"] / fast["seconds"], 2.5))
    if ("gaussian", "64x64") in results:
        fast, dense, _ = results["gaussian", "64x64"]
        checks.append(("64x64 speed-up vs dense >= 6x", dense["seconds"] / fast["seconds"], 6.0))
        checks.append(
            ("64x64 peak memory ratio >= 2.5x", dense["peak_bytes"] / fast["peak_bytes"], 2.5)
        )
    if ("gaussian", "paper") in results:
        fast, _, naive = results["gaussian", "paper"]
        checks.append(
            ("paper size speed-up vs naive >= 5x", naive["seconds"] / fast["seconds"], 5.0)
        )
    for name, value, target in checks:
        print(f"  {name:<38} {value:6.1f}x  {'PASS' if value >= target else 'FAIL'}")


if __name__ == "__main__":
    main()

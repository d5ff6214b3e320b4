"""Speed of MultiHeadSelfAttention2d: each of its routes, the one it picks, and what a PyTorch user
would write instead.

Part 1, ``peers``: the paper's layer (isotropic Gaussian positional attention, no value
projection, 9 heads, dim 400; ``fashion``: dim 64 on 14×14 tokens, the layers of
``quadratic-fashion``), at each size and in each mode (no-grad forward and forward+backward, in
float32 and, where ``--precision`` resolves to bfloat16, under bfloat16 autocast):

- every exact route of the layer, pinned (``attention/routes.py``: ``shared``, the ``(heads, N,
  N)`` matrix applied to the batch; ``separable``, the row and column factors for all heads at
  once; ``per head, chunks of C``, one head at a time fused with the output projection, in chunks
  of ``C`` values, for each chunk size measured, and the same with each chunk held pixels first,
  ``per head, pixels first, chunks of C``);
- the layer as it picks: a fresh selector measures the routes on its first call (the untimed
  warm-up) and takes the fastest; the route it took is printed below the table;
- the peers: the shared dense form (``P = softmax(positional logits)`` ``(heads, N, N)`` once per
  forward and one ``einsum`` applying it to the whole batch, then the output projection);
  ``scaled_dot_product_attention`` with the positional logits as a 4-D mask (``SDPA + bias``);
  the naive per-image form (``naive_attention.py``); ``torch.compile(flex_attention)`` with the
  Gaussian as ``score_mod`` (float32; forward only on a CPU, where FlexAttention has no backward);
- the floor: the layer's output projection ``Linear(heads·dim → dim)`` alone on an input of the
  same shape, the GEMMs every implementation shares.

All contenders alternate in one process, best of ``--repeats`` rounds after a warm-up each, with
freed memory kept for reuse and subnormal numbers flushed to zero for every one of them (so that
no peer is slowed by them; the layer flushes its own), on a CPU per second of this process's CPU
time (steadier where other work shares the cores). Ratios are that time over the layer's.

Targets, in every mode: the route the layer picks, timed pinned like the others (its row ``layer,
as it picks`` is the same route again, differing by the spread of runs alone), within 5% of the
fastest of its own routes, and the layer no slower than the best peer (≥ 1.0×), ≥ 1.3× at the paper's size in float32, ≥ 4× at 32×32 (batch 8) and
≥ 15× at 64×64 (batch 2) in float32 forward+backward; there, within 1.3× of the floor at the
paper's size and 1.8× at the Fashion size.

Part 2, ``scores``: every score type at every size, ``impl="auto"`` (fast exact path) against
``impl="dense"`` (explicit per-image N×N reference), forward+backward time and peak memory, each
measurement in a fresh subprocess so that its peak memory (CPU: peak resident set growth; CUDA:
peak allocated) is its own; the fast path's routes are chosen in a subprocess before (kept in a
cache file, ``ATTNCONV_ROUTE_CACHE``), so that the measurement's trials do not count in its peak.
Targets: isotropic Gaussian fast ≥ 2.5× dense at 32×32, ≥ 6× at 64×64, with ≥ 2.5× less peak
memory at 64×64.

    python benchmarks/attention.py --threads 1                  # both parts, every size
    python benchmarks/attention.py --sections peers --sizes paper --batch 10   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv import MultiHeadSelfAttention2d
from attnconv.attention import routes
from attnconv.hardware import PRECISIONS, machine_description, resolve_precision
from attnconv.memory import reuse_freed_memory
from content_layer import alternate
from data import synchronize
from naive_attention import _positional_logits, naive_attention_forward, use_naive_attention
from route_timing import (
    PICKED,
    ROUTE,
    candidates,
    measuring,
    pick_over_fastest,
    picks,
    pinned,
    print_table,
)

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
    "fashion": (100, 14, 14, 9, 64),
    "32x32": (8, 32, 32, 9, 400),
    "64x64": (2, 64, 64, 9, 400),
}
# the layer's speed-up over the best peer, float32 forward+backward (at least 1 everywhere)
PEER_TARGETS = {"32x32": 4.0, "64x64": 15.0}
PAPER_FP32_TARGET = 1.3  # the same at the paper's size in float32, both modes
FLEX_VALUE_CHUNK = 128  # most value channels FlexAttention attends at once (see flex_forward)
FLOOR_TARGETS = {"paper": 1.3, "fashion": 1.8}  # layer time ≤ this × its projection GEMMs alone


# ---------------------------------------------------------------------------- part 1: peers


def shared_dense_forward(layer: MultiHeadSelfAttention2d, x: Tensor) -> Tensor:
    """``x (B, H, W, dim)`` → ``(B, H, W, dim)`` with one ``(heads, N, N)`` softmax for the batch."""
    batch, height, width, dim = x.shape
    probs = torch.softmax(_positional_logits(layer, height, width), dim=-1)  # (heads, N, N)
    tokens = x.reshape(batch, height * width, dim)
    attended = torch.einsum("hqk,bkd->bqhd", probs, tokens)  # (B, N, heads, dim)
    return layer.out(attended.reshape(batch, height, width, layer.heads * dim))


def flex_forward(layer: MultiHeadSelfAttention2d, width: int,
                 compile: bool = True) -> Callable[[Tensor], Tensor]:
    """FlexAttention computing ``layer``, the Gaussian logit as ``score_mod``; compiled unless
    ``compile=False`` (eager: the unfused reference, for checking the function only).

    The input is the one value head that every query head shares, cut into equal chunks of at most
    ``FLEX_VALUE_CHUNK`` channels, each attended as a batch entry of its own: FlexAttention's CUDA
    kernels hold a block of a head's values in shared memory, and the paper's 400 channels (padded
    to 512) need 291 KB there, more than an H100 or H200 has (227 KB).
    """
    from torch.nn.attention.flex_attention import flex_attention

    spread = layer.position.spread
    # Δ's two coordinates as tensors of their own: FlexAttention's CUDA backward takes one
    # indexing per tensor that needs gradients in a score_mod.
    # (heads,) each; contiguous copies: CPU inductor refuses strided views in a score_mod
    center_rows, center_cols = (c.contiguous() for c in layer.position.centers.unbind(1))
    compiled = torch.compile(flex_attention) if compile else flex_attention

    def gaussian(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        rows = k // width - q // width - center_rows[h]  # key − query − Δ, in pixels
        cols = k % width - q % width - center_cols[h]
        return score - 0.5 * spread[h].square() * (rows * rows + cols * cols)

    def forward(x: Tensor) -> Tensor:
        batch, height, _, dim = x.shape
        n = height * width
        chunks = next(c for c in range(1, dim + 1) if dim % c == 0 and dim // c <= FLEX_VALUE_CHUNK)
        # (B·chunks, 1, N, dim/chunks): one value head, shared by the query heads
        value = x.reshape(batch, n, chunks, dim // chunks).transpose(1, 2).reshape(
            batch * chunks, 1, n, dim // chunks)
        query = x.new_zeros(batch * chunks, layer.heads, n, 16)
        key = x.new_zeros(batch * chunks, 1, n, 16)
        y = compiled(query, key, value, score_mod=gaussian, enable_gqa=True)
        # (B·chunks, heads, N, dim/chunks) → (B, N, heads, chunks, dim/chunks)
        y = y.reshape(batch, chunks, layer.heads, n, dim // chunks).permute(0, 3, 2, 1, 4)
        return layer.out(y.reshape(batch, height, width, layer.heads * dim))

    return forward


def best_seconds(run: Callable[[], None], repeats: int, device: torch.device) -> float:
    """The fastest of ``repeats`` timed calls of ``run`` after one untimed warm-up call."""
    run()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return best


def sdpa_bias_forward(layer: MultiHeadSelfAttention2d, x: Tensor) -> Tensor:
    """``x (B, H, W, dim)`` → ``(B, H, W, dim)`` through ``scaled_dot_product_attention`` with
    the positional logits as a 4-D mask ``(1, heads, N, N)``, queries and keys of zeros and the
    input as every head's values, then the output projection."""
    batch, height, width, dim = x.shape
    n, heads = height * width, layer.heads
    bias = _positional_logits(layer, height, width)  # (heads, N, N)
    values = x.reshape(batch, 1, n, dim).expand(batch, heads, n, dim)
    zeros = x.new_zeros(batch, heads, n, 1)
    y = F.scaled_dot_product_attention(zeros, zeros, values, attn_mask=bias.to(x.dtype)[None])
    return layer.out(y.transpose(1, 2).reshape(batch, height, width, heads * dim))


MODES = (("no-grad", "fp32"), ("fwd+bwd", "fp32"), ("no-grad", "bf16"), ("fwd+bwd", "bf16"))
PEERS = ("shared dense (einsum)", "SDPA + bias", "naive per image", "flex (compiled)")
FLOOR = "floor: projection"


def mode_run(forward: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor, mode: str,
             precision: str, context: Callable[[], AbstractContextManager] = nullcontext,
             ) -> Callable[[], None]:
    """One call of ``forward(x)`` in ``mode`` (``no-grad``, or ``fwd+bwd`` with output gradient
    ``grad``) and ``precision`` (``bf16``: under bfloat16 autocast), within ``context()``."""

    def run() -> None:
        inputs = x.detach().requires_grad_(mode == "fwd+bwd")
        with context(), torch.autocast(x.device.type, dtype=torch.bfloat16,
                                       enabled=precision == "bf16"):
            with torch.no_grad() if mode == "no-grad" else nullcontext():
                y = forward(inputs)
            if mode == "fwd+bwd":
                y.backward(grad.to(y.dtype))

    return run


def peers(size: str, batch: int, rounds: int, device: torch.device,
          modes: tuple[tuple[str, str], ...]) -> tuple[dict, dict]:
    """Seconds of each route, the layer as it picks, each peer and the floor in each mode at one
    size, ``{mode: {name: seconds}}``, and the route picked in each mode."""
    _, height, width, heads, dim = SIZES[size]
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(dim, heads, positional="gaussian", max_size=max(height, width))
    layer = layer.to(device)
    x = torch.randn(batch, height, width, dim, device=device)
    grad = torch.randn(batch, height, width, dim, device=device)
    floor_input = torch.randn(batch, height, width, heads * dim, device=device)
    flex = flex_forward(layer, width)
    times, picked = {}, {}
    with measuring():
        for mode, precision in modes:
            names = candidates(mode_run(layer, x, grad, mode, precision))
            runs = {ROUTE + name: mode_run(layer, x, grad, mode, precision,
                                           lambda name=name: pinned(name))
                    for name in names}
            with picks() as chosen:
                runs[PICKED] = mode_run(layer, x, grad, mode, precision)
                peer_forwards = {
                    PEERS[0]: lambda t: shared_dense_forward(layer, t),
                    PEERS[1]: lambda t: sdpa_bias_forward(layer, t),
                    PEERS[2]: lambda t: naive_attention_forward(layer, t),
                }
                if precision == "fp32" and (mode == "no-grad" or device.type == "cuda"):
                    peer_forwards[PEERS[3]] = flex
                for name, forward in peer_forwards.items():
                    runs[name] = mode_run(forward, x, grad, mode, precision)
                runs[FLOOR] = mode_run(layer.out, floor_input, grad, mode, precision)
                try:
                    times[mode, precision] = alternate(runs, rounds, device)
                finally:
                    layer.zero_grad(set_to_none=True)
            picked[mode, precision] = chosen[-1]
    return times, picked


def report_peers(size: str, batch: int, times: dict, picked: dict
                 ) -> list[tuple[str, float, float, bool]]:
    """Print one size's table; returns its target checks ``(name, value, target, higher_is_ok)``."""
    _, height, width, heads, dim = SIZES[size]
    print_table(f"{size}: batch {batch}, {height}x{width} tokens, dim {dim}, {heads} heads",
                times, picked)
    checks = []
    for mode, precision in times:
        best = times[mode, precision]
        ours, label = best[PICKED], f"{size} {mode} {precision}"
        checks.append((f"{label}: picked route / fastest",
                       pick_over_fastest(best, picked[mode, precision]), 1.05, False))
        peer = min(seconds for name, seconds in best.items() if name in PEERS)
        target = PAPER_FP32_TARGET if (size, precision) == ("paper", "fp32") else 1.0
        if (mode, precision) == ("fwd+bwd", "fp32"):
            target = max(target, PEER_TARGETS.get(size, 1.0))
            if size in FLOOR_TARGETS:
                checks.append((f"{label}: layer / projection floor", ours / best[FLOOR],
                               FLOOR_TARGETS[size], False))
        checks.append((f"{label}: best peer / layer", peer / ours, target, True))
    return checks


# ---------------------------------------------------------------------------- part 2: scores


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(score: str, size: str, path: str, repeats: int, device: str) -> dict:
    """Seconds per forward+backward, peak extra memory (bytes) and the route taken (``None`` for
    the dense and naive paths) of one configuration."""
    batch, height, width, heads, dim = SIZES[size]
    torch.manual_seed(0)
    options = dict(SCORES[score])
    spread = options.pop("spread", None)
    layer = MultiHeadSelfAttention2d(dim, heads, max_size=max(height, width), **options)
    if spread is not None:
        with torch.no_grad():
            layer.position.spread.fill_(spread)
    layer = layer.to(device)
    if path == "naive":
        use_naive_attention(layer)
    else:
        layer.impl = path
    x = torch.randn(batch, height, width, dim, device=device, requires_grad=True)

    def step() -> None:
        loss = layer(x).float().square().mean()
        loss.backward()
        layer.zero_grad(set_to_none=True)
        x.grad = None

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    with picks() as chosen:
        step()  # warm-up, also the memory measurement
    peak = (
        torch.cuda.max_memory_allocated() - base
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    )
    return {"seconds": best_seconds(step, repeats, torch.device(device)) if repeats else 0.0,
            "peak_bytes": max(peak, 1), "route": chosen[-1] if chosen else None}


def run_isolated(score: str, size: str, path: str, repeats: int, device: str,
                 cache: Path) -> dict:
    """``measure`` in a fresh process with this one's torch threads, the routes chosen by
    measurement and kept in the cache file ``cache`` (a later process reads them there)."""
    env = {**os.environ, routes.CACHE_ENV: str(cache), routes.TIMING_ENV: "on",
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    out = subprocess.run(
        [sys.executable, __file__, "--one", score, size, path, "--repeats", str(repeats),
         "--device", device, "--threads", str(torch.get_num_threads())],
        capture_output=True, text=True, check=True, env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def scores_part(args: argparse.Namespace) -> list[tuple[str, float, float, bool]]:
    header = (f"{'score':<16}{'size':<7}{'fast s':>9}{'dense s':>9}{'speed-up':>9}"
              f"{'fast MB':>9}{'dense MB':>10}{'mem ratio':>10}  fast route")
    print("\n" + header + "\n" + "-" * len(header))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "routes.json"
        for size in args.sizes:
            for score in args.scores:
                run_isolated(score, size, "auto", 0, args.device, cache)  # chooses the route
                fast = run_isolated(score, size, "auto", args.repeats, args.device, cache)
                dense = run_isolated(score, size, "dense", args.repeats, args.device, cache)
                results[score, size] = (fast, dense)
                print(f"{score:<16}{size:<7}{fast['seconds']:>9.3f}{dense['seconds']:>9.3f}"
                      f"{dense['seconds'] / fast['seconds']:>8.1f}x"
                      f"{fast['peak_bytes'] / 2**20:>9.0f}{dense['peak_bytes'] / 2**20:>10.0f}"
                      f"{dense['peak_bytes'] / fast['peak_bytes']:>9.1f}x  {fast['route']}",
                      flush=True)
    checks = []
    if ("gaussian", "32x32") in results:
        fast, dense = results["gaussian", "32x32"]
        checks.append(("32x32: dense / fast, fwd+bwd", dense["seconds"] / fast["seconds"], 2.5,
                       True))
    if ("gaussian", "64x64") in results:
        fast, dense = results["gaussian", "64x64"]
        checks.append(("64x64: dense / fast, fwd+bwd", dense["seconds"] / fast["seconds"], 6.0,
                       True))
        checks.append(("64x64: dense / fast, peak memory",
                       dense["peak_bytes"] / fast["peak_bytes"], 2.5, True))
    return checks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=("peers", "scores"),
                        default=["peers", "scores"])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--scores", nargs="+", choices=list(SCORES), default=list(SCORES))
    parser.add_argument("--batch", type=int, help="peers: this batch at every size (default: "
                        "each size's own; the targets are for those)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="peers: alternating rounds; scores: timed steps (the best counts)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="peers: also time every contender under bf16 autocast when this "
                        "resolves to bf16 (auto: where the device computes in bfloat16 natively)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: its own)")
    parser.add_argument("--one", nargs=3, metavar=("SCORE", "SIZE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # every contender alike (the layer flushes its own anyway)
    if args.one:
        print(json.dumps(measure(*args.one, args.repeats, args.device)))
        return
    if args.repeats < 1 or (args.batch is not None and args.batch < 1):
        parser.error("--repeats and --batch must be >= 1")
    device = torch.device(args.device)
    if device.type == "cpu":
        reuse_freed_memory()
    print(machine_description(device))
    checks = []
    if "peers" in args.sections:
        modes = MODES if resolve_precision(args.precision, device) == "bf16" else MODES[:2]
        for size in args.sizes:
            batch = args.batch or SIZES[size][0]
            times, picked = peers(size, batch, args.repeats, device, modes)
            checks += report_peers(size, batch, times, picked)
    if "scores" in args.sections:
        checks += scores_part(args)
    note = f" (measured at batch {args.batch}; the targets are for the default batches)"
    print("\nTargets" + (note if args.batch else "") + ":")
    for name, value, target, higher in checks:
        met = value >= target if higher else value <= target
        sign = ">=" if higher else "<="
        verdict = "met" if met else "NOT met"
        print(f"  {name:<46} {value:6.2f}x  (target {sign} {target}x)  {verdict}")


if __name__ == "__main__":
    main()

"""Speed of MultiHeadSelfAttention2d against what a PyTorch user would write instead, and the floor.

Part 1, ``peers`` (all in this process, float32, forward+backward unless said otherwise): the
paper's layer (isotropic Gaussian positional attention, no value projection, 9 heads, dim 400;
``fashion``: dim 64 on 14×14 tokens, the layers of ``quadratic-fashion``) next to

- the shared dense form: ``P = softmax(positional logits)`` ``(heads, N, N)`` once per forward and
  one ``einsum`` applying it to the whole batch, then the output projection;
- ``torch.compile(flex_attention)`` with the Gaussian as ``score_mod`` (zero queries and keys, the
  input as one shared value head); forward only on a CPU, where FlexAttention has no backward;
- the naive per-image form (``naive_attention.py``: ``(B, heads, N, N)`` probabilities);
- the floor: the layer's output projection ``Linear(heads·dim → dim)`` alone on an input of the
  same shape, the GEMMs every implementation shares.

Targets: the layer ≥ 4× the best peer at 32×32 (batch 8), ≥ 15× at 64×64 (batch 2), ≥ 1.5× at the
paper's size (batch 100, 16×16), and there within 1.3× of the floor; at the Fashion size (batch
100, 14×14, dim 64) within 1.8× of the floor. When ``--precision`` (default
``auto``) resolves to bfloat16, the layer under bfloat16 autocast is timed too.

Part 2, ``scores``: every score type at every size, ``impl="auto"`` (fast exact path) against
``impl="dense"`` (explicit per-image N×N reference), forward+backward time and peak memory, each
measurement in a fresh subprocess so that its peak memory (CPU: peak resident set growth; CUDA:
peak allocated) is its own. Targets: isotropic Gaussian fast ≥ 2.5× dense at 32×32, ≥ 6× at
64×64, with ≥ 2.5× less peak memory at 64×64.

    python benchmarks/attention.py                            # both parts, every size
    python benchmarks/attention.py --sections peers --sizes paper --batch 10   # a quick look
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv import MultiHeadSelfAttention2d
from attnconv.attention import layer as layer_module
from attnconv.hardware import PRECISIONS, machine_description, resolve_precision
from data import synchronize
from naive_attention import _positional_logits, naive_attention_forward, use_naive_attention

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
PEER_TARGETS = {"32x32": 4.0, "64x64": 15.0, "paper": 1.5}  # layer speed-up over the best peer
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


def time_forward(forward: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor, backward: bool,
                 repeats: int, autocast: bool = False) -> float:
    """Seconds of ``forward(x)`` (and of the backward pass with output gradient ``grad``)."""
    x = x.detach().requires_grad_(backward)

    def run() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            y = forward(x)
        if backward:
            y.backward(grad.to(y.dtype))
            x.grad = None

    if backward:
        return best_seconds(run, repeats, x.device)
    with torch.no_grad():
        return best_seconds(run, repeats, x.device)


def peers(size: str, batch: int, repeats: int, device: torch.device, bf16: bool) -> dict:
    """Seconds of the layer, each peer and the floor at one size: ``{name: (fwd, fwd+bwd|None)}``."""
    _, height, width, heads, dim = SIZES[size]
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention2d(dim, heads, positional="gaussian", max_size=max(height, width))
    layer = layer.to(device)
    x = torch.randn(batch, height, width, dim, device=device)
    grad = torch.randn(batch, height, width, dim, device=device)
    candidates: dict[str, tuple[Callable[[Tensor], Tensor], bool]] = {
        "layer": (layer, True),
        "shared dense": (lambda t: shared_dense_forward(layer, t), True),
        "flex (compiled)": (flex_forward(layer, width), device.type == "cuda"),
        "naive per image": (lambda t: naive_attention_forward(layer, t), True),
    }
    other_route_name, other_route = other_route_forward(layer, height * width, device)
    candidates[other_route_name] = (other_route, True)
    floor_input = torch.randn(batch, height, width, heads * dim, device=device)
    result = {}
    for name, (forward, has_backward) in candidates.items():
        forward_s = time_forward(forward, x, grad, False, repeats)
        both_s = time_forward(forward, x, grad, True, repeats) if has_backward else None
        result[name] = (forward_s, both_s)
        layer.zero_grad(set_to_none=True)
    result["floor: projection"] = (
        time_forward(layer.out, floor_input, grad, False, repeats),
        time_forward(layer.out, floor_input, grad, True, repeats),
    )
    if bf16:
        for name, forward in (("layer", layer), (other_route_name, other_route)):
            result[f"{name}, bf16 autocast"] = (
                time_forward(forward, x, grad, False, repeats, autocast=True),
                time_forward(forward, x, grad, True, repeats, autocast=True),
            )
    layer.zero_grad(set_to_none=True)
    return result


def other_route_forward(layer: MultiHeadSelfAttention2d, tokens: int,
                        device: torch.device) -> tuple[str, Callable[[Tensor], Tensor]]:
    """The layer forced onto the position-only route its dispatch did not pick here (the shared
    ``(heads, N, N)`` matrix or the separable factors, ``layer.SHARED_MAX_TOKENS``), with a row
    name: where it is faster than the layer, the dispatch threshold is wrong for this machine."""
    shared_now = layer_module.use_shared_route(device, tokens)
    forced = {} if shared_now else {device.type: tokens}

    def forward(x: Tensor) -> Tensor:
        with mock.patch.object(layer_module, "SHARED_MAX_TOKENS", forced):
            return layer(x)

    return ("layer, separable route" if shared_now else "layer, shared route"), forward


def report_peers(size: str, batch: int, times: dict) -> list[tuple[str, float, float, bool]]:
    """Print one size's table; returns its target checks ``(name, value, target, higher_is_ok)``."""
    layer_fwd, layer_both = times["layer"]
    print(f"\n{size} (batch {batch}), seconds; ratio = that time / the layer's time")
    width = max(map(len, times)) + 2
    print(f"{'':<{width}}{'fwd s':>9}{'ratio':>8}{'fwd+bwd s':>11}{'ratio':>8}")
    for name, (fwd, both) in times.items():
        both_cols = f"{both:>11.4f}{both / layer_both:>7.2f}x" if both is not None else (
            f"{'(no CPU backward)':>19}")
        print(f"{name:<{width}}{fwd:>9.4f}{fwd / layer_fwd:>7.2f}x{both_cols}")
    checks = []
    peer_times = [both for name, (_, both) in times.items()
                  if name in ("shared dense", "flex (compiled)", "naive per image")
                  and both is not None]
    if size in PEER_TARGETS:
        checks.append((f"{size}: best peer / layer, fwd+bwd", min(peer_times) / layer_both,
                       PEER_TARGETS[size], True))
        # Every peer runs the same output projection, so no layer can beat this ratio here.
        bound = min(peer_times) / times["floor: projection"][1]
        print(f"bound: best peer / projection floor = {bound:.2f}x, the most any implementation "
              f"that runs the projection can reach on this machine (layer reaches "
              f"{min(peer_times) / layer_both / bound:.0%} of it)")
    for name, (_, both) in times.items():
        if name.startswith("layer, ") and name.endswith("route"):
            checks.append((f"{size}: {name.removeprefix('layer, ')} / layer's route, fwd+bwd",
                           both / layer_both, 1.0, True))
    if size in FLOOR_TARGETS:
        checks.append((f"{size}: layer / projection floor, fwd+bwd",
                       layer_both / times["floor: projection"][1], FLOOR_TARGETS[size], False))
    return checks


# ---------------------------------------------------------------------------- part 2: scores


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
    step()  # warm-up, also the memory measurement
    peak = (
        torch.cuda.max_memory_allocated() - base
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    )
    return {"seconds": best_seconds(step, repeats, torch.device(device)) if repeats else 0.0,
            "peak_bytes": max(peak, 1)}


def run_isolated(score: str, size: str, path: str, repeats: int, device: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", score, size, path, "--repeats", str(repeats),
         "--device", device],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def scores_part(args: argparse.Namespace) -> list[tuple[str, float, float, bool]]:
    header = (f"{'score':<16}{'size':<7}{'fast s':>9}{'dense s':>9}{'speed-up':>9}"
              f"{'fast MB':>9}{'dense MB':>10}{'mem ratio':>10}")
    print("\n" + header + "\n" + "-" * len(header))
    results = {}
    for size in args.sizes:
        for score in args.scores:
            fast = run_isolated(score, size, "auto", args.repeats, args.device)
            dense = run_isolated(score, size, "dense", args.repeats, args.device)
            results[score, size] = (fast, dense)
            print(f"{score:<16}{size:<7}{fast['seconds']:>9.3f}{dense['seconds']:>9.3f}"
                  f"{dense['seconds'] / fast['seconds']:>8.1f}x"
                  f"{fast['peak_bytes'] / 2**20:>9.0f}{dense['peak_bytes'] / 2**20:>10.0f}"
                  f"{dense['peak_bytes'] / fast['peak_bytes']:>9.1f}x", flush=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=("peers", "scores"),
                        default=["peers", "scores"])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--scores", nargs="+", choices=list(SCORES), default=list(SCORES))
    parser.add_argument("--batch", type=int, help="peers: this batch at every size (default: "
                        "each size's own; the targets are for those)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="peers: also time the layer under bf16 autocast when this resolves "
                        "to bf16 (auto: where the device computes in bfloat16 natively)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--one", nargs=3, metavar=("SCORE", "SIZE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.repeats, args.device)))
        return
    if args.repeats < 1 or (args.batch is not None and args.batch < 1):
        parser.error("--repeats and --batch must be >= 1")
    device = torch.device(args.device)
    print(machine_description(device))
    checks = []
    if "peers" in args.sections:
        bf16 = resolve_precision(args.precision, device) == "bf16"
        for size in args.sizes:
            batch = args.batch or SIZES[size][0]
            checks += report_peers(size, batch, peers(size, batch, args.repeats, device, bf16))
    if "scores" in args.sections:
        checks += scores_part(args)
    note = f" (measured at batch {args.batch}; the targets are for the default batches)"
    print("\nTargets" + (note if args.batch else "") + ":")
    for name, value, target, higher in checks:
        met = value >= target if higher else value <= target
        sign = ">=" if higher else "<="
        verdict = "met" if met else "NOT met"
        print(f"  {name:<44} {value:6.2f}x  (target {sign} {target}x)  {verdict}")


if __name__ == "__main__":
    main()

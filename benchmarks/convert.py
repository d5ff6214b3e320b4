"""Speed of Theorem 1's construction against the convolution it reproduces.

One ResNet18 layer shape (64→64 channels, 3×3, padding 1, 32×32 images, batch 32), forward pass
without autograd, timed side by side in one run:

* ``conv``: the ``nn.Conv2d`` itself;
* ``attention, hard``: ``conv_to_attention(conv)``, hard attention applied as one-hot shifts;
* ``attention, s=10``: the finite-spread construction through the layer's separable softmax path
  (row and column factors, no ``N×N`` matrix);
* ``attention, s=10, dense``: the same construction with ``impl="dense"``, the explicit per-image
  ``(heads, N, N)`` softmax (``N = 34·34`` padded pixels): the naive way to compute it.

Targets (issue 3): the converted module within 20× of the convolution, ≥ 10× faster than dense.
Each variant's max abs error against the convolution is printed too.

    python benchmarks/convert.py [--batch 32] [--size 32] [--channels 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from attnconv import conv_to_attention


def timed(fn: Callable[[], torch.Tensor], repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn`` in seconds over ``repeats`` runs, after one warm-up run."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=32, help="image side H = W")
    parser.add_argument("--channels", type=int, default=64, help="input = output channels")
    parser.add_argument(
        "--spread", type=float, default=10.0, help="finite spread s of the soft variants"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (dense: at most 2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    conv = nn.Conv2d(args.channels, args.channels, 3, padding=1).to(device)
    x = torch.randn(args.batch, args.channels, args.size, args.size, device=device)
    hard = conv_to_attention(conv)
    soft = conv_to_attention(conv, spread=args.spread)
    dense = conv_to_attention(conv, spread=args.spread)
    dense.attention.impl = "dense"

    variants = [
        ("conv (nn.Conv2d)", conv, args.repeats),
        ("attention, hard (converted module)", hard, args.repeats),
        (f"attention, s={args.spread:g} (separable softmax)", soft, args.repeats),
        (f"attention, s={args.spread:g}, dense N×N softmax", dense, min(args.repeats, 2)),
    ]
    print(
        f"conv {args.channels}→{args.channels}, 3×3, padding 1, {args.size}×{args.size}, "
        f"batch {args.batch}, forward, {device.type}"
        + (f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else "")
    )
    with torch.no_grad():
        reference = conv(x)
        rows = []
        for name, module, repeats in variants:
            error = (module(x) - reference).abs().max().item()
            rows.append((name, timed(lambda m=module: m(x), repeats, device), error))
    base, converted, dense_time = rows[0][1], rows[1][1], rows[3][1]
    print(f"{'variant':<44}{'ms':>10}{'× conv':>9}{'max abs err':>13}")
    for name, seconds, error in rows:
        print(f"{name:<44}{seconds * 1e3:>10.1f}{seconds / base:>9.2f}{error:>13.2e}")
    print(
        f"converted module: {converted / base:.1f}× the conv's time (target ≤ 20×); "
        f"{dense_time / converted:.0f}× faster than dense softmax (target ≥ 10×)"
    )


if __name__ == "__main__":
    main()

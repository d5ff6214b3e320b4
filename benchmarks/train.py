"""Training throughput of every paper preset, and the fraction of the machine's GEMM ceiling it reaches.

For each preset: SGD steps (forward, cross-entropy, backward, momentum update) at the paper's batch
size on CIFAR-shaped batches (3×32×32 random pixels: the cost does not depend on them). Each step's
floating-point operations are counted as they execute (``torch.utils.flop_counter``: the matrix
products and convolutions of forward and backward, on a batch of 2, per image), and the machine's
ceiling is measured in the same run: the best rate of a large square matrix product
(``--gemm-size``) in float32 (and in bfloat16 when that is the precision that runs). The table
gives images/s and the achieved fraction of that ceiling; the target for ``quadratic`` in float32
is ≥ 75%.

The GEMM ceiling is measured before and after the presets and the better of the two counts (a
shared machine's clock and neighbours move it by tens of percent within a minute). The same product
is also timed as a 1×1 convolution: where the convolution library (oneDNN on a CPU) reaches more
than the matrix-product one (BLAS: MKL in PyTorch's x86 builds; on an AMD EPYC Zen 5 the two
measured 404 and 203 GFLOP/s in float32), convolutional models show more than 100% of the GEMM
ceiling, and the attention models' Linear layers, which go through BLAS, cannot reach it.

On a CPU the steps run as ``attnconv train`` runs them, with freed memory kept for reuse
(``attnconv.memory.reuse_freed_memory``); the first preset is also timed in float32 before that
switch, with glibc's default allocator, and both rates are printed side by side.

Precision: float32 always (the ceiling target is for float32), plus the precision ``auto`` picks
for this machine when that is bfloat16, or ``--precision bf16`` to force it (it warns where the
CPU has no native bfloat16).

    python benchmarks/train.py                                  # every preset, 1+2 steps each
    python benchmarks/train.py --presets quadratic --batch-size 20 --steps 1   # quick look
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from attnconv.hardware import PRECISIONS, machine_description, resolve_precision
from attnconv.memory import reuse_freed_memory
from attnconv.models import count_parameters, create_model
from attnconv.train.loop import autocast

PAPER_PRESETS = ("quadratic", "quadratic-generalized", "many-heads", "learned", "learned-content",
                 "resnet18")
TARGET = {"quadratic": 0.75}  # fraction of the float32 GEMM ceiling a training step reaches
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def gemm_flops_per_second(size: int, dtype: torch.dtype, device: torch.device,
                          repeats: int = 10) -> float:
    """Best FLOP/s of ``(size×size) @ (size×size)`` in ``dtype`` over ``repeats`` timed runs."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def conv_flops_per_second(size: int, dtype: torch.dtype, device: torch.device,
                          repeats: int = 10) -> float:
    """Best FLOP/s of the same ``size³`` product run as a 1×1 convolution (oneDNN on a CPU, cuDNN
    on CUDA), the route the ResNet's convolutions take."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, size, 1, size, generator=generator).to(device=device, dtype=dtype)
    w = torch.randn(size, size, 1, 1, generator=generator).to(device=device, dtype=dtype)
    F.conv2d(x, w)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        F.conv2d(x, w)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def training_flops_per_image(preset: str, device: torch.device, batch: int = 2) -> float:
    """FLOPs of one training step (forward + backward) per image, counted as executed."""
    model = fresh_model(preset).to(device).train()
    images = torch.rand(batch, 3, 32, 32, device=device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(images), labels).backward()
    return counter.get_total_flops() / batch


def images_per_second(model: nn.Module, batch_size: int, steps: int, warmup: int,
                      precision: str, device: torch.device) -> float:
    """Training images per second over ``steps`` timed SGD steps after ``warmup`` untimed ones."""
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch_size, 3, 32, 32, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch_size,), generator=generator).to(device)

    def step() -> None:
        with autocast(precision, device):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * batch_size / (time.perf_counter() - started)


def fresh_model(preset: str) -> nn.Module:
    torch.manual_seed(0)
    return create_model(preset)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PAPER_PRESETS), choices=PAPER_PRESETS)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="the precision measured next to float32 (auto: bf16 where native)")
    parser.add_argument("--gemm-size", type=int, default=2048,
                        help="side of the square matrix product that measures the ceiling")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps", "gemm_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = torch.device(args.device)
    precisions = ["fp32"]
    other = resolve_precision(args.precision, device)
    if other != "fp32":
        precisions.append(other)

    print(machine_description(device))
    print(f"batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed steps")
    ceiling_before = {p: gemm_flops_per_second(args.gemm_size, DTYPES[p], device)
                      for p in precisions}
    default_allocator = None
    if device.type == "cpu":
        first = args.presets[0]
        default_allocator = (first, images_per_second(
            fresh_model(first), args.batch_size, args.steps, args.warmup, "fp32", device))
        reuse_freed_memory()
    ceiling = {p: max(ceiling_before[p], gemm_flops_per_second(args.gemm_size, DTYPES[p], device))
               for p in precisions}
    print("GEMM ceiling (" + ", ".join(
        f"{p} {ceiling[p] / 1e9:.0f} GFLOP/s" for p in precisions) + f"), {args.gemm_size}^3")
    conv_rate = conv_flops_per_second(args.gemm_size, torch.float32, device)
    print(f"The same product as a 1x1 convolution: fp32 {conv_rate / 1e9:.0f} GFLOP/s "
          f"({conv_rate / ceiling['fp32']:.2f}x the GEMM ceiling; where it is above 1, the "
          f"convolution library reaches more of the machine than the matrix-product one, and "
          f"convolutional models can exceed 100%)\n")

    header = f"{'preset':<24}{'params':>9}{'GFLOP/img':>11}"
    for p in precisions:
        header += f"{p + ' img/s':>13}{'% ceiling':>11}"
    if len(precisions) == 2:
        header += f"{precisions[1] + '/fp32':>11}"
    print(header + "\n" + "-" * len(header))
    for preset in args.presets:
        flops = training_flops_per_image(preset, device)
        params = count_parameters(fresh_model(preset)) / 1e6
        line = f"{preset:<24}{params:>8.2f}M{flops / 1e9:>11.2f}"
        rates = {}
        for p in precisions:
            rates[p] = images_per_second(fresh_model(preset), args.batch_size, args.steps,
                                         args.warmup, p, device)
            line += f"{rates[p]:>13.2f}{rates[p] * flops / ceiling[p]:>10.0%} "
        if len(precisions) == 2:
            line += f"{rates[precisions[1]] / rates['fp32']:>10.2f}x"
        print(line, flush=True)
        if default_allocator is not None and preset == default_allocator[0]:
            print(f"  {preset} fp32 with glibc's default allocator: {default_allocator[1]:.2f} "
                  f"img/s; freed memory reused: {rates['fp32']:.2f} img/s "
                  f"({rates['fp32'] / default_allocator[1]:.2f}x)")
        if preset in TARGET:
            fraction = rates["fp32"] * flops / ceiling["fp32"]
            print(f"  target: {preset} in fp32 at >= {TARGET[preset]:.0%} of the fp32 GEMM "
                  f"ceiling: {fraction:.0%}, {'met' if fraction >= TARGET[preset] else 'NOT met'}")


if __name__ == "__main__":
    main()

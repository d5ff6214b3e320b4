"""Training throughput of every paper preset, and the fraction of the machine's GEMM ceiling it reaches.

For each preset (the paper's, and the position-only Fashion-MNIST ones): SGD steps (forward,
cross-entropy, backward, momentum update) at the paper's batch size on batches of random pixels
shaped as the preset's images (3×32×32 for CIFAR; the cost does not depend on them). Each step's
floating-point operations are counted as they execute (``torch.utils.flop_counter``: the matrix
products and convolutions of forward and backward, on one batch of the timed size, per image:
the work per image can depend on the batch, e.g. a BERT layer's dense map folds into the output
projection only for batches of enough pixels, ``attention.layer.fold_pays``), and the machine's
ceiling is measured in the same run: the best rate of a large square matrix product
(``--gemm-size``) in float32 (and in bfloat16 when that is the precision that runs). The FLOPs
are counted per precision, after an untimed step in which the attention layers measured their
routes (``attention/routes.py``; the routes taken are printed under each preset), since a route
can do more or less work than another (the shared ``(heads, N, N)`` matrix more than the
separable factors). The table gives images/s and the achieved fraction of that ceiling; the
targets in float32 (``TARGET``) are ≥ 50% for the position-only presets, ≥ 75% for
``quadratic``; in the precision ``auto`` trains in, ≥ 40% (``AUTO_SHARE``); and where bfloat16 is
native, the bfloat16 step ≥ 1.5× as fast as the float32 one (``BF16_GAIN``) for the paper's and
the Fashion presets, or ``auto`` trains in float32 there. On a CPU the column ``CPU-s %`` gives
the same fraction per second of this process's CPU time, the ceiling timed the same way: where other
work shares the cores, the steadier of the two (waiting for a core counts in neither); the speed of
bfloat16 over float32 is then the ratio of CPU-time rates, each the best of ``--rounds`` rounds in
which a preset's two precisions alternate.

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

Then the content model (``--content-preset``, default ``learned-content-fashion``, in the forms
``--content-forms`` of ``CONTENT_FORMS``), in float32 and in bfloat16 whatever the machine: the
layer's content kernel (``attention/content.py``) against the path it replaced
(``scaled_dot_product_attention`` with the positional logits as mask, ``sdpa_content.py``),
alternating, best of ``--content-rounds``, with the ratios of wall-clock and of CPU-time rates.
Target: bfloat16 ≥ 1.8× the old path, float32 never slower. The line above the table says whether
bfloat16 is native here; where it is not, both paths compute their attention in float32 and the
bfloat16 rows mostly time the emulated Linear layers.

    python benchmarks/train.py                                  # every preset, 1+2 steps each
    python benchmarks/train.py --presets quadratic --batch-size 20 --steps 1   # quick look
    python benchmarks/train.py --presets --threads 1            # only the content model
    python benchmarks/train.py --content-forms                  # only the presets' table
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv.hardware import PRECISIONS, machine_description, native_bf16, resolve_precision
from attnconv.memory import reuse_freed_memory
from attnconv.models import count_parameters, create_model
from attnconv.train.loop import autocast
from data import synchronize
from route_timing import picks
from sdpa_content import use_sdpa_content

PAPER_PRESETS = ("quadratic", "quadratic-generalized", "many-heads", "learned", "learned-content",
                 "resnet18")
FASHION_PRESETS = ("quadratic-fashion", "learned-fashion")  # the position-only Fashion-MNIST ones
# Fraction of the float32 GEMM ceiling a training step reaches: ≥ 50% for the position-only
# presets (issue 40), and the older, stricter ≥ 75% for quadratic.
TARGET = {"quadratic": 0.75, "learned": 0.5, "quadratic-fashion": 0.5, "learned-fashion": 0.5}
AUTO_SHARE = 0.4  # the same presets' share of the ceiling in the precision auto picks (issue 57)
BF16_PRESETS = ("quadratic", "learned", "quadratic-fashion", "learned-fashion")
BF16_GAIN = 1.5  # their bf16 step's speed over the fp32 one where bf16 is native (issue 57)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONTENT_PRESETS = ("learned-content-fashion", "learned-content")
CONTENT_FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "original": ("w·r + q·k/√d", {"content_positional": False}),
    "three-terms": ("w·r + q·r/√d + q·k/√d", {"content_positional": True}),
}
"""The content model's forms that can be timed: name → (the terms it sums, overrides of the
preset)."""
CONTENT_TARGET = {"bf16": 1.8, "fp32": 1.0}  # content kernel / old path, training images/s


def gemm_flops_per_second(size: int, dtype: torch.dtype, device: torch.device,
                          repeats: int = 10, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best FLOP/s of ``(size×size) @ (size×size)`` in ``dtype`` over ``repeats`` timed runs, per
    second of ``clock`` (``time.process_time`` on a CPU: per second of this process's CPU time)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = clock()
        a @ b
        synchronize(device)
        best = min(best, clock() - started)
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
        synchronize(device)
        started = time.perf_counter()
        F.conv2d(x, w)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def training_flops_per_image(preset: str, device: torch.device, batch: int,
                             precision: str = "fp32") -> tuple[float, list[str]]:
    """FLOPs of one training step (forward + backward) on ``batch`` images in ``precision``, per
    image, counted as executed on ``device`` with the attention routes picked there (where the
    routes taken, and so the work, can differ), and those routes: an untimed step first lets the
    layers measure theirs (``attention/routes.py``), as training does on its first step."""
    model = fresh_model(preset).to(device).train()
    images = torch.rand(batch, model.in_channels, *model.image_size, device=device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)

    def step() -> None:
        with autocast(precision, device):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()

    with picks() as chosen:
        step()
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops() / batch, list(dict.fromkeys(chosen))


def training_rates(model: nn.Module, batch_size: int, steps: int, warmup: int, precision: str,
                   device: torch.device) -> tuple[float, float]:
    """Training images per second of wall-clock time and per second of this process's CPU time
    (all its threads), over ``steps`` timed SGD steps after ``warmup`` untimed ones. On a machine
    shared with other work the CPU-time rate is the steadier: waiting for a core does not count."""
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    generator = torch.Generator().manual_seed(0)
    shape = (batch_size, model.in_channels, *model.image_size)
    images = torch.rand(shape, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch_size,), generator=generator).to(device)

    def step() -> None:
        with autocast(precision, device):
            loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    synchronize(device)
    started, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    synchronize(device)
    images_done = steps * batch_size
    return (images_done / (time.perf_counter() - started),
            images_done / (time.process_time() - started_cpu))


def images_per_second(model: nn.Module, batch_size: int, steps: int, warmup: int,
                      precision: str, device: torch.device) -> float:
    """Training images per second over ``steps`` timed SGD steps after ``warmup`` untimed ones."""
    return training_rates(model, batch_size, steps, warmup, precision, device)[0]


def fresh_model(preset: str, **overrides: Any) -> nn.Module:
    torch.manual_seed(0)
    return create_model(preset, **overrides)


def content_comparison(preset: str, forms: list[str], batch_size: int, steps: int, warmup: int,
                       rounds: int, device: torch.device) -> None:
    """Print the content model's training images/s, old path and content kernel, per form and
    precision, with the ratios and whether they meet ``CONTENT_TARGET``."""
    native, why = native_bf16(device)
    print(f"\ncontent model {preset}: content kernel (attention/content.py) vs the old path "
          f"(scaled_dot_product_attention, positional logits as mask), training img/s, best of "
          f"{rounds} alternating rounds")
    print(f"bfloat16 is {'native' if native else 'NOT native'} here ({why})"
          + ("" if native else "; the content kernel then computes in float32, as the old path "
             "always does, and bfloat16 autocast only slows the Linear layers"))
    print("img/s: wall-clock; img/CPU-s: per second of this process's CPU time, the steadier "
          "where other work shares the cores")
    header = (f"{'form':<24}{'precision':>10}{'old img/s':>11}{'kernel':>9}{'ratio':>7}"
              f"{'old img/CPU-s':>15}{'kernel':>9}{'ratio':>7}")
    print(header + "\n" + "-" * len(header))
    for form in forms:
        terms, overrides = CONTENT_FORMS[form]
        for precision in ("fp32", "bf16"):
            old, new = fresh_model(preset, **overrides), fresh_model(preset, **overrides)
            if use_sdpa_content(old) == 0:
                raise ValueError(f"preset {preset!r} has no content layers")
            wall, cpu = {"old": 0.0, "new": 0.0}, {"old": 0.0, "new": 0.0}
            for _ in range(rounds):
                for name, model in (("old", old), ("new", new)):
                    rates = training_rates(model, batch_size, steps, warmup, precision, device)
                    wall[name], cpu[name] = max(wall[name], rates[0]), max(cpu[name], rates[1])
            ratio, cpu_ratio = wall["new"] / wall["old"], cpu["new"] / cpu["old"]
            verdict = "met" if ratio >= CONTENT_TARGET[precision] else "NOT met"
            print(f"{terms:<24}{precision:>10}{wall['old']:>11.2f}{wall['new']:>9.2f}"
                  f"{ratio:>6.2f}x{cpu['old']:>15.2f}{cpu['new']:>9.2f}{cpu_ratio:>6.2f}x  "
                  f"target >= {CONTENT_TARGET[precision]}x (wall): {verdict}", flush=True)


def preset_table(presets: list[str], precisions: list[str], batch_size: int, steps: int,
                 warmup: int, gemm_size: int, device: torch.device, rounds: int = 1) -> None:
    """Print the GEMM ceiling and each preset's training images/s and fraction of it; on a CPU also
    the fraction per second of CPU time (ceiling and steps both), the steadier on a shared machine.
    Each preset's precisions alternate over ``rounds`` rounds, the best rate of each counting; the
    speed of the second precision over float32 is a ratio of CPU-time rates on a CPU."""
    clocks = {"wall": time.perf_counter}
    if device.type == "cpu":
        clocks["cpu"] = time.process_time
    ceiling_before = {(p, c): gemm_flops_per_second(gemm_size, DTYPES[p], device, clock=clock)
                      for p in precisions for c, clock in clocks.items()}
    default_allocator = None
    if device.type == "cpu":
        first = presets[0]
        default_allocator = (first, images_per_second(
            fresh_model(first), batch_size, steps, warmup, "fp32", device))
        reuse_freed_memory()
    ceiling = {(p, c): max(ceiling_before[p, c],
                           gemm_flops_per_second(gemm_size, DTYPES[p], device, clock=clock))
               for p in precisions for c, clock in clocks.items()}
    print("GEMM ceiling (" + ", ".join(
        f"{p} {ceiling[p, 'wall'] / 1e9:.0f} GFLOP/s" for p in precisions) + f"), {gemm_size}^3"
        + ("; per CPU-second " + ", ".join(f"{p} {ceiling[p, 'cpu'] / 1e9:.0f}" for p in precisions)
           if "cpu" in clocks else ""))
    conv_rate = conv_flops_per_second(gemm_size, torch.float32, device)
    print(f"The same product as a 1x1 convolution: fp32 {conv_rate / 1e9:.0f} GFLOP/s "
          f"({conv_rate / ceiling['fp32', 'wall']:.2f}x the GEMM ceiling; where it is above 1, the "
          f"convolution library reaches more of the machine than the matrix-product one, and "
          f"convolutional models can exceed 100%)\n")

    header = f"{'preset':<24}{'params':>9}"
    for p in precisions:
        header += (f"{p + ' GFLOP/img':>16}{p + ' img/s':>13}{'% ceiling':>11}"
                   + f"{'CPU-s %':>11}" * ("cpu" in clocks))
    if len(precisions) == 2:
        header += f"{precisions[1] + '/fp32':>11}"
    print(header + "\n" + "-" * len(header))
    auto = resolve_precision("auto", device)
    for preset in presets:
        params = count_parameters(fresh_model(preset)) / 1e6
        line = f"{preset:<24}{params:>8.2f}M"
        rates, cpu_rates, fractions, routes_taken, flops, models = {}, {}, {}, {}, {}, {}
        for p in precisions:
            flops[p], routes_taken[p] = training_flops_per_image(preset, device, batch_size, p)
            models[p], rates[p], cpu_rates[p] = fresh_model(preset), 0.0, 0.0
        for _ in range(rounds):
            for p in precisions:
                wall, cpu = training_rates(models[p], batch_size, steps, warmup, p, device)
                rates[p], cpu_rates[p] = max(rates[p], wall), max(cpu_rates[p], cpu)
        for p in precisions:
            fractions[p] = {"wall": rates[p] * flops[p] / ceiling[p, "wall"]}
            if "cpu" in clocks:
                fractions[p]["cpu"] = cpu_rates[p] * flops[p] / ceiling[p, "cpu"]
            line += (f"{flops[p] / 1e9:>16.2f}{rates[p]:>13.2f}"
                     + "".join(f"{f:>10.0%} " for f in fractions[p].values()))
        speed = cpu_rates if "cpu" in clocks else rates
        if len(precisions) == 2:
            line += f"{speed[precisions[1]] / speed['fp32']:>10.2f}x"
        print(line, flush=True)
        print("  attention routes: " + "; ".join(
            f"{p}: {', '.join(taken) or '-'}" for p, taken in routes_taken.items()))
        if default_allocator is not None and preset == default_allocator[0]:
            print(f"  {preset} fp32 with glibc's default allocator: {default_allocator[1]:.2f} "
                  f"img/s; freed memory reused: {rates['fp32']:.2f} img/s "
                  f"({rates['fp32'] / default_allocator[1]:.2f}x)")
        if preset in TARGET:
            fraction = fractions["fp32"]["wall"]
            per_cpu = (f" ({fractions['fp32']['cpu']:.0%} per CPU-second)"
                       if "cpu" in clocks else "")
            print(f"  target: {preset} in fp32 at >= {TARGET[preset]:.0%} of the fp32 GEMM "
                  f"ceiling: {fraction:.0%}{per_cpu}, "
                  f"{'met' if fraction >= TARGET[preset] else 'NOT met'}")
        if preset in TARGET and auto in fractions:
            share = fractions[auto]["cpu" if "cpu" in clocks else "wall"]
            print(f"  target: {preset} at >= {AUTO_SHARE:.0%} of the GEMM ceiling in the "
                  f"precision auto trains in ({auto}), per "
                  f"{'CPU-second' if 'cpu' in clocks else 'second'}: {share:.0%}, "
                  f"{'met' if share >= AUTO_SHARE else 'NOT met'}")
        if preset in BF16_PRESETS and "bf16" in rates and native_bf16(device)[0]:
            gain = speed["bf16"] / speed["fp32"]
            verdict = "met" if gain >= BF16_GAIN else (
                "NOT met" + ("" if auto == "bf16" else f"; auto trains in {auto} here"))
            print(f"  target: {preset} bf16 step >= {BF16_GAIN}x the fp32 one where bf16 is "
                  f"native: {gain:.2f}x, {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=list(PAPER_PRESETS + FASHION_PRESETS),
                        choices=PAPER_PRESETS + FASHION_PRESETS,
                        help="presets of the table (none: only the content model)")
    parser.add_argument("--content-preset", choices=CONTENT_PRESETS, default=CONTENT_PRESETS[0])
    parser.add_argument("--content-forms", nargs="*", choices=list(CONTENT_FORMS),
                        default=list(CONTENT_FORMS),
                        help="forms of the content model to time (none: no content model)")
    parser.add_argument("--content-rounds", type=int, default=6,
                        help="alternating rounds of the content comparison (best counts; one "
                        "measurement varies by 10-25%% on a shared virtual machine)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds in which each preset's precisions alternate (best counts)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="the precision measured next to float32 (auto: bf16 where native)")
    parser.add_argument("--gemm-size", type=int, default=2048,
                        help="side of the square matrix product that measures the ceiling")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: its own choice; "
                        "1 keeps a machine shared with other work from stalling every parallel "
                        "operation on a descheduled thread)")
    args = parser.parse_args(argv)
    if not args.presets and not args.content_forms:
        parser.error("nothing to time: --presets and --content-forms are both empty")
    for name in ("batch_size", "steps", "gemm_size", "content_rounds", "threads", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = ["fp32"]
    other = resolve_precision(args.precision, device)
    if other != "fp32":
        precisions.append(other)

    print(machine_description(device))
    print(f"batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed steps")
    if args.presets:
        preset_table(args.presets, precisions, args.batch_size, args.steps, args.warmup,
                     args.gemm_size, device, args.rounds)
    elif device.type == "cpu":
        reuse_freed_memory()
    if args.content_forms:
        content_comparison(args.content_preset, args.content_forms, args.batch_size, args.steps,
                           args.warmup, args.content_rounds, device)

if __name__ == "__main__":
    main()

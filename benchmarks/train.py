"""Training throughput (images/s) of every paper preset at the paper's batch size, on this machine.

For each preset: SGD steps (forward, cross-entropy, backward, momentum update) on CIFAR-shaped
batches (3×32×32, random pixels: the cost does not depend on them), in float32 and with bfloat16
autocast, side by side. Then the ``quadratic`` preset once more with the same weights but its
attention layers running ``naive_attention_forward`` (per-image N×N float32 probabilities, plain
softmax with subnormals, as the paper's original code): the ratio is the speed-up of the layer's
fast paths on a whole training step (target ≥ 5×).

    python benchmarks/train.py                       # every preset, 1 warm-up + 2 timed steps
    python benchmarks/train.py --presets quadratic resnet18 --steps 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv.models import count_parameters, create_model
from attnconv.train.loop import autocast
from naive_attention import use_naive_attention

PAPER_PRESETS = ("quadratic", "quadratic-generalized", "many-heads", "learned", "learned-content",
                 "resnet18")
TARGET = 5.0


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
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"device {device} ({torch.get_num_threads()} threads), torch {torch.__version__}, "
          f"batch {args.batch_size}, {args.warmup} warm-up + {args.steps} timed steps\n")

    header = f"{'preset':<24}{'params':>9}{'fp32 img/s':>13}{'bf16 img/s':>13}{'bf16/fp32':>11}"
    print(header + "\n" + "-" * len(header))
    for preset in args.presets:
        rates = {p: images_per_second(fresh_model(preset), args.batch_size, args.steps,
                                      args.warmup, p, device) for p in ("fp32", "bf16")}
        params = count_parameters(fresh_model(preset)) / 1e6
        print(f"{preset:<24}{params:>8.2f}M{rates['fp32']:>13.1f}{rates['bf16']:>13.1f}"
              f"{rates['bf16'] / rates['fp32']:>10.2f}x", flush=True)

    naive_model = fresh_model("quadratic")
    use_naive_attention(naive_model)
    probe = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():  # same weights, before any training step
        reference = fresh_model("quadratic").to(device).eval()(probe)
        difference = (naive_model.to(device).eval()(probe) - reference).abs().max().item()
    print(f"\nnaive and fast logits of the same quadratic model agree to {difference:.1e}")
    fast = images_per_second(fresh_model("quadratic"), args.batch_size, args.steps, args.warmup,
                             "fp32", device)
    naive = images_per_second(naive_model, args.batch_size, args.steps, args.warmup, "fp32",
                              device)
    fast_bf16 = images_per_second(fresh_model("quadratic"), args.batch_size, args.steps,
                                  args.warmup, "bf16", device)
    for label, rate in (("float32", fast), ("bf16 autocast", fast_bf16)):
        ratio = rate / naive
        print(f"quadratic, fast paths in {label}: {rate:.1f} img/s, float32 naive dense "
              f"attention {naive:.1f} img/s -> {ratio:.1f}x (target >= {TARGET:.0f}x: "
              f"{'met' if ratio >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()

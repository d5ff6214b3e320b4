"""A training step of the transformed CNN beside the CNN's, in one process (docs/transform.md).

The CNN is the shipped ``resnet-fashion-small``; the transformed network is
``attnconv.transform`` of it as ``tcnn-fashion-small`` transforms it (the 3×3 convolutions of the
last two stages, spread ``TCNN_FASHION_SPREAD``, gated content attention). A step is what
``attnconv train`` does per batch: forward, cross-entropy, backward, SGD with momentum (batch 100,
Fashion-MNIST-shaped random images: the cost does not depend on the pixels). The two models are
timed alternately, ``--rounds`` rounds of ``--steps`` steps each, and the best round of each
counts; the table prints both rates and their ratio. Target: the transformed step ≤ 2× the CNN's.

For scale, the transformed layers are also timed against the route ``convert_model`` takes with a
finite spread (``conv_to_attention(conv, spread)``: attention over the padded image with an
explicit ``N×N`` softmax), forward only, as ``--compare-convert`` asks.

    python benchmarks/transform.py                       # 2 threads, 5 rounds of 5 steps
    python benchmarks/transform.py --threads 1 --precision bf16
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.convert import convert_model, transform
from attnconv.hardware import machine_description
from attnconv.memory import reuse_freed_memory
from attnconv.models import count_parameters
from attnconv.models.presets import TCNN_FASHION_LAYERS, TCNN_FASHION_SPREAD
from attnconv.models.pretrained import load_pretrained
from attnconv.train.loop import autocast


def step_time(model: nn.Module, images, labels, steps: int, precision: str) -> float:
    """Seconds per training step (forward, loss, backward, SGD update), mean over ``steps``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, images.device):
            loss = F.cross_entropy(model(images).float(), labels)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def forward_time(model: nn.Module, images, steps: int) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(steps):
            model(images)
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; best counts")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--compare-convert", action="store_true",
                        help="also time convert_model's finite-spread route, forward only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reuse_freed_memory()
    torch.manual_seed(0)
    cnn = load_pretrained("resnet-fashion-small").train()
    transformed = transform(cnn, list(TCNN_FASHION_LAYERS), spread=TCNN_FASHION_SPREAD).train()
    images = torch.rand(args.batch_size, 1, 28, 28)
    labels = torch.randint(0, 10, (args.batch_size,))
    models = {"resnet-fashion-small (CNN)": cnn, "tcnn-fashion-small (transformed)": transformed}
    for model in models.values():  # warm-up: allocations, kernels chosen
        step_time(model, images, labels, 2, args.precision)
    best = dict.fromkeys(models, float("inf"))
    for _ in range(args.rounds):
        for name, model in models.items():
            best[name] = min(best[name], step_time(model, images, labels, args.steps,
                                                   args.precision))
    print(f"{machine_description(torch.device('cpu'))}; {args.threads} thread(s), batch {args.batch_size}, "
          f"{args.precision}, best of {args.rounds} rounds of {args.steps} steps")
    cnn_time = best["resnet-fashion-small (CNN)"]
    print(f"{'model':34} {'params':>9} {'ms/step':>9} {'img/s':>8} {'× CNN':>7}")
    for name, model in models.items():
        seconds = best[name]
        print(f"{name:34} {count_parameters(model):9,d} {1e3 * seconds:9.1f} "
              f"{args.batch_size / seconds:8.0f} {seconds / cnn_time:7.2f}")
    if args.compare_convert:
        converted = convert_model(cnn, spread=TCNN_FASHION_SPREAD).eval()
        dense = {
            "convert_model, finite spread (dense N×N)": converted,
            "tcnn-fashion-small (transformed)": transformed.eval(),
            "resnet-fashion-small (CNN)": cnn.eval(),
        }
        times = {name: min(forward_time(m, images, args.steps) for _ in range(args.rounds))
                 for name, m in dense.items()}  # fmt: skip
        print(f"\nforward only (eval): {'model':44} {'ms':>8} {'× CNN':>7}")
        for name, seconds in times.items():
            print(f"{'':21}{name:44} {1e3 * seconds:8.1f} "
                  f"{seconds / times['resnet-fashion-small (CNN)']:7.2f}")


if __name__ == "__main__":
    main()

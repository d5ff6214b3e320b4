"""A training step of the transformed CNN beside the CNN's, in one process (docs/transform.md).

Two networks (``--networks``): ``fashion``, the shipped ``resnet-fashion-small`` and
``attnconv.transform`` of it as ``tcnn-fashion-small`` transforms it (the 3×3 convolutions of the
last two stages, spread ``TCNN_FASHION_SPREAD``, gated content attention), on Fashion-MNIST-shaped
images, batch ``--batch-size``; and ``resnet18``, torchvision's ResNet-18 (random weights, 10
classes) and its transform with the same defaults (``layers="late"``: the 3×3 convolutions of
``layer3`` and ``layer4``), on ``--resnet-size``-pixel RGB images, batch ``--resnet-batch``. A step
is what ``attnconv train`` does per batch: forward, cross-entropy, backward, SGD with momentum
(random images: the cost does not depend on the pixels). The CNN and its transform are timed
alternately, ``--rounds`` rounds of ``--steps`` steps each, and the best round of each counts; the
table prints both rates and their ratio. Target: every transformed step ≤ 2.5× its CNN's.

For scale, the transformed layers are also timed against the route ``convert_model`` takes with a
finite spread (``conv_to_attention(conv, spread)``: attention over the padded image with an
explicit ``N×N`` softmax), forward only, as ``--compare-convert`` asks.

    python benchmarks/transform.py                       # 2 threads, 5 rounds of 5 steps
    python benchmarks/transform.py --threads 1 --precision bf16 --networks fashion
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


def networks(name: str, args: argparse.Namespace) -> tuple[dict[str, nn.Module], tuple[int, ...]]:
    """``{label: model}`` of the CNN (first) and its transform, and the shape of a batch."""
    torch.manual_seed(0)
    if name == "fashion":
        cnn = load_pretrained("resnet-fashion-small").train()
        transformed = transform(cnn, list(TCNN_FASHION_LAYERS), spread=TCNN_FASHION_SPREAD)
        labels = ("resnet-fashion-small (CNN)", "tcnn-fashion-small (transformed)")
        return dict(zip(labels, (cnn, transformed.train()), strict=True)), (1, 28, 28)
    from attnconv.analysis.third_party import import_torchvision

    size = args.resnet_size
    cnn = import_torchvision().models.resnet18(num_classes=10).train()
    transformed = transform(cnn, spread=TCNN_FASHION_SPREAD, example=torch.zeros(1, 3, size, size))
    labels = (f"torchvision resnet18, {size} px (CNN)", "resnet18 transformed (late layers)")
    return dict(zip(labels, (cnn, transformed.train()), strict=True)), (3, size, size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; best counts")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--networks", nargs="+", choices=("fashion", "resnet18"),
                        default=["fashion", "resnet18"])
    parser.add_argument("--resnet-size", type=int, default=112, help="ResNet-18's image size")
    parser.add_argument("--resnet-batch", type=int, default=8, help="ResNet-18's batch")
    parser.add_argument("--compare-convert", action="store_true",
                        help="also time convert_model's finite-spread route, forward only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    reuse_freed_memory()
    print(f"{machine_description(torch.device('cpu'))}; {args.threads} thread(s), "
          f"{args.precision}, best of {args.rounds} rounds of {args.steps} steps")
    for network in args.networks:
        models, shape = networks(network, args)
        batch = args.batch_size if network == "fashion" else args.resnet_batch
        images, labels = torch.rand(batch, *shape), torch.randint(0, 10, (batch,))
        for model in models.values():  # warm-up: allocations, kernels chosen
            step_time(model, images, labels, 2, args.precision)
        best = dict.fromkeys(models, float("inf"))
        for _ in range(args.rounds):
            for name, model in models.items():
                best[name] = min(best[name], step_time(model, images, labels, args.steps,
                                                       args.precision))  # fmt: skip
        cnn_time = next(iter(best.values()))
        print(f"\n{'model (batch ' + str(batch) + ')':38} {'params':>11} {'ms/step':>9} "
              f"{'img/s':>8} {'× CNN':>7}")
        for name, model in models.items():
            seconds = best[name]
            print(f"{name:38} {count_parameters(model):11,d} {1e3 * seconds:9.1f} "
                  f"{batch / seconds:8.0f} {seconds / cnn_time:7.2f}")
    if args.compare_convert:
        torch.manual_seed(0)
        cnn = load_pretrained("resnet-fashion-small").train()
        transformed = transform(cnn, list(TCNN_FASHION_LAYERS), spread=TCNN_FASHION_SPREAD)
        images = torch.rand(args.batch_size, 1, 28, 28)
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

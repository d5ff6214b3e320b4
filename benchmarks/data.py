"""Training-batch throughput: attnconv's BatchLoader against a per-image DataLoader, same run.

Both produce the same thing: shuffled float32 batches in [0, 1], each image cropped at a random
offset from its 4-pixel zero-padded copy and flipped left-right with probability ½, on the device.

* batched: ``attnconv.data.BatchLoader`` (one uint8 tensor on the device, one gather per batch);
* per-image: ``torch.utils.data.DataLoader`` over a ``Dataset`` whose ``__getitem__`` converts,
  pads, crops and flips one image (the usual torchvision-style pipeline, written out here), then
  the collated batch is moved to the device.

    python benchmarks/data.py                      # CIFAR-shaped random images, CPU
    python benchmarks/data.py --dataset digits --device cuda --workers 2

Target: batched ≥ 10× the per-image images/s.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from attnconv.data import DATASETS, BatchLoader, ImageSet, load_splits


class PerImageCropFlip(Dataset):
    """One image at a time: uint8 (C, H, W) -> float [0, 1], zero-pad, random crop, random flip."""

    def __init__(self, data: ImageSet, pad: int) -> None:
        self.data, self.pad = data, pad

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.data.images[i].float().div(255.0)
        _, h, w = image.shape
        padded = F.pad(image, (self.pad,) * 4)
        top, left = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
        crop = padded[:, top : top + h, left : left + w]
        if torch.rand(()) < 0.5:
            crop = crop.flip(-1)
        return crop, self.data.labels[i]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously); nothing on a CPU. Every
    benchmark's timer calls this on both sides of what it times."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(batches: Iterable, device: torch.device, count: int) -> float:
    """Images per second of ``count`` batches of ``batches`` (moved to ``device``), after
    discarding the first one."""
    iterator = iter(batches)
    next(iterator)
    synchronize(device)
    start, seen = time.perf_counter(), 0
    for _ in range(count):
        images, labels = next(iterator)
        images, labels = images.to(device), labels.to(device)
        seen += len(labels)
    synchronize(device)
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dataset",
        choices=("synthetic", *DATASETS),
        default="synthetic",
        help="'synthetic': 50000 random 3×32×32 images (no files needed)",
    )
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batches", type=int, default=50, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per pipeline (best)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    if args.dataset == "synthetic":
        generator = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (50000, 3, 32, 32), generator=generator, dtype=torch.uint8)
        data = ImageSet(images, torch.randint(0, 10, (50000,), generator=generator))
    else:
        data = load_splits(args.dataset).train
    device = torch.device(args.device)
    needed = (args.batches + 1) * args.batch_size
    if len(data) < needed:
        repeats = -(-needed // len(data))
        data = ImageSet(data.images.repeat(repeats, 1, 1, 1), data.labels.repeat(repeats))

    loader = BatchLoader(data, args.batch_size, device=device, train=True, flip=True, pad=4)
    per_image = DataLoader(
        PerImageCropFlip(data, pad=4),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
    )
    # Alternate the two, so that both see the same machine; keep each one's best round.
    fast = slow = 0.0
    for round_ in range(args.rounds):
        fast = max(fast, images_per_second(loader.epoch(round_), device, args.batches))
        slow = max(slow, images_per_second(per_image, device, args.batches))

    print(
        f"dataset {args.dataset} ({len(data)} images {tuple(data.images.shape[1:])}), "
        f"batch {args.batch_size}, device {device}, torch threads {torch.get_num_threads()}, "
        f"DataLoader workers {args.workers}"
    )
    print(f"{'pipeline':<34}{'images/s':>12}")
    print(f"{'batched (BatchLoader)':<34}{fast:>12,.0f}")
    print(f"{'per-image (DataLoader)':<34}{slow:>12,.0f}")
    print(f"speed-up: {fast / slow:.1f}x (target >= 10x)")


if __name__ == "__main__":
    main()

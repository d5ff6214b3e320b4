"""Batches straight from one on-device uint8 tensor, augmented a whole batch at a time.

``BatchLoader`` keeps a split on the training device and yields float32 batches in [0, 1]. In
training mode every random choice is a pure function of ``(seed, epoch)`` (the shuffle) and
``(seed, epoch, batch index)`` (crop offsets and flips), so ``epoch(e, start_batch=k)`` yields
exactly the batches ``k, k+1, ...`` of an uninterrupted ``epoch(e)``, on any device and for any
number of ranks. Random numbers are drawn on the CPU (a few hundred per batch) and the pixels are
moved on the device by one gather: no per-image Python.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from attnconv.data.splits import ImageSet


def random_crop_flip(
    images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int
) -> torch.Tensor:
    """Crop each image from its zero-padded copy, then mirror it left-right where asked.

    ``images`` (B, C, H, W), any dtype; ``pad`` pixels of zeros are added on every side. ``offsets``
    int64 (B, 2): the (row, col) of each crop's top-left corner in the padded image, in
    [0, 2·pad] (``pad, pad`` is the unshifted image). ``flips`` bool (B,): flip that crop
    horizontally. Returns (B, C, H, W) of the dtype of ``images``:
    ``out[i, :, r, c] = padded[i, :, offsets[i, 0] + r, offsets[i, 1] + c']`` with
    ``c' = W - 1 - c`` where ``flips[i]``, else ``c' = c``.
    """
    if images.dim() != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    b, c, h, w = images.shape
    if offsets.shape != (b, 2) or offsets.dtype != torch.int64:
        raise ValueError(
            f"offsets must be int64 of shape ({b}, 2), got {offsets.dtype} {tuple(offsets.shape)}"
        )
    if flips.shape != (b,) or flips.dtype != torch.bool:
        raise ValueError(
            f"flips must be bool of shape ({b},), got {flips.dtype} {tuple(flips.shape)}"
        )
    if b and (offsets.min() < 0 or offsets.max() > 2 * pad):
        raise ValueError(
            f"offsets must lie in [0, {2 * pad}] for pad={pad}, got "
            f"[{offsets.min().item()}, {offsets.max().item()}]"
        )
    device = images.device
    offsets = offsets.to(device, non_blocking=True)
    flips = flips.to(device, non_blocking=True)
    padded = F.pad(images, (pad, pad, pad, pad)) if pad else images
    wp = w + 2 * pad
    cols = torch.arange(w, device=device)
    cols = torch.where(flips[:, None], w - 1 - cols, cols) + offsets[:, 1:]  # (B, W)
    rows = torch.arange(h, device=device) + offsets[:, :1]  # (B, H)
    index = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w)  # (B, 1, H·W)
    flat = padded.reshape(b, c, -1)  # (B, C, Hp·Wp)
    return torch.gather(flat, 2, index.expand(b, c, h * w)).reshape(b, c, h, w)


def _generator(*key: int) -> torch.Generator:
    """A CPU generator seeded by a hash of the integers ``key`` (independent streams per key)."""
    digest = hashlib.sha256(",".join(map(str, key)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


class BatchLoader:
    """Iterate over an ``ImageSet`` held as one uint8 tensor on ``device``.

    Train mode (``train=True``): each epoch is shuffled, the last incomplete batch is dropped,
    and every image is cropped at a random offset from its ``pad``-pixel zero-padded copy and, if
    ``flip``, mirrored left-right with probability ½. Eval mode: the images in order, no
    augmentation, the last partial batch kept.

    Distributed: each global batch of ``batch_size`` images is cut into ``world_size`` contiguous
    shards (equal in train mode; a partial eval batch is cut as evenly as possible) and rank
    ``rank`` gets shard ``rank``. ``len(loader)`` counts this rank's batches per epoch (an eval
    rank whose shard of the last batch would be empty skips it).
    """

    def __init__(
        self,
        images_set: ImageSet,
        batch_size: int,
        *,
        device: torch.device | str,
        train: bool,
        flip: bool,
        pad: int = 4,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not isinstance(images_set, ImageSet):
            raise TypeError(f"images_set must be an ImageSet, got {type(images_set).__name__}")
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.pad = _check_int("pad", pad, 0)
        self.seed = _check_int("seed", seed, 0)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(
                f"rank must be in [0, {world_size}) for world_size={world_size}, got {rank}"
            )
        if batch_size % world_size:
            raise ValueError(
                f"batch_size ({batch_size}) must be divisible by world_size ({world_size})"
            )
        if train and len(images_set) < batch_size:
            raise ValueError(
                f"train mode drops incomplete batches, but the split has {len(images_set)} "
                f"images, fewer than batch_size={batch_size}"
            )
        self.train = bool(train)
        self.flip = bool(flip)
        self.device = torch.device(device)
        self.images = images_set.images.to(self.device)  # (N, C, H, W) uint8
        self.labels = images_set.labels.to(self.device)  # (N,) int64

    def __len__(self) -> int:
        full, rest = divmod(len(self.labels), self.batch_size)
        if self.train:
            return full
        return full + int(rest > self.rank)

    def epoch(
        self, epoch: int, start_batch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches ``start_batch, start_batch+1, ...`` of epoch ``epoch``.

        Yields (images float32 (b, C, H, W) in [0, 1] on ``device``, labels int64 (b,)), where
        b = batch_size / world_size (eval mode: smaller for the last batch).
        """
        _check_int("epoch", epoch, 0)
        _check_int("start_batch", start_batch, 0)
        if start_batch > len(self):
            raise ValueError(f"start_batch must be in [0, {len(self)}], got {start_batch}")
        if self.train:
            return self._train_batches(epoch, start_batch)
        return self._eval_batches(start_batch)

    def _shard(self, size: int) -> slice:
        """This rank's part of a global batch of ``size`` images (as ``torch.tensor_split``)."""
        base, extra = divmod(size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + int(self.rank < extra))

    def _train_batches(
        self, epoch: int, start_batch: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        bs = self.batch_size
        order = torch.randperm(len(self.labels), generator=_generator(self.seed, epoch))
        for batch in range(start_batch, len(self)):
            rng = _generator(self.seed, epoch, batch)
            offsets = torch.randint(0, 2 * self.pad + 1, (bs, 2), generator=rng)
            flips = (torch.rand(bs, generator=rng) < 0.5) & self.flip
            shard = self._shard(bs)
            idx = order[batch * bs : (batch + 1) * bs][shard].to(self.device, non_blocking=True)
            images = random_crop_flip(self.images[idx], offsets[shard], flips[shard], self.pad)
            yield images.float().div_(255.0), self.labels[idx]

    def _eval_batches(self, start_batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, bs = len(self.labels), self.batch_size
        for batch in range(start_batch, len(self)):
            shard = self._shard(min(bs, n - batch * bs))
            lo, hi = batch * bs + shard.start, batch * bs + shard.stop
            yield self.images[lo:hi].float().div_(255.0), self.labels[lo:hi]

"""Whole networks converted by Theorem 1 against the originals: time, peak memory, exactness.

Small look-alikes of real architectures (built here: random weights, BatchNorm statistics set
first), each converted with ``convert_model`` (hard attention, exact):

* ``resnet18``: the package's ResNet-18 (3×3 convolutions, strided, 1×1 shortcuts);
* ``inverted-residual``: MobileNet/EfficientNet-style blocks (1×1 expand, depthwise 3×3/5×5
  strided, squeeze-excite 1×1 convolutions, 1×1 project);
* ``convnext``: ConvNeXt-style (4×4 stride-4 patch stem, depthwise 7×7, 2×2 stride-2 downsampling);
* ``text-conv1d``: a Conv1d text network (embedding, dense, dilated and depthwise Conv1d);

and two single layers the construction used to scale badly with: a 7×7 depthwise layer of 768
channels and a ``Conv1d`` over 8192 positions.

For each: forward time without autograd in eval mode (median of ``--repeats`` after a warm-up)
and peak tensor memory allocated during one forward (torch profiler allocation events), original
and converted, measured side by side in one run; and the relative error of the converted forward
(``max |converted − original| / max |original|``) in float32 and float64. Times are the process's
CPU time with ``--threads`` intra-op threads (default 1): a CPU shared with other jobs stretches
wall time, not the CPU time spent. Target (issue 11): converted ≤ 10× the original's time.

    python benchmarks/convert.py [--repeats 5] [--threads 1] [--batch 2] [--size 64]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from attnconv import convert_model
from attnconv.convert import conversion_summary, layers_left
from attnconv.models.resnet import resnet18


class InvertedResidual(nn.Module):
    """1×1 expand, depthwise k×k (stride s), squeeze-excite, 1×1 project; residual when shapes match."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid))
        self.depthwise = nn.Sequential(
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
        )
        self.squeeze = nn.Conv2d(mid, max(1, cin // 4), 1)
        self.excite = nn.Conv2d(max(1, cin // 4), mid, 1)
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        y = F.silu(self.depthwise(F.silu(self.expand(x))))
        scale = torch.sigmoid(self.excite(F.silu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        y = self.project(y * scale)
        return x + y if self.residual else y


def inverted_residual_net() -> nn.Module:
    """EfficientNet-B0-like: stem 3×3/2, MBConv stages with 3×3 and 5×5 depthwise, 1×1 head."""
    stages = [(16, 24, 3, 2, 6), (24, 24, 3, 1, 6), (24, 40, 5, 2, 6), (40, 40, 5, 1, 6),
              (40, 80, 3, 2, 6), (80, 112, 5, 1, 6), (112, 192, 5, 2, 6)]  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.SiLU(),
        InvertedResidual(32, 16, 3, 1, 1),
        *(InvertedResidual(*stage) for stage in stages),
        nn.Conv2d(192, 640, 1, bias=False),
        nn.BatchNorm2d(640),
        nn.SiLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(640, 10),
    )


class ChannelsLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of a ``(B, C, H, W)`` tensor."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7×7, LayerNorm, 4× MLP (Linear), residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        y = self.mlp(self.norm(self.depthwise(x).permute(0, 2, 3, 1)))
        return x + y.permute(0, 3, 1, 2)


def convnext_net(dims: tuple[int, ...] = (48, 96, 192, 384)) -> nn.Module:
    """ConvNeXt-like: 4×4/4 patch stem, two blocks per stage, LayerNorm + 2×2/2 downsampling."""
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelsLayerNorm(dims[0])]
    for i, dim in enumerate(dims):
        if i > 0:
            layers += [ChannelsLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
        layers += [ConvNeXtBlock(dim), ConvNeXtBlock(dim)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(dims[-1], 10))


class TextConv1d(nn.Module):
    """Token embedding, then dense, dilated, depthwise and pointwise Conv1d, pooled to classes."""

    def __init__(self, vocab: int = 1000, dim: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.convs = nn.Sequential(
            nn.Conv1d(dim, dim, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(dim, dim, 3, padding=2, dilation=2),
            nn.ReLU(),
            nn.Conv1d(dim, dim, 7, padding=3, groups=dim),
            nn.Conv1d(dim, 2 * dim, 1),
            nn.ReLU(),
            nn.Conv1d(2 * dim, dim, 3, stride=2, padding=1),
        )
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens).transpose(1, 2)  # (B, dim, L)
        return self.head(self.convs(x).mean(dim=2))


def randomise_batchnorm(model: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.rand(m.num_features, generator=generator) - 0.5)
            m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
    return model


def cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_time(fn: Callable[[], Tensor], repeats: int) -> float:
    """Median process CPU time of ``fn`` in seconds over ``repeats`` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def peak_memory(fn: Callable[[], Tensor]) -> int:
    """Peak bytes of tensor memory live during ``fn`` beyond what was live before it."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def relative_error(original: nn.Module, converted: nn.Module, x: Tensor) -> float:
    reference, value = original(x), converted(x)
    return ((value - reference).abs().max() / reference.abs().max()).item()


def cases(batch: int, size: int) -> list[tuple[str, Callable[[], nn.Module], Callable[[], Tensor]]]:
    """(name, model builder, input builder); inputs are float32, cast with the model."""

    def image() -> Tensor:
        return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))

    return [
        ("resnet18", lambda: resnet18(num_classes=10), image),
        ("inverted-residual", inverted_residual_net, image),
        ("convnext", convnext_net, image),
        (
            "text-conv1d (L=2048)",
            TextConv1d,
            lambda: torch.randint(
                0, 1000, (batch, 2048), generator=torch.Generator().manual_seed(1)
            ),
        ),
        (
            "layer: depthwise 7×7, 768 ch, 14×14",
            lambda: nn.Conv2d(768, 768, 7, padding=3, groups=768),
            lambda: torch.randn(1, 768, 14, 14, generator=torch.Generator().manual_seed(1)),
        ),
        (
            "layer: Conv1d 64→64, k=3, L=8192",
            lambda: nn.Conv1d(64, 64, 3, padding=1),
            lambda: torch.randn(1, 64, 8192, generator=torch.Generator().manual_seed(1)),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=64, help="image side H = W")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{cpu_model()}, {args.threads} thread(s), "
        f"torch {torch.__version__}; batch {args.batch}, images {args.size}×{args.size}; "
        "forward, eval, no autograd; CPU time"
    )
    header = (
        f"{'network':<38}{'convs':>6}{'left':>5}{'orig ms':>10}{'attn ms':>10}{'× time':>8}"
        f"{'orig MB':>9}{'attn MB':>9}{'× mem':>7}{'err f32':>10}{'err f64':>10}"
    )
    print(header)
    worst = 0.0
    with torch.no_grad():
        for index, (name, build, make_input) in enumerate(cases(args.batch, args.size)):
            torch.manual_seed(index)
            model = randomise_batchnorm(build(), index).eval()
            converted = convert_model(model)
            x = make_input()
            t_orig = cpu_time(lambda m=model, x=x: m(x), args.repeats)
            t_attn = cpu_time(lambda m=converted, x=x: m(x), args.repeats)
            m_orig = peak_memory(lambda m=model, x=x: m(x))
            m_attn = peak_memory(lambda m=converted, x=x: m(x))
            err32 = relative_error(model, converted, x)
            x64 = x.double() if x.is_floating_point() else x
            err64 = relative_error(model.double(), converted.double(), x64)
            convs = len(conversion_summary(converted))
            if not name.startswith("layer:"):
                worst = max(worst, t_attn / t_orig)
            print(
                f"{name:<38}{convs:>6}{len(layers_left(converted)):>5}{t_orig * 1e3:>10.1f}"
                f"{t_attn * 1e3:>10.1f}{t_attn / t_orig:>8.2f}{m_orig / 2**20:>9.1f}"
                f"{m_attn / 2**20:>9.1f}{m_attn / max(m_orig, 1):>7.2f}{err32:>10.1e}{err64:>10.1e}"
            )
    print(f"largest whole-network time ratio: {worst:.2f}× (target ≤ 10×)")


if __name__ == "__main__":
    main()

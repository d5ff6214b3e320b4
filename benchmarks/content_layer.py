"""The content layer against ``scaled_dot_product_attention`` with the same relative bias, in every
mode, and the content model's training step against the plain ViT's.

Part 1, ``layer``: ``learned-content-fashion``'s attention (``w·r + q·k/√d``: 64 channels, 9 heads
of 16, a 14×14 grid, batch 100) in four modes, no-grad forward (what ``eval``, ``analyze`` and
``explore`` run) and forward+backward, each in float32 and under bfloat16 autocast, next to

- ``SDPA + bias``: the same projections, then ``F.scaled_dot_product_attention`` with the
  positional logits as a 4-D ``attn_mask`` (``sdpa_content.py``): the fused kernel where PyTorch
  has one for the mode (without gradients on a CPU; with a mask that needs one it runs its ``math``
  kernel);
- ``previous``: the content path before the fused route and the blocks (``attention/content.py``):
  the folded route in every mode with one block, the whole batch (as then, but for the bias
  gradient, summed over the batch in float32 where the old path summed in bfloat16, more slowly).

On a GPU the layer takes the fused route in bfloat16 (then it is ``SDPA + bias``) and the folded
route, one block, in float32 (then it is ``previous``).

Ratios are the peer's time over the layer's (> 1: the layer is faster); best of ``--rounds``
rounds in which the contenders alternate, in one process. On a CPU the times are this process's
CPU time (steadier than wall-clock where other work shares the cores; with ``--threads 1`` the
two agree on an idle machine), with freed memory kept for reuse as ``attnconv train`` runs.

Part 2, ``steps``: a training step (forward, cross-entropy, backward, SGD with momentum) of
``learned-content-fashion`` against ``vit-fashion`` (the plain ViT at similar multiply-adds) on
Fashion-shaped batches, float32 and bfloat16 autocast, alternating, best of ``--rounds``; beside
them the content model with its BERT dense map applied after the output projection rather than
folded into it (``attention.layer.fold_pays``), the path before the fold, and the ViT with its
attention on the folded route where it now takes SDPA's fused kernel (a CPU with gradients:
``content.uses_sdpa``), the path before that.

    python benchmarks/content_layer.py --threads 1
    python benchmarks/content_layer.py --sections layer --batch 20 --rounds 3   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnconv import MultiHeadSelfAttention2d
from attnconv.attention import content
from attnconv.attention import layer as layer_module
from attnconv.hardware import machine_description
from attnconv.memory import reuse_freed_memory
from attnconv.models import create_model
from attnconv.models.costs import preset_cost
from data import synchronize
from sdpa_content import sdpa_forward_content

MODES = (("no-grad", "fp32"), ("no-grad", "bf16"), ("fwd+bwd", "fp32"), ("fwd+bwd", "bf16"))
STEP_PRESETS = ("learned-content-fashion", "vit-fashion")


def fashion_content_layer(device: torch.device) -> MultiHeadSelfAttention2d:
    """``learned-content-fashion``'s attention layer, seeded."""
    torch.manual_seed(0)
    return MultiHeadSelfAttention2d(
        64, 9, head_dim=16, positional="learned", content=True, max_size=14
    ).to(device)


def previous_forward(layer: MultiHeadSelfAttention2d, x: Tensor) -> Tensor:
    """``layer``'s output through the previous content path, the folded route in every mode; run
    it within ``whole_batch`` (forward and backward) for its one block, the whole batch."""
    batch, height, width, _ = x.shape
    n = height * width
    q = layer.query(x) / layer.head_dim**0.5
    q = q.view(batch, n, layer.heads, layer.head_dim).transpose(1, 2)  # (B, heads, N, d)
    k = layer.key(x).view(batch, n, layer.heads, layer.head_dim).transpose(1, 2)
    value = layer._values(x).flatten(2, 3)  # (B, heads, N, d)
    bias = layer.position.logits(height, width)  # (heads, N, N)
    device_type = x.device.type
    dtype = q.dtype
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    with torch.autocast(device_type, enabled=False):
        y, _ = content._FoldedAttention.apply(
            q.to(dtype).contiguous(), k.to(dtype).contiguous(), None,
            value.to(dtype).contiguous(), bias.to(dtype), 0.0,
        )
    projection = (layer.out.weight, layer.out.bias)
    return layer._project_out(y.view(batch, layer.heads, height, width, -1), projection)


def whole_batch() -> contextlib.AbstractContextManager:
    """The folded route with one block, the whole batch, as before it ran in blocks."""
    return mock.patch.object(content, "block_entries", lambda device: float("inf"))


def alternate(runs: dict[str, Callable[[], None]], rounds: int,
              device: torch.device) -> dict[str, float]:
    """Best seconds of each run over ``rounds`` rounds in which they alternate (one warm-up each),
    the order rotated each round so that none always follows the same one: on a CPU this
    process's CPU time, which waiting for a core shared with other work does not inflate; on a GPU
    wall-clock time."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    names = list(runs)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            run = runs[name]
            synchronize(device)
            started = clock()
            run()
            synchronize(device)
            best[name] = min(best[name], clock() - started)
    return best


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def layer_section(batch: int, rounds: int, device: torch.device) -> None:
    layer = fashion_content_layer(device)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 14, 14, 64, generator=generator).to(device)
    grad = torch.randn(batch, 14, 14, 64, generator=generator).to(device)
    forwards: dict[str, Callable[[Tensor], Tensor]] = {
        "attnconv": layer,
        "SDPA + bias": lambda x: sdpa_forward_content(layer, x)[0],
        "previous": lambda x: previous_forward(layer, x),
    }
    contexts = {"previous": whole_batch}
    with torch.no_grad():
        expected = layer(x)
        for name, forward in forwards.items():
            with contexts.get(name, contextlib.nullcontext)():
                y = forward(x)
            error = (y - expected).abs().max() / expected.abs().max()
            if error > 1e-4:
                raise AssertionError(f"{name} differs from the layer by {error:.1e} (relative)")
    print(f"\nlayer: learned-content-fashion's attention (w·r + q·k/√d, 64 channels, 9 heads of "
          f"16, 14x14 tokens), batch {batch}; best of {rounds} alternating rounds; ratio = peer's "
          "time / attnconv's (> 1: attnconv faster)")
    header = f"{'mode':<9}{'precision':>10}" + "".join(f"{name:>13}" for name in forwards)
    header += "".join(f"{'/ ' + name:>15}" for name in list(forwards)[1:])
    print(header + "\n" + "-" * len(header))
    for mode, precision in MODES:

        def run(name: str, mode: str = mode, precision: str = precision) -> Callable[[], None]:
            forward = forwards[name]

            def call() -> None:
                with contexts.get(name, contextlib.nullcontext)():
                    if mode == "no-grad":
                        with torch.no_grad(), autocast(precision, device):
                            forward(x)
                        return
                    inputs = x.detach().requires_grad_(True)
                    with autocast(precision, device):
                        y = forward(inputs)
                    layer.zero_grad(set_to_none=True)
                    y.backward(grad.to(y.dtype))

            return call

        best = alternate({name: run(name) for name in forwards}, rounds, device)
        ours = best["attnconv"]
        line = f"{mode:<9}{precision:>10}" + "".join(f"{best[n] * 1e3:>11.1f}ms" for n in best)
        line += "".join(f"{best[n] / ours:>14.2f}x" for n in list(best)[1:])
        print(line, flush=True)


UNFOLDED = "content, two maps"
"""The content model with its dense map applied after the output projection, as before the two
were folded into one (``attention.layer.fold_pays``): the fold's gain, measured alongside."""
VIT_FOLDED = "vit, folded route"
"""The ViT with its attention on the folded route with gradients (``folded_with_gradients``):
the fused kernel's gain, measured alongside."""


def two_maps() -> contextlib.AbstractContextManager:
    """Every layer applies a following map after its output projection, never folded into it."""
    return mock.patch.object(layer_module, "fold_pays", lambda *args: False)


def folded_with_gradients() -> contextlib.AbstractContextManager:
    """Content attention with gradients on a CPU takes the folded route, as it did before an
    unmasked one took SDPA's fused kernel (``content.uses_sdpa``); elsewhere the rule is kept."""
    rule = content.uses_sdpa

    def before(device: torch.device, dtype: torch.dtype, needs_grad: bool, masked: bool) -> bool:
        return rule(device, dtype, needs_grad, masked) and not (
            device.type == "cpu" and needs_grad
        )

    return mock.patch.object(content, "uses_sdpa", before)


def step_section(batch: int, rounds: int, device: torch.device) -> None:
    costs = {name: preset_cost(name) for name in STEP_PRESETS}
    print(f"\nsteps: one training step (forward, cross-entropy, backward, SGD with momentum), "
          f"batch {batch} of Fashion-shaped images; best of {rounds} alternating rounds")
    print("  ".join(f"{name}: {costs[name].macs / 1e6:.1f}M multiply-adds/image (one image)"
                    for name in STEP_PRESETS))
    ours, peer = STEP_PRESETS
    contenders = {ours: ours, UNFOLDED: ours, peer: peer, VIT_FOLDED: peer}  # column -> preset
    routes = {UNFOLDED: two_maps, VIT_FOLDED: folded_with_gradients}
    header = f"{'precision':<10}" + "".join(f"{name:>26}" for name in contenders)
    header += f"  {peer + ' / ' + ours:>38}{'two maps / folded':>19}{'vit folded / fused':>20}"
    print(header + "\n" + "-" * len(header))
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    for precision in ("fp32", "bf16"):
        steps = {}
        for column, name in contenders.items():
            torch.manual_seed(0)
            model = create_model(name).to(device).train()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            folding = routes.get(column, contextlib.nullcontext)()

            def step(model: nn.Module = model, optimizer: torch.optim.Optimizer = optimizer,
                     precision: str = precision,
                     folding: contextlib.AbstractContextManager = folding) -> None:
                with folding, autocast(precision, device):
                    loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            steps[column] = step
        best = alternate(steps, rounds, device)
        print(f"{precision:<10}" + "".join(f"{best[n] * 1e3:>24.1f}ms" for n in contenders)
              + f"{best[peer] / best[ours]:>39.2f}x{best[UNFOLDED] / best[ours]:>18.2f}x"
              + f"{best[VIT_FOLDED] / best[peer]:>19.2f}x", flush=True)
    print(f"({peer} / {ours} >= 1: the content model's step is no slower than the ViT's; "
          "two maps / folded: the fold's gain; vit folded / fused: the fused kernel's gain "
          "for the ViT)")


def add_timing_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """``--batch``, ``--rounds``, ``--threads`` and ``--device``, as this benchmark takes them."""
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")


def timing_device(args: argparse.Namespace) -> torch.device:
    """Set the threads, keep freed memory for reuse on a CPU (as ``attnconv train`` runs), print
    the machine; returns the device to time on."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cpu":
        reuse_freed_memory()
    print(machine_description(device))
    return device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="*", default=["layer", "steps"],
                        choices=["layer", "steps"])
    add_timing_arguments(parser, rounds=10)
    args = parser.parse_args(argv)
    device = timing_device(args)
    if "layer" in args.sections:
        layer_section(args.batch, args.rounds, device)
    if "steps" in args.sections:
        step_section(args.batch, args.rounds, device)


if __name__ == "__main__":
    main()

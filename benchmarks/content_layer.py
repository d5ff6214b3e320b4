"""The content layer on each of its routes, as it picks, and against ``scaled_dot_product_attention``
with the same relative bias, in every mode; the content model's training step against the plain
ViT's.

Part 1, ``layer``: the attention of ``learned-content-fashion`` (``w·r + q·k/√d``: 64 channels, 9
heads of 16, a 14×14 grid, batch 100) and of the paper's ``learned-content`` (400 channels, 9
heads of 400, 16×16, batch 100), in four modes, no-grad forward (what ``eval``, ``analyze`` and
``explore`` run) and forward+backward, each in float32 and under bfloat16 autocast:

- every exact route of its content kernel, pinned (``attention/content.py``): ``fused``, SDPA's
  fused kernel with the bias as a 4-D mask; ``folded, blocks of E``, the folded kernel with blocks
  of at most ``E`` entries of logits, for each block size measured (``block_budgets``) that cuts
  the batch differently;
- the layer as it picks: a fresh selector measures the routes on its first call (the untimed
  warm-up) and takes the fastest (``attention/routes.py``); the route it took is printed below;
- the peers: ``SDPA + bias``, the same projections, then ``F.scaled_dot_product_attention`` with
  the positional logits as a 4-D ``attn_mask`` (``sdpa_content.py``: the fused kernel where
  PyTorch has one for the mode, without gradients on a CPU; with a mask that needs one it runs its
  ``math`` kernel); ``previous``, the content path before the fused route and the blocks, the
  folded kernel in every mode with one block, the whole batch (as then, but for the bias gradient,
  summed over the batch in float32 where the old path summed in bfloat16, more slowly).

Ratios are that time over the layer's (> 1: the layer is faster); best of ``--rounds`` rounds in
which the contenders alternate, in one process. On a CPU the times are this process's CPU time
(steadier than wall-clock where other work shares the cores; with ``--threads 1`` the two agree
on an idle machine), with freed memory kept for reuse as ``attnconv train`` runs, and subnormal
numbers flushed for every contender. Targets: the route picked, timed pinned like the others,
within 5% of the fastest route, and the layer no slower than ``SDPA + bias`` (≥ 1.0×); where it
picks SDPA's kernel itself (``fused``) the two run the same kernel and the check is a tie within
the spread of runs (≥ ``SAME_KERNEL_TIE``).

Part 2, ``steps``: a training step (forward, cross-entropy, backward, SGD with momentum) of
``learned-content-fashion`` against ``vit-fashion`` (the plain ViT at similar multiply-adds) on
Fashion-shaped batches, float32 and bfloat16 autocast, alternating, best of ``--rounds``, each
model's attention on the routes its selector picks (printed); beside them the content model with
its BERT dense map applied after the output projection rather than folded into it
(``attention.layer.fold_pays``), the path before the fold.

    python benchmarks/content_layer.py --threads 1
    python benchmarks/content_layer.py --sections layer --sizes fashion --batch 20 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import random
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
from route_timing import (
    PICKED,
    ROUTE,
    candidates,
    measuring,
    pick_over_fastest,
    picks,
    pinned,
    print_table,
)
from sdpa_content import sdpa_forward_content

MODES = (("no-grad", "fp32"), ("no-grad", "bf16"), ("fwd+bwd", "fp32"), ("fwd+bwd", "bf16"))
STEP_PRESETS = ("learned-content-fashion", "vit-fashion")
# name: (channels, heads, head_dim, side): the content layers of learned-content-fashion and of
# the paper's learned-content
SIZES = {"fashion": (64, 9, 16, 14), "paper": (400, 9, 400, 16)}
PEERS = ("SDPA + bias", "previous")
SAME_KERNEL_TIE = 0.95
"""Where the layer picks its ``fused`` route it runs the peer's own kernel, SDPA with the bias as
mask, and the two times differ by the spread of runs alone (±5% here): the check is then that
the layer adds nothing beyond it."""


def content_layer(size: str, device: torch.device) -> MultiHeadSelfAttention2d:
    """The content layer of ``size`` (``SIZES``: ``w·r + q·k/√d``), seeded."""
    dim, heads, head_dim, side = SIZES[size]
    torch.manual_seed(0)
    return MultiHeadSelfAttention2d(
        dim, heads, head_dim=head_dim, positional="learned", content=True, max_size=side
    ).to(device)


def fashion_content_layer(device: torch.device) -> MultiHeadSelfAttention2d:
    """``learned-content-fashion``'s attention layer, seeded."""
    return content_layer("fashion", device)


def previous_forward(layer: MultiHeadSelfAttention2d, x: Tensor) -> Tensor:
    """``layer``'s output through the previous content path: the folded kernel in every mode, with
    one block, the whole batch."""
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
            value.to(dtype).contiguous(), bias.to(dtype), 0.0, float("inf"),
        )
    projection = (layer.out.weight, layer.out.bias)
    return layer._project_out(y.view(batch, layer.heads, height, width, -1), projection)


def alternate(runs: dict[str, Callable[[], None]], rounds: int,
              device: torch.device) -> dict[str, float]:
    """Best seconds of each run over ``rounds`` rounds in which they alternate (one warm-up each),
    in a new order each round (shuffled, seeded), so that no run follows the same one in every
    round, as it would in an order rotated by one for up to ``len(runs)`` rounds: what ran before
    can slow a run (the caches, the heap, the core's clock after the matrix unit). On a CPU this
    process's CPU time, which waiting for a core shared with other work does not inflate; on a GPU
    wall-clock time."""
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    names = list(runs)
    order = random.Random(0)
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
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


def layer_section(size: str, batch: int, rounds: int, device: torch.device
                  ) -> list[tuple[str, float, float, bool]]:
    """Print the content layer's table at ``size``; returns its target checks ``(name, value,
    target, higher_is_ok)``."""
    layer = content_layer(size, device)
    dim, heads, head_dim, side = SIZES[size]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, side, side, dim, generator=generator).to(device)
    grad = torch.randn(batch, side, side, dim, generator=generator).to(device)
    peers: dict[str, Callable[[Tensor], Tensor]] = {
        PEERS[0]: lambda x: sdpa_forward_content(layer, x)[0],
        PEERS[1]: lambda x: previous_forward(layer, x),
    }
    with torch.no_grad():
        expected = layer(x)
        for name, forward in peers.items():
            error = (forward(x) - expected).abs().max() / expected.abs().max()
            if error > 1e-4:
                raise AssertionError(f"{name} differs from the layer by {error:.1e} (relative)")
    times, picked = {}, {}
    with measuring():
        for mode, precision in MODES:

            def run(forward: Callable[[Tensor], Tensor], mode: str = mode,
                    precision: str = precision,
                    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                    ) -> Callable[[], None]:
                def call() -> None:
                    with context():
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

            names = candidates(run(layer))
            runs = {ROUTE + name: run(layer, context=lambda name=name: pinned(name))
                    for name in names}
            with picks() as chosen:
                runs[PICKED] = run(layer)
                runs |= {name: run(forward) for name, forward in peers.items()}
                times[mode, precision] = alternate(runs, rounds, device)
            picked[mode, precision] = chosen[-1]
    print_table(f"layer, {size}: learned-content attention (w·r + q·k/√d, {dim} channels, "
                f"{heads} heads of {head_dim}, {side}x{side} tokens), batch {batch}; best of "
                f"{rounds} alternating rounds", times, picked)
    checks = []
    for (mode, precision), best in times.items():
        label, ours = f"{size} {mode} {precision}", best[PICKED]
        checks.append((f"{label}: picked route / fastest",
                       pick_over_fastest(best, picked[mode, precision]), 1.05, False))
        if picked[mode, precision] == content.FUSED:  # the peer's own kernel: a tie
            checks.append((f"{label}: SDPA + bias / layer (same kernel)", best[PEERS[0]] / ours,
                           SAME_KERNEL_TIE, True))
        else:
            checks.append((f"{label}: SDPA + bias / layer", best[PEERS[0]] / ours, 1.0, True))
    return checks


UNFOLDED = "content, two maps"
"""The content model with its dense map applied after the output projection, as before the two
were folded into one (``attention.layer.fold_pays``): the fold's gain, measured alongside."""


def two_maps() -> contextlib.AbstractContextManager:
    """Every layer applies a following map after its output projection, never folded into it."""
    return mock.patch.object(layer_module, "fold_pays", lambda *args: False)


def step_section(batch: int, rounds: int, device: torch.device) -> None:
    costs = {name: preset_cost(name) for name in STEP_PRESETS}
    print(f"\nsteps: one training step (forward, cross-entropy, backward, SGD with momentum), "
          f"batch {batch} of Fashion-shaped images; best of {rounds} alternating rounds")
    print("  ".join(f"{name}: {costs[name].macs / 1e6:.1f}M multiply-adds/image (one image)"
                    for name in STEP_PRESETS))
    ours, peer = STEP_PRESETS
    contenders = {ours: ours, UNFOLDED: ours, peer: peer}  # column -> preset
    header = f"{'precision':<10}" + "".join(f"{name:>26}" for name in contenders)
    header += f"  {peer + ' / ' + ours:>38}{'two maps / folded':>19}"
    print(header + "\n" + "-" * len(header))
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
    for precision in ("fp32", "bf16"):
        steps, chosen = {}, {}
        for column, name in contenders.items():
            torch.manual_seed(0)
            model = create_model(name).to(device).train()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            folding = two_maps if column == UNFOLDED else contextlib.nullcontext
            chosen[column] = []

            def step(model: nn.Module = model, optimizer: torch.optim.Optimizer = optimizer,
                     precision: str = precision, folding: Callable = folding,
                     chosen: list[str] = chosen[column]) -> None:
                with folding(), picks() as picked, autocast(precision, device):
                    loss = F.cross_entropy(model(images), labels)
                chosen[:] = picked
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

            steps[column] = step
        with measuring():
            best = alternate(steps, rounds, device)
        print(f"{precision:<10}" + "".join(f"{best[n] * 1e3:>24.1f}ms" for n in contenders)
              + f"{best[peer] / best[ours]:>39.2f}x{best[UNFOLDED] / best[ours]:>18.2f}x",
              flush=True)
        print("  picked: " + "; ".join(f"{column}: {', '.join(dict.fromkeys(picked))}"
                                       for column, picked in chosen.items()))
    print(f"({peer} / {ours} >= 1: the content model's step is no slower than the ViT's; "
          "two maps / folded: the fold's gain)")


def add_timing_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """``--batch``, ``--rounds``, ``--threads`` and ``--device``, as this benchmark takes them."""
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")


def timing_device(args: argparse.Namespace) -> torch.device:
    """Set the threads, keep freed memory for reuse on a CPU (as ``attnconv train`` runs), flush
    subnormal numbers (for every contender alike), print the machine; returns the device to time
    on."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cpu":
        reuse_freed_memory()
    torch.set_flush_denormal(True)
    print(machine_description(device))
    return device


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="*", default=["layer", "steps"],
                        choices=["layer", "steps"])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES),
                        help="layer: the content layers to time")
    add_timing_arguments(parser, rounds=10)
    args = parser.parse_args(argv)
    device = timing_device(args)
    checks = []
    if "layer" in args.sections:
        for size in args.sizes:
            checks += layer_section(size, args.batch, args.rounds, device)
    if "steps" in args.sections:
        step_section(args.batch, args.rounds, device)
    if checks:
        print("\nTargets:")
        for name, value, target, higher in checks:
            verdict = "met" if (value >= target if higher else value <= target) else "NOT met"
            print(f"  {name:<56} {value:6.2f}x  (target {'>=' if higher else '<='} {target}x)  "
                  f"{verdict}")


if __name__ == "__main__":
    main()

"""``record_attention``: every layer's attention probabilities of a third-party vision transformer,
read with forward hooks during one ordinary forward pass.

The model is not edited: hooks are registered on submodules its forward calls anyway, and removed
afterwards (also after an error), so its output is the same as without them (tested). Where a
model never forms the probabilities as a tensor (fused attention: ``scaled_dot_product_attention``
gets queries and keys and returns the output), the hooks take the queries and keys the model
computed and form ``softmax(q kᵀ · scale)`` from them, as the fused kernel does.

Known families (``FAMILIES``):

* timm's ``VisionTransformer`` (ViT, DeiT, DeiT distilled; with or without class, distillation and
  register tokens; fused attention or not): the blocks' ``Attention`` modules, reading ``q`` and
  ``k`` at the outputs of their ``q_norm`` / ``k_norm`` (identities without QK normalisation).
* timm's ``ConVit``: GPSA blocks, whose attention is ``(1 − σ(λ_h))·softmax(content) +
  σ(λ_h)·softmax(position)`` renormalised, and the later MHSA blocks (after the class token is
  added): the probabilities as they enter each block's ``attn_drop``.
* torchvision's ``VisionTransformer``: each encoder block's ``nn.MultiheadAttention``, reading its
  input and forming ``q`` and ``k`` from its ``in_proj`` weights.

Tokens: the non-patch tokens (class, distillation, register) come first, then the ``h × w``
patches in row-major order, in every family; ``Recording.prefix_tokens`` says how many there are
in each layer (ConViT's first layers have none).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.errors import UserError
from attnconv.models.modes import evaluating

FAMILIES: dict[str, str] = {
    "timm-vit": "timm VisionTransformer (ViT, DeiT; class, distillation and register tokens)",
    "timm-convit": "timm ConVit (GPSA and MHSA blocks)",
    "torchvision-vit": "torchvision VisionTransformer",
}


@dataclass
class Recording:
    """Attention recorded from one forward pass of a model on ``B`` images.

    Attributes:
        probs: one tensor per layer, ``(B, heads, T, T)`` float32 on the CPU, rows are queries
            and sum to one; ``T = prefix_tokens[layer] + h·w``.
        prefix_tokens: per layer, the tokens before the patches (class, distillation, register).
        grid: the patch grid ``(h, w)``.
        patch_size: input pixels per patch side.
        family: a key of ``FAMILIES``.
        output: what the model returned for the images.
        class_token: whether the first prefix token is a class token (timm's ViTs without one
            may still have register tokens).
    """

    probs: list[Tensor]
    prefix_tokens: list[int]
    grid: tuple[int, int]
    patch_size: int
    family: str
    output: Tensor
    class_token: bool = True


def _library_classes(model: nn.Module) -> set[str]:
    """``"timm"`` and/or ``"torchvision"`` when a class of ``model``'s hierarchy comes from them."""
    return {
        cls.__module__.split(".")[0]
        for cls in type(model).__mro__
        if cls.__module__.split(".")[0] in ("timm", "torchvision")
    }


def model_family(model: nn.Module) -> str:
    """The ``FAMILIES`` key of ``model``; UserError naming the known families otherwise."""
    libraries = _library_classes(model)
    if "timm" in libraries:
        from attnconv.analysis.third_party import import_timm

        timm = import_timm()
        if isinstance(model, timm.models.vision_transformer.VisionTransformer):
            return "timm-vit"
        if isinstance(model, timm.models.convit.ConVit):
            return "timm-convit"
    if "torchvision" in libraries:
        from attnconv.analysis.third_party import import_torchvision

        if isinstance(model, import_torchvision().models.VisionTransformer):
            return "torchvision-vit"
    hint = (
        "; attnconv's own models: attnconv.viz.maps.compute_attention"
        if hasattr(model, "attention_layers")
        else ""
    )
    raise UserError(
        f"cannot record the attention of a {type(model).__module__}.{type(model).__name__}: "
        f"known families are {', '.join(FAMILIES.values())}{hint}"
    )


def patch_size_of(model: nn.Module, family: str) -> tuple[int, int]:
    """``(height, width)`` in pixels of one patch of ``model``."""
    if family == "torchvision-vit":
        return int(model.patch_size), int(model.patch_size)
    size = model.patch_embed.patch_size
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _softmax_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``softmax(q kᵀ · scale)`` in float32: ``(B, heads, T, d)`` twice → ``(B, heads, T, T)``."""
    return torch.softmax((q.float() * scale) @ k.float().transpose(-1, -2), dim=-1)


Hook = torch.utils.hooks.RemovableHandle


def _timm_vit_hooks(model: nn.Module, store: Callable[[int, Tensor], None]) -> list[Hook]:
    from attnconv.analysis.third_party import import_timm

    attention_class = import_timm().layers.Attention
    hooks: list[Hook] = []
    for index, block in enumerate(model.blocks):
        attention = getattr(block, "attn", None)
        if type(attention) is not attention_class:
            raise UserError(
                f"block {index} of this timm VisionTransformer has "
                f"{type(attention).__name__ if attention is not None else 'no attn'} attention; "
                f"record_attention knows timm's Attention (timm.layers.Attention)"
            )
        queries: dict[str, Tensor] = {}

        def keep_query(_module, _args, q, queries=queries) -> None:
            queries["q"] = q

        def record(_module, _args, k, queries=queries, index=index, scale=attention.scale):
            store(index, _softmax_scores(queries.pop("q"), k, scale))

        hooks.append(attention.q_norm.register_forward_hook(keep_query))
        hooks.append(attention.k_norm.register_forward_hook(record))
    return hooks


def _timm_convit_hooks(model: nn.Module, store: Callable[[int, Tensor], None]) -> list[Hook]:
    hooks = []
    for index, block in enumerate(model.blocks):

        def record(_module, args, index=index) -> None:
            store(index, args[0].float())

        hooks.append(block.attn.attn_drop.register_forward_pre_hook(record))
    return hooks


def _torchvision_vit_hooks(model: nn.Module, store: Callable[[int, Tensor], None]) -> list[Hook]:
    hooks = []
    for index, block in enumerate(model.encoder.layers):
        attention = block.self_attention
        if not (attention._qkv_same_embed_dim and attention.batch_first):
            raise UserError(
                f"encoder block {index}'s MultiheadAttention is not the torchvision "
                f"VisionTransformer's (one in_proj, batch_first)"
            )

        def record(module, args, index=index) -> None:
            x = args[0]  # (B, T, E), the query input (the block passes x, x, x)
            batch, tokens, width = x.shape
            heads = module.num_heads
            d = width // heads
            weight, bias = module.in_proj_weight, module.in_proj_bias
            q = F.linear(x, weight[:width], None if bias is None else bias[:width])
            k = F.linear(
                x, weight[width : 2 * width], None if bias is None else bias[width : 2 * width]
            )
            q, k = (t.view(batch, tokens, heads, d).transpose(1, 2) for t in (q, k))
            store(index, _softmax_scores(q, k, 1 / math.sqrt(d)))

        hooks.append(attention.register_forward_pre_hook(record))
    return hooks


_HOOKS = {
    "timm-vit": _timm_vit_hooks,
    "timm-convit": _timm_convit_hooks,
    "torchvision-vit": _torchvision_vit_hooks,
}


@torch.no_grad()
def record_attention(model: nn.Module, images: Tensor) -> Recording:
    """Every layer's attention probabilities of ``model`` on ``images``, and the patch grid.

    ``model``: one of the ``FAMILIES`` (UserError naming them otherwise). ``images``: float
    ``(B, C, H, W)`` as the model takes them (normalised with its mean and std), ``H`` and ``W``
    multiples of its patch size. The forward runs in eval mode (no dropout; each submodule's mode
    is restored afterwards) without gradients; the hooks are removed afterwards.
    """
    family = model_family(model)
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise UserError(
            "images must be a float tensor (B, C, H, W), got "
            + (
                f"shape {tuple(images.shape)} {images.dtype}"
                if isinstance(images, Tensor)
                else type(images).__name__
            )
        )
    patch = patch_size_of(model, family)
    height, width = images.shape[2:]
    if height % patch[0] or width % patch[1]:
        raise UserError(
            f"images are {height}x{width}, not a whole number of {patch[0]}x{patch[1]} patches"
        )
    if patch[0] != patch[1]:
        raise UserError(f"patches of {patch[0]}x{patch[1]} pixels: only square patches are known")
    grid = (height // patch[0], width // patch[1])
    recorded: dict[int, Tensor] = {}

    def store(index: int, probs: Tensor) -> None:
        recorded[index] = probs.detach().float().cpu()

    hooks = _HOOKS[family](model, store)
    try:
        with evaluating(model):
            output = model(images.to(next(model.parameters()).device))
    finally:
        for hook in hooks:
            hook.remove()
    probs = [recorded[index] for index in sorted(recorded)]
    patches = grid[0] * grid[1]
    prefix = [p.shape[-1] - patches for p in probs]
    if not probs or min(prefix) < 0:
        raise UserError(
            f"recorded {len(probs)} layers whose token counts {[p.shape[-1] for p in probs]} do "
            f"not hold the {grid[0]}x{grid[1]} patch grid"
        )
    class_token = family != "timm-vit" or bool(getattr(model, "has_class_token", True))
    return Recording(probs, prefix, grid, patch[0], family, output, class_token)

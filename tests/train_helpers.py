"""Overrides that make a training run take a second: a one-block, 16-wide model, no TensorBoard or
progress bar, float32 on the CPU (runs compared with float32 arithmetic, whatever "auto" picks)."""

TINY = [
    "model.hidden=16",
    "model.depth=1",
    "model.heads=2",
    "model.head_dim=8",
    "model.mlp_dim=32",
    "batch_size=64",
]
QUIET = ["tensorboard=false", "progress=false", "device=cpu", "precision=fp32"]

"""Training: config, learning-rate schedules, checkpoints, the loop and multi-GPU.

    from attnconv.train import load_model, resolve_config, train
    summary = train(resolve_config("quick"), "runs/quick")     # what `attnconv train` does
    model, checkpoint = load_model("runs/quick/checkpoints/best.pt")

``load_model``, ``load_checkpoint`` and ``save_checkpoint`` are ``attnconv.models.checkpoint``'s.
"""

from attnconv.models.checkpoint import load_checkpoint, load_model, save_checkpoint
from attnconv.train.config import TrainConfig, resolve_config
from attnconv.train.loop import NonFiniteLossError, train
from attnconv.train.schedule import LRSchedule, build_schedule

__all__ = [
    "LRSchedule",
    "NonFiniteLossError",
    "TrainConfig",
    "build_schedule",
    "load_checkpoint",
    "load_model",
    "resolve_config",
    "save_checkpoint",
    "train",
]

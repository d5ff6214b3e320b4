r"""Learning-rate schedules, as pure functions of the step index: stepped every iteration (the
default) or once per epoch (the original code's).

Step $s$ (0-based) is the $s$-th optimizer update; $\text{lr}(s)$ is the rate that update uses. With
$T$ total steps and $W = \lceil \text{warmup\_fraction} \cdot T \rceil$ warm-up steps:

* warm-up (both schedules): $\text{lr}(s) = \text{base} \cdot (s + 1) / W$ for $s < W$, so the very
  first update already has a positive rate (no zero-rate epoch);
* ``cosine``:
  $\text{lr}(s) = \text{base} \cdot \frac12 \left(1 + \cos \frac{\pi (s - W)}{T - W}\right)$ for
  $s \ge W$: the full rate at the end of the warm-up, decaying to (nearly, never exactly) zero at
  the last step;
* ``step``: $\text{lr}(s) = \text{base} \cdot 0.1^k$ with $k$ the number of milestones $m$ (in
  epochs) such that the update's epoch $\lfloor s / \text{steps\_per\_epoch} \rfloor \ge m$ (the
  rate drops at the start of epoch $m + 1$, 1-based), times the warm-up ramp if any.

``stepping="epoch"`` is how the paper's code steps its rate (epfml/attention-cnn: ``train.py`` at
commit 777e7e81e72ec95bd438c054d8a1163ee90b7e67 calls ``scheduler.step(global_step)`` once, at the
start of each epoch; ``utils/learning_rate.py`` at aad75f39ee9fa6c06166ed870c53f84e3f4b0fe7 ramps
by ``step / T_warmup`` with ``T_warmup = int(ratio · T_max)``): every update of epoch $e$ uses the
rate of its first step $s_e = e \cdot \text{steps\_per\_epoch}$, with the warm-up ramp
$s_e / W$ and $W = \lfloor \text{warmup\_fraction} \cdot T \rfloor$. Epoch 0 so trains at rate 0
(the weights do not move; SGD's momentum buffer, AdamW's moments and normalisation statistics do),
and the warm-up rises in epoch-wide stairs (15 of them at the paper's 5% of 300 epochs). One
difference: the original's ``T_max`` counts ``N // B + 1`` batches an epoch, one more than it runs
when $B$ divides $N$; here $T$ counts the steps the run makes.

Being a function of the step alone, the schedule resumes exactly from a checkpoint's step count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEP_FACTOR = 0.1
SCHEDULES = ("cosine", "step")
STEPPINGS = ("step", "epoch")


@dataclass(frozen=True)
class LRSchedule:
    """``lr(step)`` for ``kind`` in ``SCHEDULES``, changed every step or, with
    ``stepping="epoch"``, held over each epoch; see the module docstring."""

    kind: str
    base_lr: float
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int
    milestones: tuple[int, ...] = ()
    stepping: str = "step"

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule kind must be one of {SCHEDULES}, got {self.kind!r}")
        if self.stepping not in STEPPINGS:
            raise ValueError(f"stepping must be one of {STEPPINGS}, got {self.stepping!r}")
        if self.total_steps < 1 or self.steps_per_epoch < 1:
            raise ValueError(
                f"a schedule needs >= 1 step per epoch and in all, got steps_per_epoch="
                f"{self.steps_per_epoch}, total_steps={self.total_steps}"
            )
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(
                f"warmup_steps must be in [0, {self.total_steps}], got {self.warmup_steps}"
            )

    def __call__(self, step: int) -> float:
        """The learning rate of update ``step`` (0-based)."""
        if not 0 <= step < self.total_steps:
            raise ValueError(f"step must be in [0, {self.total_steps}), got {step}")
        factor = 1.0
        if self.stepping == "epoch":
            step -= step % self.steps_per_epoch  # the epoch's first step
            if step < self.warmup_steps:
                factor = step / self.warmup_steps
        elif step < self.warmup_steps:
            factor = (step + 1) / self.warmup_steps
        if self.kind == "cosine":
            if step >= self.warmup_steps:
                progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
                factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            epoch = step // self.steps_per_epoch
            factor *= STEP_FACTOR ** sum(epoch >= m for m in self.milestones)
        return self.base_lr * factor


def build_schedule(
    kind: str,
    base_lr: float,
    epochs: int,
    steps_per_epoch: int,
    warmup_fraction: float,
    milestones: tuple[int, ...] = (),
    stepping: str = "step",
) -> LRSchedule:
    """The schedule of a run of ``epochs`` epochs of ``steps_per_epoch`` updates each, stepped
    every update or, with ``stepping="epoch"``, held over each epoch (the module docstring)."""
    total = epochs * steps_per_epoch
    warmup = round(warmup_fraction * total, 9)  # 0.07·100 = 7.000…01
    return LRSchedule(
        kind=kind,
        base_lr=base_lr,
        total_steps=total,
        steps_per_epoch=steps_per_epoch,
        warmup_steps=math.floor(warmup) if stepping == "epoch" else math.ceil(warmup),
        milestones=tuple(milestones) if kind == "step" else (),
        stepping=stepping,
    )

"""The run logger: console lines, metrics.jsonl, TensorBoard scalars and the optional figure."""

import json

import pytest

from attnconv.models import create_model
from attnconv.runs import RunDir
from attnconv.train.logger import RunLogger, format_record

RECORD = {"epoch": 1, "step": 10, "lr": 0.05, "train_loss": 2.0, "train_acc": 0.25,
          "val_loss": 1.5, "val_acc": 0.5, "epoch_time_s": 2.0, "images_per_s": 320.0}


def events(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0}).Reload()


def test_without_a_figure_callback_only_scalars_are_logged(tmp_path) -> None:
    model = create_model("quick")
    logger = RunLogger(RunDir(tmp_path), 3, enabled=True, tensorboard=True)
    logger.epoch(RECORD, model, (8, 8))
    logger.metrics([RECORD])
    logger.close()
    logged = events(tmp_path)
    assert logged.Tags()["images"] == []
    assert [e.value for e in logged.Scalars("accuracy/val")] == [0.5]
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        RECORD
    ]


@pytest.mark.parametrize("model", ["quick", "resnet18"])
def test_the_figure_callback_sees_attention_models_in_eval_mode(tmp_path, model) -> None:
    import matplotlib.pyplot as plt

    calls = []

    def figure(net, image_size):
        calls.append((net.training, image_size))
        return plt.figure(figsize=(1, 1))

    net = create_model(model).train()
    logger = RunLogger(RunDir(tmp_path), 3, enabled=True, tensorboard=True, figure=figure)
    logger.epoch(RECORD, net, (8, 8))
    logger.close()
    has_attention = model == "quick"
    assert calls == ([(False, (8, 8))] if has_attention else [])
    assert net.training  # the mode is restored
    logged = events(tmp_path)
    assert logged.Tags()["images"] == (["attention"] if has_attention else [])
    if has_attention:
        assert [e.step for e in logged.Images("attention")] == [1]


def test_format_record() -> None:
    line = format_record(RECORD, 3)
    assert line == (
        "epoch 1/3  train loss 2.0000 acc 0.2500 | val loss 1.5000 acc 0.5000 | lr 0.05 | "
        "320 img/s, 2.0s"
    )

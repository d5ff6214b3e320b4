"""fold.py compares like with like: the folded and the two-map step train the same way."""

from __future__ import annotations

import re

import torch

import content_layer
import fold
from attnconv.attention import layer as layer_module


def test_the_folded_and_the_two_map_steps_reach_the_same_weights() -> None:
    """One SGD step each from the same start on the same batch of 3 images (588 pixels, more than
    the 145 at which the dense map folds): the weights agree to float32 rounding."""
    models = []
    for folds in (True, False):
        model, step = fold.training_step("learned-content-fashion", 3, folds, torch.device("cpu"))
        block = model.blocks[0]
        assert layer_module.fold_pays(block.attention.out, block.attention_dense, 3 * 14 * 14)
        step()
        models.append(dict(model.named_parameters()))
    folded, two_maps = models
    assert folded.keys() == two_maps.keys()
    for name, param in folded.items():
        torch.testing.assert_close(param, two_maps[name], rtol=1e-5, atol=1e-6, msg=name)


def test_fold_benchmark_prints_both_times_and_their_ratio(monkeypatch, capsys) -> None:
    monkeypatch.setattr(content_layer, "reuse_freed_memory", lambda: True)  # not in the tests
    threads = torch.get_num_threads()
    try:
        fold.main(["--presets", "quick", "learned-content-fashion", "--batch", "2",
                   "--rounds", "1", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU ")
    for preset in ("quick", "learned-content-fashion"):
        [line] = [line for line in lines if line.split()[0] == preset]
        assert len(re.findall(r"\d+\.\dms", line)) == 2 and re.search(r"\d+\.\d\dx$", line)

"""Gaussian head geometry, degenerate heads, pruning, and `attnconv heads CHECKPOINT`."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from attnconv import cli
from attnconv.models import ImageTransformer, create_model
from attnconv.models.checkpoint import save_checkpoint
from attnconv.models.heads import (
    MIN_SPREAD,
    find_degenerate_heads,
    head_table,
    prune_degenerate_heads,
)
from attnconv.models.presets import TCNN_FASHION_LAYERS, preset_arguments

CONFIG = {"hidden": 16, "depth": 2, "heads": 4, "mlp_dim": 16, "image_size": (12, 12)}


def generalized_model() -> ImageTransformer:
    """Layer 0: S = diag(2, 0.5) (condition 16), S = diag(1, 0.02) (condition 2500: a line),
    S = 0.01·I (spread 0.01: uniform), a rotated S. Layer 1: paper initialisation, S ≈ I."""
    torch.manual_seed(0)
    model = create_model("quadratic-generalized", **CONFIG)
    angle = 0.3
    rotation = torch.tensor(
        [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]]
    )
    with torch.no_grad():
        layer = model.attention_layers()[0]
        layer.position.spread.copy_(
            torch.stack(
                [
                    torch.diag(torch.tensor([2.0, 0.5])),
                    torch.diag(torch.tensor([1.0, 0.02])),
                    0.01 * torch.eye(2),
                    rotation @ torch.diag(torch.tensor([3.0, 1.0])),
                ]
            )
        )
        layer.position.centers.copy_(
            torch.tensor([[1.0, -2.0], [0.5, 0.25], [0.0, 0.0], [-3.0, 1.5]])
        )
    return model


def test_head_table_generalized():
    rows = head_table(generalized_model())
    assert len(rows) == 8
    assert [(r["layer"], r["head"]) for r in rows] == [
        (layer, h) for layer in (0, 1) for h in range(4)
    ]
    first = rows[:4]
    # Σ = (S Sᵀ)⁻¹: spread = det(Σ)^(-1/4) = sqrt|det S|; condition = (σmax(S)/σmin(S))².
    expected_spread = [1.0, math.sqrt(0.02), 0.01, math.sqrt(3.0)]
    expected_condition = [16.0, 2500.0, 1.0, 9.0]
    for row, spread, condition in zip(first, expected_spread, expected_condition, strict=True):
        assert row["spread"] == pytest.approx(spread, rel=1e-4)
        assert row["condition_number"] == pytest.approx(condition, rel=1e-3)
    assert [(r["center_row"], r["center_col"]) for r in first] == [
        (1.0, -2.0),
        (0.5, 0.25),
        (0.0, 0.0),
        (-3.0, 1.5),
    ]
    assert [r["degenerate"] for r in rows] == [False, True, True, False] + [False] * 4
    for row in rows[4:]:  # paper initialisation: S = I + N(0, 0.01²)
        assert row["spread"] == pytest.approx(1.0, abs=0.05)
        assert row["condition_number"] == pytest.approx(1.0, abs=0.2)


def test_head_table_isotropic():
    torch.manual_seed(0)
    model = create_model("quadratic", **CONFIG)
    with torch.no_grad():
        model.attention_layers()[1].position.spread.copy_(torch.tensor([0.5, 0.04, 3.0, -2.0]))
    rows = head_table(model)
    layer1 = [r for r in rows if r["layer"] == 1]
    assert [r["spread"] for r in layer1] == pytest.approx([0.5, 0.04, 3.0, 2.0], rel=1e-5)
    assert all(r["condition_number"] == pytest.approx(1.0) for r in rows)
    assert find_degenerate_heads(model) == {1: [1]}
    assert find_degenerate_heads(model, min_spread=0.6) == {1: [0, 1]}


def test_find_degenerate_heads_thresholds():
    model = generalized_model()
    assert find_degenerate_heads(model) == {0: [1, 2]}
    assert find_degenerate_heads(model, max_condition=10.0) == {0: [0, 1, 2]}
    assert find_degenerate_heads(model, min_spread=0.001, max_condition=1e4) == {}


def test_prune_removes_exactly_the_degenerate_heads():
    model = generalized_model().eval()
    reference = copy.deepcopy(model)
    # Removing a head removes its term Σ_k P^h X W^h_out: zero those columns of `out`.
    with torch.no_grad():
        out = reference.attention_layers()[0].out
        d = reference.attention_layers()[0].head_dim
        for head in (1, 2):
            out.weight[:, head * d : (head + 1) * d] = 0
    x = torch.rand(3, 3, 12, 12)
    summary = prune_degenerate_heads(model)
    assert summary.removed == {0: [1, 2]} and summary.heads == [2, 4]
    assert model.heads_per_layer() == [2, 4]
    removed_params = 2 * (16 * 16 + 2 + 4)  # per head: out columns, centre, S
    assert summary.parameters_before - summary.parameters_after == removed_params
    assert "pruned 2 degenerate head(s)" in str(summary)
    torch.testing.assert_close(model(x), reference(x), rtol=1e-5, atol=1e-6)
    kept = [r for r in head_table(model) if r["layer"] == 0]
    assert [(r["center_row"], r["center_col"]) for r in kept] == [(1.0, -2.0), (-3.0, 1.5)]
    # The pruned architecture is rebuilt from the per-layer head counts (checkpoint loading).
    rebuilt = create_model(
        "quadratic-generalized-pruned", **{**CONFIG, "heads": summary.heads}
    ).eval()
    rebuilt.load_state_dict(model.state_dict())
    torch.testing.assert_close(rebuilt(x), model(x))
    # Nothing left to prune.
    assert prune_degenerate_heads(model).removed == {}


def test_prune_refuses_to_empty_a_layer():
    torch.manual_seed(0)
    model = create_model("quadratic", **CONFIG)
    with torch.no_grad():
        model.attention_layers()[1].position.spread.fill_(0.001)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="all 4 heads of attention layer 1 are degenerate"):
        prune_degenerate_heads(model)
    assert model.heads_per_layer() == [4, 4]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_non_gaussian_models_are_refused():
    with pytest.raises(ValueError, match=r"needs Gaussian attention.*learned"):
        head_table(create_model("learned", **CONFIG))
    with pytest.raises(ValueError, match="no attention layers"):
        find_degenerate_heads(create_model("resnet18", widths=(4, 4, 4, 4)))


def write_checkpoint(path, model, preset="quadratic-generalized"):
    save_checkpoint(
        {
            "preset": preset,
            "dataset": "cifar10",
            "architecture": "image_transformer",
            "arguments": preset_arguments(preset, **CONFIG)[1],
            "model": model.state_dict(),
            "epoch": 7,
        },
        path,
    )


def test_heads_command(tmp_path, capsys):
    path = tmp_path / "run.pt"
    write_checkpoint(path, generalized_model())
    assert cli.main(["heads", str(path)]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()]
    table = [cells for cells in lines if len(cells) == 7 and cells[0].isdigit()]
    assert len(table) == 8
    layer, head, row, col, spread, condition, degenerate = table[1]
    assert (layer, head, float(row), float(col), degenerate) == ("0", "1", 0.5, 0.25, "yes")
    assert float(spread) == pytest.approx(math.sqrt(0.02), abs=1e-4)
    assert float(condition) == pytest.approx(2500, rel=1e-2)
    assert [cells[-1] for cells in table] == ["no", "yes", "yes", "no", "no", "no", "no", "no"]
    assert "2 of 8 heads degenerate" in out and "epoch 7" in out
    assert cli.main(["heads", str(path), "--max-condition", "10"]) == 0
    assert "3 of 8 heads degenerate" in capsys.readouterr().out


def test_heads_command_bad_input(tmp_path, capsys):
    assert cli.main(["heads", str(tmp_path / "missing.pt")]) == 2
    assert "missing.pt" in capsys.readouterr().err
    learned = tmp_path / "learned.pt"
    write_checkpoint(learned, create_model("learned", **CONFIG), preset="learned")
    assert cli.main(["heads", str(learned)]) == 2
    assert "needs Gaussian attention" in capsys.readouterr().err


def test_heads_of_a_run_folder_are_those_of_its_best_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert cli.main(["heads", str(run)]) == 2
    assert (
        f"run folder {run} has no {run / 'checkpoints' / 'best.pt'} yet" in capsys.readouterr().err
    )
    torch.manual_seed(1)
    write_checkpoint(
        run / "checkpoints" / "last.pt", create_model("quadratic-generalized", **CONFIG)
    )
    assert cli.main(["heads", str(run)]) == 2
    assert f"give {run / 'checkpoints' / 'last.pt'} for its newest state" in capsys.readouterr().err
    write_checkpoint(run / "checkpoints" / "best.pt", generalized_model())
    assert cli.main(["heads", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run / 'checkpoints' / 'best.pt'}: preset quadratic-generalized")
    assert "2 of 8 heads degenerate" in out  # generalized_model's, not last.pt's (none)
    assert cli.main(["heads", str(tmp_path)]) == 2
    assert "is a folder but not a run folder" in capsys.readouterr().err


def test_heads_of_a_shipped_model_are_its_weights(capsys):
    from attnconv.models.pretrained import pretrained_checkpoint

    assert cli.main(["heads", "--pretrained", "quadratic-fashion"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("quadratic-fashion (shipped weights)")
    rows = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    weights = pretrained_checkpoint("quadratic-fashion")["model"]  # the shipped file's tensors
    assert len(rows) == 4 * 9
    for layer, head, row, col, spread, condition, degenerate in rows:
        centers = weights[f"blocks.{layer}.attention.position.centers"][int(head)]
        assert (float(row), float(col)) == pytest.approx(centers.tolist(), abs=5e-4)
        # isotropic: the covariance is I / s², so its geometric-mean inverse std is |s|
        s = weights[f"blocks.{layer}.attention.position.spread"][int(head)].abs().item()
        assert float(spread) == pytest.approx(s, abs=5e-5)
        assert float(condition) == pytest.approx(1.0, abs=1e-3)
        assert degenerate == ("yes" if s < MIN_SPREAD else "no")
    assert cli.main(["heads", "--pretrained", "resnet-fashion"]) == 2
    assert "ResNet has no attention layers" in capsys.readouterr().err


# ---------------------------------------------------------------------------- transformed networks


def test_transformed_head_table_and_layer_summary():
    from attnconv.models.checkpoint import build_model
    from attnconv.models.heads import transformed_head_table, transformed_layer_summary
    from viz_helpers import transformed_checkpoint

    model = build_model(transformed_checkpoint())
    rows = transformed_head_table(model)
    names = list(model.transformed_layers())
    assert len(names) == 8 and len(rows) == 8 * 9
    taps = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]  # head i·3 + j on tap (i, j)
    for row in rows:
        layer, head = row["layer"], row["head"]
        shift = (0.1 * (layer + 1), -0.05 * head)  # what transformed_checkpoint moved it by
        assert row["name"] == names[layer]
        assert (row["tap_row"], row["tap_col"]) == taps[head]
        assert row["center_row"] == pytest.approx(taps[head][0] + shift[0], abs=1e-6)
        assert row["center_col"] == pytest.approx(taps[head][1] + shift[1], abs=1e-6)
        assert row["moved"] == pytest.approx(math.hypot(*shift), abs=1e-6)
        assert row["spread"] == pytest.approx(3.0 - 0.1 * head, abs=1e-6)
        assert row["std"] == pytest.approx(1 / (3.0 - 0.1 * head), abs=1e-6)
        assert row["gate"] == pytest.approx(0.1 * head, abs=1e-6)
    summary = transformed_layer_summary(rows)
    assert [s["name"] for s in summary] == names
    for layer, s in enumerate(summary):
        moved = [math.hypot(0.1 * (layer + 1), 0.05 * h) for h in range(9)]
        assert s["heads"] == 9
        assert s["mean_moved"] == pytest.approx(sum(moved) / 9, abs=1e-6)
        assert s["max_moved"] == pytest.approx(moved[-1], abs=1e-6)
        assert s["mean_spread"] == pytest.approx(3.0 - 0.4, abs=1e-6)
        assert s["mean_gate"] == pytest.approx(0.4, abs=1e-6)
    with pytest.raises(ValueError, match="ImageTransformer is not a transformed network"):
        transformed_head_table(generalized_model())


def test_heads_command_on_a_transformed_network(tmp_path, capsys):
    from viz_helpers import transformed_checkpoint

    path = tmp_path / "tcnn.pt"
    save_checkpoint(transformed_checkpoint(), path)
    assert cli.main(["heads", str(path), "--images", "0"]) == 0  # the geometry alone
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: preset tcnn-fashion-small, epoch 3\n")
    lines = [line.split() for line in out.splitlines()]
    heads = [cells for cells in lines if len(cells) == 10 and cells[0].isdigit()]
    assert len(heads) == 8 * 9
    layer, head, tap_row, tap_col, row, col, moved, spread, std, gate = heads[9 + 5]
    assert (layer, head, tap_row, tap_col) == ("1", "5", "+0", "+1")
    assert (float(row), float(col)) == pytest.approx((0.2, 1 - 0.25), abs=5e-4)
    assert float(moved) == pytest.approx(math.hypot(0.2, 0.25), abs=5e-4)
    assert (float(spread), float(std), float(gate)) == pytest.approx((2.5, 0.4, 0.5), abs=5e-4)
    layers = [cells for cells in lines if len(cells) == 7 and cells[0].isdigit()]
    assert [cells[1] for cells in layers] == list(TCNN_FASHION_LAYERS)
    mean_moved = sum(math.hypot(0.8, 0.05 * h) for h in range(9)) / 9
    assert float(layers[7][3]) == pytest.approx(mean_moved, abs=5e-4)
    assert float(layers[7][6]) == pytest.approx(0.4, abs=5e-4)  # mean gate
    assert cli.main(["heads", str(path), "--min-spread", "0.1", "--images", "0"]) == 2
    err = capsys.readouterr().err
    assert "--min-spread: for Gaussian attention models" in err and err.count("\n") == 1


def test_heads_command_on_the_transform_itself_says_every_head_is_on_its_tap(tmp_path, capsys):
    from viz_helpers import transformed_checkpoint

    path = tmp_path / "transformed.pt"
    save_checkpoint(transformed_checkpoint(moved=False), path)
    assert cli.main(["heads", str(path), "--images", "0"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    heads = [cells for cells in lines if len(cells) == 10 and cells[0].isdigit()]
    assert {(cells[6], cells[7], cells[9]) for cells in heads} == {("0.000", "3.000", "0.000")}
    assert all(float(c[2]) == float(c[4]) and float(c[3]) == float(c[5]) for c in heads)


def test_heads_of_a_grid_started_model_say_how_far_each_moved_from_its_tap(tmp_path, capsys):
    arguments = {"num_classes": 3, "in_channels": 1, "image_size": (8, 8), "mean": (0.5,),
                 "std": (0.2,), "stem": 1, "hidden": 8, "depth": 2, "heads": 9, "mlp_dim": 8,
                 "positional_init": "grid"}  # fmt: skip
    model = ImageTransformer(**arguments)
    with torch.no_grad():
        model.blocks[1].attention.position.centers[4] = torch.tensor([0.6, -0.8])  # 1.0 away
    rows = head_table(model)
    assert [round(r["moved"], 6) for r in rows] == [0.0] * 13 + [1.0] + [0.0] * 4
    save_checkpoint({"preset": "quadratic", "dataset": "digits", "architecture":
                     "image_transformer", "arguments": arguments, "model": model.state_dict()},
                    tmp_path / "grid.pt")  # fmt: skip
    assert cli.main(["heads", str(tmp_path / "grid.pt")]) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    assert [float(cells[-1]) for cells in table] == [r["moved"] for r in rows]
    assert "mean distance moved, tokens: layer 0 0.000, layer 1 0.111" in out


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--min-spread", "nan", "a finite number in (0, 1000000]"),
        ("--min-spread", "-1", "a finite number in (0, 1000000]"),
        ("--min-spread", "0", "a finite number in (0, 1000000]"),
        ("--min-spread", "inf", "a finite number in (0, 1000000]"),
        ("--max-condition", "nan", "a finite number in [1, 10**15]"),
        ("--max-condition", "0.5", "a finite number in [1, 10**15]"),
        ("--max-condition", "inf", "a finite number in [1, 10**15]"),
    ],
)
def test_heads_command_thresholds_that_flag_nothing_or_everything_are_one_line(
    tmp_path, capsys, option, value, expected
):
    """A NaN or negative --min-spread would flag no head at all, silently (exit 0)."""
    path = tmp_path / "run.pt"
    write_checkpoint(path, generalized_model())
    assert cli.main(["heads", str(path), option, value]) == 2
    assert capsys.readouterr().err == (
        f"attnconv heads: error: argument {option}: expected {expected}, got '{value}' (see "
        f"attnconv heads --help)\n"
    )


# ---------------------------------------------------------------------------- content attention


def content_rows(out: str) -> dict[str, list[str]]:
    """The per-layer rows of the content table of ``attnconv heads``' output, by module name."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Content attention on"))
    rows = {}
    for line in lines[start + 2 :]:
        if line.startswith("every layer's"):
            break
        cells = line.split()
        rows[cells[1]] = cells
    return rows


def test_heads_command_measures_the_content_attention_of_a_transformed_run(tmp_path, capsys):
    """A run fine-tuned from a transformed checkpoint (its start, ``config.init``): the first
    layer's queries zeroed (uniform content maps: entropy 1, nothing changes under the ablation,
    query norm ×0), every key halved (×0.5), the second layer's queries ×1000 (maps far from
    uniform)."""
    from attnconv.analysis.content import content_diagnostics, labelled_test_images, run_start
    from attnconv.convert import transform_checkpoint
    from attnconv.models.checkpoint import build_model
    from viz_helpers import TRANSFORMED_BASE

    torch.manual_seed(0)
    architecture, arguments = preset_arguments(
        "resnet-fashion-small", **TRANSFORMED_BASE, image_size=(8, 8)
    )
    cnn = {"preset": "resnet-fashion-small", "dataset": "digits", "architecture": architecture,
           "arguments": arguments,
           "model": create_model("resnet-fashion-small", **arguments).state_dict()}  # fmt: skip
    layers = ["stages.1.1.conv1", "stages.2.0.conv1"]  # 4x4 inputs: N = 16 keys
    start = transform_checkpoint(cnn, layers, 3.0, preset="tcnn-fashion-small")
    save_checkpoint(start, tmp_path / "transformed.pt")
    model = build_model(start)
    first, second = model.transformed_layers().values()
    with torch.no_grad():
        first.gate.copy_(0.1 * torch.arange(9.0))
        second.gate.fill_(0.5)
        first.query.weight.zero_()
        first.query.bias.zero_()
        second.query.weight.mul_(1000.0)
        for layer in (first, second):
            layer.key.weight.mul_(0.5)
    checkpoint = {**start, "model": model.state_dict(), "epoch": 3,
                  "config": {"seed": 0, "init": str(tmp_path / "transformed.pt")}}  # fmt: skip
    save_checkpoint(checkpoint, tmp_path / "tuned.pt")

    assert cli.main(["heads", str(tmp_path / "tuned.pt"), "--images", "100"]) == 0
    captured = capsys.readouterr()
    assert "measuring the content attention on 100 digits test images (4 passes" in captured.err
    out = captured.out
    assert f"now ÷ at the start (the run's start, {tmp_path / 'transformed.pt'})" in out
    rows = content_rows(out)
    assert list(rows) == layers
    a, b = rows.values()
    assert a[2:10] == ["gated", "16", "1.000", "1.000", "1.000", "0.400", "0.000", "0.500"]
    assert a[10:12] == ["0", "0.00"]  # a uniform map replaced by a uniform map changes nothing
    assert b[2:4] == ["gated", "16"] and b[7:10] == ["0.500", "1000.000", "0.500"]
    images, labels = labelled_test_images("digits", (8, 8), 100)
    expected = content_diagnostics(build_model(checkpoint), images, labels,
                                   run_start(checkpoint)[0])  # fmt: skip
    for cells, layer in zip((a, b), expected.layers, strict=True):
        assert float(cells[5]) == pytest.approx(sum(layer.entropy) / 9, abs=5e-4)
        assert int(cells[10]) == layer.changed
        assert cells[12] == f"{100 * layer.accuracy:.2f}%"
    assert float(b[5]) < 0.9  # the second layer's maps are not uniform
    assert (
        f"every layer's content maps uniform at once: {expected.changed} of 100 predictions "
        f"changed ({expected.changed:.2f}%), accuracy {100 * expected.ablated_accuracy:.2f}%"
    ) in out
    per_head = out.splitlines()[out.splitlines().index("entropy ÷ log N per head:") + 2 :]
    assert per_head[0].split() == [layers[0]] + ["1.000"] * 9


def test_heads_command_on_a_content_model_without_gaussian_heads(tmp_path, capsys):
    from viz_helpers import save_checkpoint as save_small
    from viz_helpers import small_model

    model, config = small_model("learned-content")
    path = save_small(tmp_path / "lc.pt", model, "learned-content", config)
    assert cli.main(["heads", str(path), "--images", "30"]) == 0
    out = capsys.readouterr().out
    assert "Content attention on 30 digits test images" in out
    assert "(no run recorded in the checkpoint: its start is not known)" in out
    rows = content_rows(out)
    assert list(rows) == ["blocks.0.attention", "blocks.1.attention"]
    assert all(cells[2:4] == ["added", "64"] and cells[7:10] == ["—"] * 3 for cells in rows.values())
    assert cli.main(["heads", str(path), "--images", "0"]) == 2
    assert "--images 0: this model has no Gaussian heads" in capsys.readouterr().err
    assert cli.main(["heads", "--pretrained", "quadratic-fashion", "--images", "5"]) == 2
    err = capsys.readouterr().err
    assert "--images: for models with content attention; this ImageTransformer has none" in err
    assert err.count("\n") == 1

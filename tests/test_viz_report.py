"""Run reports: table numbers and plotted curves equal what the run folders hold."""

import json
import re

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv.cli import main
from attnconv.viz.report import (
    format_summary_table,
    load_run,
    report_figure,
    run_labels,
    summary_row,
)
from viz_helpers import write_run


def metrics(val_accs, times):
    return [
        {
            "epoch": e + 1,
            "step": 10 * (e + 1),
            "lr": 0.1,
            "train_loss": 1.0,
            "train_acc": 0.5,
            "val_loss": 1.0,
            "val_acc": acc,
            "epoch_time_s": t,
            "images_per_s": 100.0,
        }
        for e, (acc, t) in enumerate(zip(val_accs, times, strict=True))
    ]


@pytest.fixture
def runs(tmp_path):
    finished = write_run(
        tmp_path / "attention",
        metrics([0.41, 0.63, 0.6187], [10.0, 11.0, 12.0]),
        {
            "preset": "quadratic",
            "dataset": "cifar10",
            "parameters": 12_130_000,
            "macs_per_image": 2_345_678_901,
            "best_val_acc": 0.63,
            "best_epoch": 2,
            "test_acc": 0.6234,
            "test_loss": 1.1,
            "train_time_s": 3725.4,
            "images_per_s": 90.0,
        },
        {"preset": "quadratic", "dataset": "cifar10"},
    )
    running = write_run(
        tmp_path / "resnet",
        metrics([0.5, 0.7123, 0.7], [20.0, 21.5, 19.2]),
        None,
        {"preset": "resnet18", "dataset": "cifar10"},
    )
    return finished, running


def parse_table(text):
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


def test_summary_numbers_come_from_the_run_files(runs):
    finished, running = runs
    rows = [summary_row(load_run(finished)), summary_row(load_run(running))]
    summary = json.loads((finished / "summary.json").read_text())
    for key in (
        "parameters",
        "macs_per_image",
        "best_val_acc",
        "best_epoch",
        "test_acc",
        "train_time_s",
    ):
        assert rows[0][key] == summary[key]
    # a run without summary.json: best validation accuracy and time from metrics.jsonl
    assert rows[1]["best_val_acc"] == 0.7123 and rows[1]["best_epoch"] == 2
    assert rows[1]["train_time_s"] == pytest.approx(60.7)
    assert rows[1]["test_acc"] is None and rows[1]["preset"] == "resnet18"
    table = parse_table(format_summary_table(rows))
    assert table[0] == {
        "run": "attention",
        "preset": "quadratic",
        "dataset": "cifar10",
        "epochs": "3",
        "params (M)": "12.13",
        "MACs (G)": "2.346",
        "best val (%)": "63.00",
        "at epoch": "2",
        "test (%)": "62.34",
        "train time": "1:02:05",
    }
    assert table[1]["best val (%)"] == "71.23" and table[1]["test (%)"] == "-"
    assert table[1]["train time"] == "0:01:01"


def test_report_figure_draws_each_runs_curve_and_test_star(runs):
    loaded = [load_run(path) for path in runs]
    ax = report_figure(loaded).axes[0]
    lines = {line.get_gid(): line for line in ax.lines if line.get_gid()}
    assert set(lines) == {"val-0", "val-1", "test-0"}
    for index, run in enumerate(loaded):
        np.testing.assert_allclose(lines[f"val-{index}"].get_xdata(), [1, 2, 3])
        np.testing.assert_allclose(
            lines[f"val-{index}"].get_ydata(), [100 * m["val_acc"] for m in run.metrics]
        )
    # the test accuracy is that of the best-validation checkpoint (epoch 2), not of the last epoch
    np.testing.assert_allclose(lines["test-0"].get_xydata(), [[2, 62.34]])


def test_report_epoch_ticks_are_whole_numbers(runs):
    fig = report_figure(
        [load_run(path) for path in runs]
    )  # three epochs: the auto ticks were 1, 1.25, …
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks == [1.0, 2.0, 3.0]


def test_report_legend_names_what_is_drawn(runs):
    ax = report_figure([load_run(path) for path in runs]).axes[0]
    legend = ax.get_legend()
    texts = [text.get_text() for text in legend.get_texts()]
    assert texts == [
        "attention (quadratic), validation",
        "resnet (resnet18), validation",
        "test accuracy of the best-validation checkpoint",
    ]
    # each run's entry is its line (same colour); the star key is a star, not a line
    by_label = {line.get_label(): line for line in ax.lines}
    for handle, text in zip(legend.legend_handles, texts[:2], strict=False):
        assert handle.get_color() == by_label[text].get_color()
        assert handle.get_marker() in ("None", "", None)
    assert legend.legend_handles[2].get_marker() == "*"
    assert legend.legend_handles[2].get_linestyle() == "None"


def test_report_without_finished_runs_has_no_star_key(runs):
    ax = report_figure([load_run(runs[1])]).axes[0]
    texts = [text.get_text() for text in ax.get_legend().get_texts()]
    assert texts == ["resnet (resnet18), validation"]


def test_runs_with_the_same_folder_name_are_told_apart(runs, tmp_path, capsys):
    first, second = (tmp_path / "demo-a" / "run", tmp_path / "demo-b" / "run")
    for target, source in ((first, runs[0]), (second, runs[1])):
        target.mkdir(parents=True)
        for file in source.iterdir():
            (target / file.name).write_bytes(file.read_bytes())
    loaded = [load_run(first), load_run(second), load_run(runs[0])]
    assert run_labels(loaded) == ["demo-a/run", "demo-b/run", "attention"]
    texts = [t.get_text() for t in report_figure(loaded).axes[0].get_legend().get_texts()]
    assert texts[:3] == [
        "demo-a/run (quadratic), validation",
        "demo-b/run (resnet18), validation",
        "attention (quadratic), validation",
    ]
    assert main(["report", str(first), str(second), "--out", str(tmp_path / "report")]) == 0
    table = parse_table(capsys.readouterr().out)
    assert [row["run"] for row in table] == ["demo-a/run", "demo-b/run"]
    # the same folder twice: nothing tells it apart, its full path is shown
    same = [load_run(first), load_run(first)]
    assert run_labels(same) == [str(first.resolve())] * 2


def test_report_cli_prints_the_table_and_writes_figures(runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = parse_table(printed)
    assert [row["best val (%)"] for row in table] == ["63.00", "71.23"]
    assert (out / "summary.md").read_text().strip() == format_summary_table(
        [summary_row(load_run(path)) for path in runs]
    )
    for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        assert (out / f"report{suffix}").read_bytes().startswith(magic)


def test_bad_run_folders(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    write_run(tmp_path / "broken", [], None, {})
    (tmp_path / "broken" / "metrics.jsonl").write_text('{"epoch": 1,\n')
    with pytest.raises(ValueError, match=re.escape("metrics.jsonl:1: not valid JSON")):
        load_run(tmp_path / "broken")


def metrics_line(**changes):
    record = {**metrics([0.5], [1.0])[0], **changes}
    return (json.dumps({k: v for k, v in record.items() if v != "-"}) + "\n").encode()


SUMMARY = {"preset": "quick", "dataset": "digits", "best_epoch": 1, "test_acc": 0.5}

# (file, its bytes, what the one line says after the file's name): broken run folders as a user
# or a crash leaves them
BROKEN = [
    ("metrics.jsonl", b'{"epoch": 1, "val_acc": 0.5}\n\xff\xfe\n', "not UTF-8 text (invalid"),
    ("metrics.jsonl", metrics_line(epoch="-"), ":1: an epoch record needs an integer 'epoch'"),
    ("metrics.jsonl", metrics_line(epoch="x"), ":1: an epoch record needs an integer 'epoch'"),
    ("metrics.jsonl", metrics_line(epoch=0), ":1: an epoch record needs an integer 'epoch' >= 1"),
    ("metrics.jsonl", metrics_line(val_acc="x"), ":1: val_acc must be a number, got 'x'"),
    ("metrics.jsonl", metrics_line(epoch_time_s=[1]), ":1: epoch_time_s must be a number"),
    ("metrics.jsonl", metrics_line(val_acc=True), ":1: val_acc must be a number, got True"),
    ("metrics.jsonl", b'[{"epoch": 1}]\n', ":1: expected a JSON object, got list"),
    ("summary.json", json.dumps({**SUMMARY, "test_acc": "x"}).encode(), "test_acc must be a"),
    ("summary.json", json.dumps({**SUMMARY, "best_epoch": "2"}).encode(), "best_epoch must be"),
    ("summary.json", json.dumps({**SUMMARY, "parameters": {}}).encode(), "parameters must be"),
    ("summary.json", json.dumps({**SUMMARY, "train_time_s": "1h"}).encode(), "train_time_s must"),
    ("summary.json", b"\x80" + json.dumps(SUMMARY).encode(), "not UTF-8 text (invalid"),
    ("summary.json", b"", "not valid JSON"),
    ("config.json", b'{"preset": "\xc3"}', "not UTF-8 text (invalid"),
]


@pytest.mark.parametrize(("name", "data", "message"), BROKEN)
def test_a_broken_run_folder_is_one_line_naming_the_file(tmp_path, capsys, name, data, message):
    run = write_run(tmp_path / "run", metrics([0.5, 0.6], [1.0, 1.0]), SUMMARY, {})
    (run / name).write_bytes(data)
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"attnconv report: error: {run / name}"), err
    assert message in err, err
    assert not (tmp_path / "report").exists()

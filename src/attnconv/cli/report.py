"""``attnconv report RUN_DIR...``: accuracy against epoch for several runs and a summary table."""

from __future__ import annotations

import argparse

from attnconv.cli.options import OutputFolder, RunFolder, add_overwrite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", type=RunFolder("a run folder", "metrics.jsonl"),
        help="run folders of `attnconv train`",
    )
    parser.add_argument(
        "--out",
        default="attnconv-report",
        type=OutputFolder(),
        help="folder for report.png/.pdf and summary.md (default: attnconv-report)",
    )
    add_overwrite(parser, "a report")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnconv.cli.options import claim_output
    from attnconv.runs import write_text_atomic
    from attnconv.viz.report import (
        format_summary_table,
        load_run,
        report_figure,
        run_labels,
        summary_row,
    )
    from attnconv.viz.style import save_figure

    claim_output(args.out, args.overwrite, result=("report.png", "report.pdf", "summary.md"))
    runs = [load_run(path) for path in args.runs]
    names = run_labels(runs)
    table = format_summary_table(
        [summary_row(run, name) for run, name in zip(runs, names, strict=True)]
    )
    print(table)
    files = save_figure(report_figure(runs), args.out, "report")
    summary = Path(args.out) / "summary.md"
    write_text_atomic(summary, table + "\n")
    print("wrote " + ", ".join(str(path) for path in [*files, summary]))
    return 0

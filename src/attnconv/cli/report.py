"""``attnconv report RUN_DIR...``: accuracy against epoch for several runs and a summary table."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run folders of `attnconv train`"
    )
    parser.add_argument(
        "--out",
        default="attnconv-report",
        help="folder for report.png/.pdf and summary.md (default: attnconv-report)",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnconv.viz.report import (
        format_summary_table,
        load_run,
        report_figure,
        run_labels,
        summary_row,
    )
    from attnconv.viz.style import save_figure

    runs = [load_run(path) for path in args.runs]
    names = run_labels(runs)
    table = format_summary_table(
        [summary_row(run, name) for run, name in zip(runs, names, strict=True)]
    )
    print(table)
    files = save_figure(report_figure(runs), args.out, "report")
    summary = Path(args.out) / "summary.md"
    summary.write_text(table + "\n")
    print("wrote " + ", ".join(str(path) for path in [*files, summary]))
    return 0

"""``attnconv explore CHECKPOINT --out SITE_DIR``: the interactive attention explorer, a static site."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a checkpoint file, or a run folder (its last.pt)")
    parser.add_argument("--out", required=True, help="folder for the site (open its index.html)")
    parser.add_argument(
        "--images",
        type=int,
        default=4,
        help="models with content scores: how many test images to include "
        "(default: 4; position-only models need none)",
    )
    parser.add_argument("--data-dir", help="dataset folder (default: attnconv's data folder)")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then serve the site on http://127.0.0.1:PORT until interrupted",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port for --serve (default: 8000; 0 picks a free one)",
    )


def run(args: argparse.Namespace) -> int:
    from attnconv.train.checkpoint import load_model
    from attnconv.viz.export import make_server, site_size, write_site
    from attnconv.viz.figures import checkpoint_path, test_images
    from attnconv.viz.maps import is_position_only

    path = checkpoint_path(args.checkpoint)
    model, checkpoint = load_model(path)
    if not hasattr(model, "attention_layers"):
        raise ValueError(f"{str(path)!r} holds a {type(model).__name__}, which has no attention")
    images = labels = None
    if not is_position_only(model):
        images, labels = test_images(checkpoint["dataset"], args.images, args.data_dir)
    meta = {
        "preset": checkpoint["preset"],
        "dataset": checkpoint["dataset"],
        "epoch": checkpoint["epoch"],
        "checkpoint": path.name,
    }
    write_site(
        model,
        args.out,
        tuple(model.image_size),
        images,
        labels,
        title=f"attnconv explorer: {checkpoint['preset']}",
        meta=meta,
    )
    print(f"wrote {args.out}/index.html ({site_size(args.out) / 1e6:.2f} MB); open it in a browser")
    if args.serve:
        server = make_server(args.out, args.port)
        host, port = server.server_address[:2]
        print(f"serving on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0

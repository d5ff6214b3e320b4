"""``attnconv explore (CHECKPOINT | --pretrained NAME|all) [--add DIR ...] --out SITE_DIR``: the
interactive attention explorer, a static site (one page, a model switcher when it holds several
models). A transformed network (T-CNN) shows each transformed layer's heads over that layer's
input, from the output pixel nearest the clicked one. ``--add`` puts the models of ``attnconv analyze`` folders (timm and torchvision vision
transformers among them) on the same page."""

from __future__ import annotations

import argparse

from attnconv.cli.options import (
    CheckpointSource,
    DataFolder,
    InputFolder,
    Name,
    OutputFolder,
    add_overwrite,
    int_in,
)
from attnconv.errors import UserError

IMAGES = 4  # test images in the site, unless --images says otherwise
PORT = 8000
MAX_PORT = 65535  # TCP port numbers are 16-bit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", nargs="?", type=CheckpointSource(),
        help="a checkpoint file, or a run folder (its last.pt)",
    )
    parser.add_argument(
        "--pretrained",
        metavar="NAME",
        type=Name("a shipped model or all"),
        help="instead of a checkpoint, a model shipped with attnconv, or 'all' for every shipped "
        "model with attention on one page (offline: the shipped test images are used)",
    )
    parser.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="DIR",
        type=InputFolder("an analyze folder or explorer site"),
        help="also show the model of an `attnconv analyze` output folder (or of any explorer "
        "site); repeatable",
    )
    parser.add_argument("--out", required=True, type=OutputFolder(),
                        help="folder for the site (open its index.html)")
    add_overwrite(parser, "a site")
    parser.add_argument(
        "--images",
        type=int_in(1, 10**4),
        help=f"how many test images to include (default: {IMAGES}); content models also show "
        "the attention averaged over all shipped test images (--pretrained) or over these. Not "
        "for a checkpoint of a position-only model, whose attention is the same for every image",
    )
    parser.add_argument(
        "--data-dir",
        type=DataFolder(),
        help="dataset folder for the test images of a checkpoint of a model with content scores",
    )
    parser.add_argument(
        "--weights-dir",
        type=InputFolder("a folder of shipped weights"),
        help="advanced, with --pretrained: folder of shipped weights and test images (default: "
        "the package's)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then serve the site on http://127.0.0.1:PORT until interrupted",
    )
    parser.add_argument(
        "--port",
        type=int_in(0, MAX_PORT),
        help=f"port for --serve (default: {PORT}; 0 picks a free one)",
    )


def checkpoint_entries(args: argparse.Namespace) -> tuple[list, dict[str, str]]:
    """The one model of a checkpoint, as a ``SiteModel``, with the diagnostics of its content
    attention on the page's test images (``attnconv.analysis.content``)."""
    from attnconv.analysis.content import explorer_content, run_start
    from attnconv.models import PRESETS
    from attnconv.models.checkpoint import load_model
    from attnconv.models.transformed import TransformedNetwork
    from attnconv.viz.export import SiteModel
    from attnconv.viz.figures import checkpoint_path, test_images
    from attnconv.viz.maps import is_position_only

    path = checkpoint_path(args.checkpoint)
    model, checkpoint = load_model(path)
    transformed = isinstance(model, TransformedNetwork)
    if not transformed and not hasattr(model, "attention_layers"):
        raise UserError(f"{str(path)!r} holds a {type(model).__name__}, which has no attention")
    images = labels = None
    if transformed or not is_position_only(model):
        count = IMAGES if args.images is None else args.images
        images, labels = test_images(checkpoint["dataset"], count, args.data_dir)
    elif args.images is not None or args.data_dir is not None:
        raise UserError(
            f"--images and --data-dir do nothing for {path}: its model's attention is "
            f"position-only, the same for every image; leave them out"
        )
    content = None
    if images is not None:
        content = explorer_content(model, images, run_start(checkpoint))
    preset = checkpoint["preset"]
    entry = SiteModel(
        name=preset,
        model=model,
        image_size=tuple(model.image_size),
        description=PRESETS[preset].description if preset in PRESETS else "",
        dataset=checkpoint["dataset"],
        meta={**({"epoch": checkpoint["epoch"]} if "epoch" in checkpoint else {}),
              "checkpoint": path.name},  # fmt: skip (attnconv transform's has no epoch)
        images=images,
        labels=labels,
        average_images=images,
        content=content,
    )
    return [entry], {}


def pretrained_entries(args: argparse.Namespace) -> tuple[list, dict[str, str]]:
    """The shipped models named by ``--pretrained`` that have attention, and the others with the
    reason they are left out; a model with content attention with its diagnostics on the shipped
    test images (``attnconv.analysis.content``)."""
    from attnconv.analysis.content import explorer_content, pretrained_start
    from attnconv.models.pretrained import (
        WEIGHTS_DIR,
        load_pretrained,
        pretrained_info,
        pretrained_models,
        sample_images,
    )
    from attnconv.models.transformed import TransformedNetwork
    from attnconv.viz.export import SiteModel

    folder = args.weights_dir or WEIGHTS_DIR
    if args.pretrained == "all":
        infos = list(pretrained_models(folder).values())
        if not infos:
            raise UserError(f"no pretrained models are shipped in {folder}")
    else:
        infos = [pretrained_info(args.pretrained, folder)]
    entries, skipped, samples = [], {}, {}
    for info in infos:
        model = load_pretrained(info.name, folder)
        if not hasattr(model, "attention_layers") and not isinstance(model, TransformedNetwork):
            skipped[info.name] = f"a {type(model).__name__}: no attention layers"
            continue
        if info.dataset not in samples:
            samples[info.dataset] = sample_images(info.dataset, folder)
        images, labels = samples[info.dataset]
        if args.images is not None and args.images > images.shape[0]:
            raise UserError(
                f"--images {args.images}: {images.shape[0]} test images of {info.dataset} ship "
                f"with the weights, and --pretrained shows only those"
            )
        entries.append(
            SiteModel(
                name=info.name,
                model=model,
                image_size=tuple(model.image_size),
                description=info.description,
                dataset=info.dataset,
                test_accuracy=info.test_accuracy,
                images=images[: IMAGES if args.images is None else args.images],
                labels=labels[: IMAGES if args.images is None else args.images],
                average_images=images,
                content=explorer_content(model, images, pretrained_start(info.name, folder)),
            )
        )
    if not entries:
        raise UserError(f"{', '.join(skipped)}: {'; '.join(skipped.values())}; nothing to explore")
    return entries, skipped


def added_entries(folders: list[str]) -> list:
    """The models of ``attnconv analyze`` folders (their ``explorer/`` site) or explorer sites."""
    from pathlib import Path

    from attnconv.viz.export import read_site

    entries = []
    for folder in folders:
        site = Path(folder) / "explorer"
        entries += read_site(site if (site / "data.js").is_file() else folder)
    return entries


def site_title(args: argparse.Namespace, entries: list, added: list) -> str:
    """The page's title: the models it shows ("4 shipped models and timm:vit_tiny_patch16_224")."""
    names = [entry.name for entry in entries]
    if args.pretrained == "all":
        names = [f"{len(entries)} shipped model{'s' if len(entries) > 1 else ''}"]
    names += [entry.name for entry in added]
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    return f"attnconv explorer: {listed}"


def run(args: argparse.Namespace) -> int:
    from attnconv.cli.options import claim_output
    from attnconv.viz.export import make_server, site_size, write_explorer

    if args.checkpoint is not None and args.pretrained is not None:
        raise UserError("give a checkpoint or --pretrained NAME (or all), not both")
    if args.checkpoint is None and args.pretrained is None:
        if not args.add:
            raise UserError("give a checkpoint or --pretrained NAME (or all), or only --add DIR")
        given = [
            option
            for option, value in (
                ("--images", args.images),
                ("--data-dir", args.data_dir),
                ("--weights-dir", args.weights_dir),
            )
            if value is not None
        ]
        if given:
            raise UserError(
                f"{', '.join(given)}: for a checkpoint or --pretrained; the models of --add "
                f"come with their own images"
            )
    if args.pretrained is not None and args.data_dir is not None:
        raise UserError("--data-dir is for a checkpoint's test images; --pretrained shows the "
                        "test images shipped with the weights")
    if args.checkpoint is not None and args.weights_dir is not None:
        raise UserError("--weights-dir is for --pretrained; a checkpoint holds its own weights")
    if args.port is not None and not args.serve:
        raise UserError("--port is for --serve; without it the site is only written")
    claim_output(args.out, args.overwrite)
    if args.pretrained is not None:
        entries, skipped = pretrained_entries(args)
    elif args.checkpoint is not None:
        entries, skipped = checkpoint_entries(args)
    else:
        entries, skipped = [], {}
    added = added_entries(args.add)
    write_explorer(entries + added, args.out, title=site_title(args, entries, added), skipped=skipped)
    for name, reason in skipped.items():
        print(f"left out {name}: {reason}")
    print(f"wrote {args.out}/index.html ({site_size(args.out) / 1e6:.2f} MB); open it in a browser")
    if args.serve:
        server = make_server(args.out, PORT if args.port is None else args.port)
        host, port = server.server_address[:2]
        print(f"serving on http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0

"""`attnconv explore`: options that would do nothing in a combination are refused in one line; the
page's title names what it shows."""

import json
import shutil

import pytest

from attnconv.cli import main
from attnconv.models import create_model
from attnconv.models.pretrained import sample_images
from attnconv.viz.export import read_data, write_explorer
from explorer_helpers import recorded_model, shipped_folder
from viz_helpers import save_checkpoint


@pytest.fixture
def position_only(tmp_path):
    return save_checkpoint(tmp_path / "quick.pt", create_model("quick"), "quick", {})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--images", "2"], "--images and --data-dir do nothing for"),
        (["--data-dir", "somewhere"], "position-only, the same for every image"),
        (["--weights-dir", "."], "--weights-dir is for --pretrained"),
        (["--port", "0"], "--port is for --serve"),
    ],
)
def test_options_that_do_nothing_are_refused(position_only, tmp_path, capsys, options, message):
    out = tmp_path / "site"
    assert main(["explore", str(position_only), "--out", str(out), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (out / "index.html").exists()


def test_data_dir_with_pretrained_is_refused(tmp_path, capsys):
    argv = ["explore", "--pretrained", "quadratic-fashion", "--data-dir", "d", "--out", "x"]
    assert main(argv) == 2
    assert "--pretrained shows the test images shipped" in capsys.readouterr().err


def test_more_images_than_shipped_are_refused_not_cut(tmp_path, capsys):
    out = tmp_path / "site"
    argv = ["explore", "--pretrained", "quadratic-fashion", "--images", "20", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    shipped = sample_images("fashion-mnist")[0].shape[0]
    assert f"--images 20: {shipped} test images of fashion-mnist ship with the weights" in err
    assert not (out / "index.html").exists()


def test_a_position_only_checkpoint_explores_without_them(position_only, tmp_path):
    assert main(["explore", str(position_only), "--out", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_checkpoint_attnconv_transform_writes_is_explored_on_its_test_images(tmp_path):
    """A T-CNN checkpoint as `attnconv transform` writes it (no epoch): the page holds its
    transformed layers' attention on the first test images of its dataset and their average."""
    from attnconv.data import load_splits
    from attnconv.models.checkpoint import save_checkpoint as write
    from attnconv.viz.export import read_data
    from viz_helpers import transformed_checkpoint

    checkpoint = transformed_checkpoint(image_size=(8, 8), dataset="digits", moved=False)
    for key in ("epoch", "step", "config", "metrics"):
        del checkpoint[key]
    write(checkpoint, tmp_path / "transformed.pt")
    site = tmp_path / "site"
    argv = ["explore", str(tmp_path / "transformed.pt"), "--images", "2", "--out", str(site)]
    assert main(argv) == 0
    manifest = read_data(site / "data.js")
    assert [(m["name"], m["kind"], m["heads"]) for m in manifest["models"]] == [
        ("tcnn-fashion-small", "probabilities", [9] * 8)
    ]
    data = read_data(site / "models" / "0" / "model.js")
    assert data["meta"]["checkpoint"] == "transformed.pt" and "epoch" not in data["meta"]
    assert data["meta"]["mean content gate per layer"] == ", ".join(["0.00"] * 8)
    splits = load_splits("digits", val_size=0)
    assert [image["label"] for image in data["images"]] == [
        f"test 0: {splits.classes[int(splits.test.labels[0])]}",
        f"test 1: {splits.classes[int(splits.test.labels[1])]}",
        "average over 2 test images",
    ]


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_that_cannot_be_served_is_refused_before_the_site_is_written(
    position_only, tmp_path, capsys, port
):
    out = tmp_path / "site"
    assert main(["explore", str(position_only), "--out", str(out), "--serve", "--port", port]) == 2
    assert capsys.readouterr().err == (
        f"attnconv explore: error: argument --port: expected an integer in [0, 65535], got "
        f"'{port}' (see attnconv explore --help)\n"
    )
    assert not out.exists()


def test_a_site_of_every_kind_reads_back_as_it_was_written(tmp_path):
    """Position-only, content and transformed models (the shipped ones) pass the checks of what
    --add reads, and land on the new page unchanged."""
    shipped = tmp_path / "shipped"
    assert main(["explore", "--pretrained", "all", "--images", "2", "--out", str(shipped)]) == 0
    again = tmp_path / "again"
    assert main(["explore", "--add", str(shipped), "--out", str(again)]) == 0
    models = read_data(shipped / "data.js")["models"]
    assert {m["kind"] for m in models} == {"position", "content", "probabilities"}
    assert read_data(again / "data.js")["models"] == models
    for path in shipped.glob("models/*/*.js"):
        assert read_data(again / path.relative_to(shipped)) == read_data(path)


def assigned(value) -> str:
    return "window.ATTNCONV_SITE = " + json.dumps(value) + ";\n"


def edit_model(site, change) -> None:
    """Apply ``change`` to the object of ``site``'s first model file."""
    path = site / "models" / "0" / "model.js"
    text = path.read_text()
    start, end = text.index("= ") + 2, text.rindex(";")
    data = json.loads(text[start:end])
    change(data)
    path.write_text(text[:start] + json.dumps(data) + text[end:])


def edit_manifest(site, change) -> None:
    path = site / "data.js"
    manifest = read_data(path)
    change(manifest)
    path.write_text(assigned(manifest))


def _set(key, value):
    return lambda entry: entry.__setitem__(key, value)


# Content diagnostics (ContentDiagnostics.to_dict) whose one layer has a word for an entropy.
BAD_ENTROPY = {
    "images": 8,
    "changed": 0,
    "start": None,
    "layers": [
        {"name": "x", "kind": "gated", "keys": 4, "entropy": ["high"], "gates": None, "changed": 0}
    ],
}
BROKEN_SITES = {
    "plain text": (lambda site: (site / "data.js").write_text("hello"), "data.js is not an "
                   "explorer data file (substring not found)"),
    "empty": (lambda site: (site / "data.js").write_text(""), "data.js is not an explorer data"),
    "not UTF-8": (lambda site: (site / "data.js").write_bytes(b"\xff\xfe= [];"),
                  "data.js is not an explorer data file ('utf-8' codec can't decode"),
    "not JSON": (lambda site: (site / "data.js").write_text("window.X = {nope};"),
                 "data.js is not an explorer data file (Expecting property name"),
    "nested": (lambda site: (site / "data.js").write_text("window.X = " + "[" * 100_000 + ";"),
               "data.js is not an explorer data file (nested too deeply)"),
    "a list": (lambda site: (site / "data.js").write_text("window.X = [1];"),
               "data.js assigns a list, expected a JSON object"),
    "no models": (lambda site: edit_manifest(site, lambda m: m.pop("models")),
                  "data.js: the site lacks 'models'"),
    "no description": (
        lambda site: edit_manifest(site, lambda m: m["models"][0].pop("description")),
        "data.js: model 0 lacks 'description'",
    ),
    "outside file": (
        lambda site: edit_manifest(site, lambda m: m["models"][0].update(file="/etc/hostname")),
        "data.js: the file '/etc/hostname' lies outside the site",
    ),
    "climbing file": (
        lambda site: edit_manifest(site, lambda m: m["models"][0].update(file="../../x.js")),
        "data.js: the file '../../x.js' lies outside the site",
    ),
    "huge grid": (lambda site: edit_model(site, _set("grid", [10**9, 10**9])),
                  "model.js: layer 0's row factors holds"),
    "fractional grid": (lambda site: edit_model(site, _set("grid", [1e9, 1e9])),
                        "model.js: the token grid is [1000000000.0, 1000000000.0], expected 2 "
                        "positive whole numbers"),
    "huge image": (lambda site: edit_model(site, _set("image_size", [10**9, 10**9])),
                   "model.js: image 0's pixels holds"),
    "more heads": (lambda site: edit_model(site, _set("heads", [10**6] * 100)),
                   "layers, expected 100"),
    "unknown kind": (lambda site: edit_model(site, _set("kind", "other")),
                     "model.js: the model is of kind 'other', expected one of"),
    "content changed past its images": (
        lambda site: edit_model(site, _set("content", {"images": 8, "changed": 9, "layers": []})),
        "model.js: the content diagnostics count 9 changed of 8 images",
    ),
    "content entropy not a number": (
        lambda site: edit_model(site, _set("content", BAD_ENTROPY)),
        "model.js: content layer 0's entropy is not a number (or null) per head",
    ),
}


@pytest.fixture(scope="module")
def shipped_site(tmp_path_factory):
    """The site of a shipped position-only model, with one test image under its query picker."""
    site = tmp_path_factory.mktemp("shipped") / "site"
    argv = ["explore", "--pretrained", "quadratic-fashion", "--images", "1", "--out", str(site)]
    assert main(argv) == 0
    return site


@pytest.mark.parametrize("damage", list(BROKEN_SITES))
def test_a_site_that_is_not_what_explore_writes_is_one_line_naming_its_file(
    shipped_site, tmp_path, capsys, damage
):
    site = tmp_path / "site"
    shutil.copytree(shipped_site, site)
    capsys.readouterr()
    change, message = BROKEN_SITES[damage]
    change(site)
    out = tmp_path / "out"
    assert main(["explore", "--add", str(site), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_the_title_names_the_models_the_page_shows(tmp_path):
    """Not "shipped models" when an analysis is added, nor the folders' paths."""
    weights = shipped_folder(tmp_path / "weights", ("quadratic-fashion", "learned-fashion"))
    analysis = tmp_path / "analysis"
    write_explorer([recorded_model()[0]], analysis)
    titles = {
        "attnconv explorer: 2 shipped models": ["--pretrained", "all"],
        "attnconv explorer: 2 shipped models and timm:tiny-vit": [
            "--pretrained", "all", "--add", str(analysis)
        ],
        "attnconv explorer: learned-fashion and timm:tiny-vit": [
            "--pretrained", "learned-fashion", "--add", str(analysis)
        ],
        "attnconv explorer: timm:tiny-vit": ["--add", str(analysis)],
    }  # fmt: skip
    for number, (title, args) in enumerate(titles.items()):
        site = tmp_path / f"site{number}"
        given = [*args, "--weights-dir", str(weights)] if "--pretrained" in args else args
        assert main(["explore", *given, "--out", str(site)]) == 0
        assert read_data(site / "data.js")["title"] == title

"""End to end: the explorer in headless Chromium, opened from file://, clicked, read back.

The page exposes what it draws as ``window.attnconv.maps[layer][head]``; the tests compare those
arrays (and the canvas pixels, the hover readout, the header) with the model's own attention
probabilities for the clicked query tokens, switch between the models of one site, and save
screenshots to ``test-artifacts/``.
"""

import base64
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from playwright.sync_api import sync_playwright

from attnconv.cli import main
from attnconv.models.pretrained import load_pretrained, sample_images
from attnconv.viz.export import decode_content, dequantize, read_data, write_site
from attnconv.viz.maps import compute_attention
from explorer_helpers import ACCURACY, shipped_folder
from viz_helpers import small_model

pytestmark = pytest.mark.needs_chromium

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIRIDIS = np.round(colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_site(browser, site: Path):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto((site / "index.html").as_uri())
    page.wait_for_function("window.attnconv && window.attnconv.ready", timeout=60_000)
    return page, errors


def at_token(box, token, grid):
    """The page coordinates of the centre of token ``(row, col)`` of an element's box."""
    return (
        box["x"] + (token[1] + 0.5) / grid[1] * box["width"],
        box["y"] + (token[0] + 0.5) / grid[0] * box["height"],
    )


def click_token(page, token, grid):
    """Click the centre of token ``(row, col)`` on the query picker."""
    page.mouse.click(*at_token(page.locator("#picker").bounding_box(), token, grid))
    page.wait_for_function(
        f"window.attnconv.ready && window.attnconv.state.query.join() == '{token[0]},{token[1]}'"
    )


def displayed(page):
    """The page's maps as a list over layers of (heads, N) arrays (None for absent terms)."""
    maps = page.evaluate("window.attnconv.maps.map(r => r.map(m => m && Array.from(m)))")
    return [np.array(layer, dtype=np.float64) for layer in maps]


def canvas_rgb(page, layer, head):
    """RGB pixels of one map's canvas, (h·w, 3)."""
    data = page.evaluate(
        """([layer, head]) => {
            const canvas = document.querySelectorAll('#maps .map')[layer * window.attnconv.data.heads[0] + head].querySelector('canvas');
            return Array.from(canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data);
        }""",
        [layer, head],
    )
    return np.array(data).reshape(-1, 4)[:, :3]


@pytest.mark.parametrize("preset", ["quadratic", "learned", "quadratic-generalized"])
def test_position_only_explorer(browser, tmp_path, preset):
    model, _ = small_model(preset, image_size=(12, 12), stem=2)
    grid = (6, 6)
    write_site(model, tmp_path, (12, 12))
    probs = [
        layer.attention_probs(*grid).detach().double().numpy() for layer in model.attention_layers()
    ]
    # separable layers are exported exactly; generalized ones as uint16 codes of the row maximum
    tolerance = 1e-6 if preset != "quadratic-generalized" else 1.0 / 65535
    page, errors = open_site(browser, tmp_path)
    assert page.locator("#images button").count() == 0  # position-only: no images needed
    assert page.locator("#switcher").is_hidden()  # one model: no switcher, but named
    assert page.locator("#model-name").inner_text() == "model"
    shown = []
    for token in [(1, 4), (4, 1)]:
        click_token(page, token, grid)
        maps = displayed(page)
        index = token[0] * grid[1] + token[1]
        for layer, p in enumerate(probs):
            np.testing.assert_allclose(maps[layer], p[:, index], atol=tolerance)
        values = maps[0][1]
        expected_rgb = VIRIDIS[np.round(255 * values / values.max()).astype(int)]
        np.testing.assert_array_equal(canvas_rgb(page, 0, 1), expected_rgb)
        shown.append(maps)
    assert np.abs(shown[0][1] - shown[1][1]).max() > 0.05  # the maps followed the query
    page.keyboard.press("ArrowRight")  # the picker has focus after the click
    page.wait_for_function("window.attnconv.state.query.join() == '4,2'")
    np.testing.assert_allclose(displayed(page)[1], probs[1][:, 4 * grid[1] + 2], atol=tolerance)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"explorer_{preset}.png", full_page=True)
    assert errors == []
    page.close()


def page_logits(site: Path, image: int, layer: int, query: int, term: str) -> np.ndarray:
    """The logits the page should show, decoded in Python from the exported file."""
    entry = read_data(site / "models" / "0" / f"image_{image:03d}.js")["layers"][layer]
    content = decode_content(entry["content"])[:, query]
    parts = dequantize(entry["position"])[:, query]
    split = entry["position"]["split"]
    position = (parts[:, :split, None] + parts[:, None, split:]).reshape(parts.shape[0], -1)
    return {"content": content, "position": position, "total": content + position}[term]


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_content_explorer_images_and_score_switch(browser, tmp_path):
    model, _ = small_model("learned-content")
    grid = (8, 8)
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    write_site(model, tmp_path, (8, 8), images, labels=["first", "second"])
    with torch.no_grad():
        _, probs = model(images, return_attention=True)
    page, errors = open_site(browser, tmp_path)
    assert page.locator("#images button").count() == 2

    def check_total(image, token):
        index = token[0] * grid[1] + token[1]
        maps = displayed(page)
        for layer in range(2):
            expected = probs[layer][image][:, index].double().numpy()
            np.testing.assert_allclose(maps[layer], expected, rtol=5e-3, atol=1e-7)
            np.testing.assert_allclose(
                maps[layer],
                softmax(page_logits(tmp_path, image, layer, index, "total")),
                rtol=1e-9,
                atol=1e-12,
            )
        return maps

    click_token(page, (2, 5), grid)
    first = check_total(0, (2, 5))
    click_token(page, (6, 1), grid)
    second = check_total(0, (6, 1))
    assert np.abs(first[0] - second[0]).max() > 0.05

    page.locator("#images button").nth(1).click()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    other_image = check_total(1, (6, 1))
    assert np.abs(other_image[0] - second[0]).max() > 0.01  # content: the image matters

    query = 6 * grid[1] + 1
    page.locator("input[name=mode][value=content]").check()
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(
            values,
            softmax(page_logits(tmp_path, 1, layer, query, "content")),
            rtol=1e-9,
            atol=1e-12,
        )
    page.locator("input[name=mode][value=position]").check()
    page.locator("#softmax").uncheck()
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(
            values, page_logits(tmp_path, 1, layer, query, "position"), rtol=1e-9, atol=1e-9
        )
    assert page.locator("#query-readout").inner_text().startswith("second: query token (row 6")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_learned-content.png", full_page=True)
    assert errors == []
    page.close()


def test_exported_pixels_drawn_on_the_picker(browser, tmp_path):
    model, _ = small_model("learned-content")
    images = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    write_site(model, tmp_path, (8, 8), images)
    page, _ = open_site(browser, tmp_path)
    data = page.evaluate(
        "Array.from(document.getElementById('picker').getContext('2d').getImageData(0, 0, 8, 8).data)"
    )
    grey = np.array(data).reshape(8, 8, 4)[..., 0]
    np.testing.assert_array_equal(grey, (images[0, 0] * 255).round().numpy())
    pixels = base64.b64decode(
        read_data(tmp_path / "models" / "0" / "model.js")["images"][0]["pixels"]
    )
    assert list(pixels) == grey.flatten().tolist()
    page.close()


@pytest.fixture(scope="module")
def shipped_site(tmp_path_factory):
    """``attnconv explore --pretrained all`` of a folder of shipped models with random weights."""
    weights = shipped_folder(tmp_path_factory.mktemp("weights"))
    site = tmp_path_factory.mktemp("site")
    argv = ["explore", "--pretrained", "all", "--weights-dir", str(weights), "--out", str(site)]
    assert main([*argv, "--images", "2"]) == 0
    return weights, site


def map_box(page, layer, head):
    return page.locator("#maps .map canvas").nth(layer * 9 + head).bounding_box()


def hover_value(page, layer, head, key, kind):
    """Hover key token ``key`` of map (layer, head); the readout's value after checking its text."""
    page.mouse.move(*at_token(map_box(page, layer, head), key, (14, 14)))
    return readout_value(page, layer, head, key, kind)


def readout_value(page, layer, head, key, kind):
    text = page.locator("#hover-readout").inner_text()
    match = re.fullmatch(
        rf"layer {layer}, head {head}, key \({key[0]}, {key[1]}\): {kind} (\S+)", text
    )
    assert match, text
    return float(match.group(1))


def switch_model(page, index, name):
    page.locator("#model-select").select_option(str(index))
    page.wait_for_function(f"window.attnconv.ready && window.attnconv.model == {index}")
    assert page.locator("#model-name").inner_text() == name
    assert name in page.title()
    accuracy = f"test accuracy {100 * ACCURACY[name]:.1f}% on fashion-mnist"
    assert page.locator("#accuracy").inner_text() == accuracy


def test_shipped_models_on_one_page(browser, shipped_site):
    weights, site = shipped_site
    grid = (14, 14)
    names = ["quadratic-fashion", "learned-fashion", "learned-content-fashion"]
    page, errors = open_site(browser, site)
    options = page.locator("#model-select option").all_inner_texts()
    assert options == names and page.locator("label[for=model-select]").inner_text() == "model"
    assert page.locator("#model-name").inner_text() == "quadratic-fashion"
    assert page.locator("#accuracy").inner_text() == "test accuracy 81.4% on fashion-mnist"
    assert "resnet-fashion (a ResNet: no attention layers)" in page.locator("#skipped").inner_text()
    assert page.locator("#images button").count() == 2  # shown under the picker only

    # position-only: the page's maps are the model's probabilities for a query on the last row
    quadratic = load_pretrained("quadratic-fashion", weights)
    probs = [
        layer.attention_probs(*grid).detach().double().numpy()
        for layer in quadratic.attention_layers()
    ]
    token = (13, 3)
    click_token(page, token, grid)
    maps = displayed(page)
    for layer, p in enumerate(probs):
        np.testing.assert_allclose(maps[layer], p[:, token[0] * 14 + token[1]], atol=1e-6)
    for layer, head in [(0, 0), (3, 8), (2, 4)]:  # the outline covers the query token's square
        canvas = map_box(page, layer, head)
        outline = page.locator("#maps .map .marker").nth(layer * 9 + head).bounding_box()
        assert canvas["y"] - 0.5 <= outline["y"]
        assert outline["y"] + outline["height"] <= canvas["y"] + canvas["height"] + 0.5
        assert outline["y"] == pytest.approx(canvas["y"] + 13 / 14 * canvas["height"], abs=1)
        assert outline["x"] == pytest.approx(canvas["x"] + 3 / 14 * canvas["width"], abs=1)

    # the hover readout follows the query (arrow key on the focused picker, mouse on the map)
    key = (12, 4)
    before = hover_value(page, 1, 2, key, "probability")
    assert before == pytest.approx(float(maps[1][2][key[0] * 14 + key[1]]), rel=1e-3)
    page.keyboard.press("ArrowUp")
    page.wait_for_function("window.attnconv.state.query.join() == '12,3'")
    after = readout_value(page, 1, 2, key, "probability")
    assert after == pytest.approx(float(probs[1][2, 12 * 14 + 3, key[0] * 14 + key[1]]), rel=1e-3)
    assert abs(after - before) > 1e-3 * before

    # colour bar: per map from 0 to the map's maximum, or one scale for all maps
    values = displayed(page)
    assert page.locator("#colorbar-hi").inner_text() == "max"
    np.testing.assert_array_equal(
        canvas_rgb(page, 2, 5),
        VIRIDIS[np.round(255 * values[2][5] / values[2][5].max()).astype(int)],
    )
    page.locator("input[name=scale][value=shared]").check()
    top = max(v.max() for v in values)
    np.testing.assert_array_equal(
        canvas_rgb(page, 2, 5), VIRIDIS[np.round(255 * values[2][5] / top).astype(int)]
    )
    assert page.locator("#colorbar-hi").inner_text() == f"{top:.3f}"
    page.locator("input[name=scale][value=map]").check()

    # the content model: per image, from the model's own forward pass
    switch_model(page, 2, "learned-content-fashion")
    assert page.locator("#hover-readout").inner_text() == "Hover a map to read its values."
    model = load_pretrained("learned-content-fashion", weights)
    images, captions = sample_images("fashion-mnist", weights)
    with torch.no_grad():
        _, per_image = model(images, return_attention=True)
    thumbs = page.locator("#images button")
    assert thumbs.count() == 3
    assert thumbs.nth(2).get_attribute("aria-label") == "average over 6 test images"

    def check(token, expected):
        index = token[0] * 14 + token[1]
        for layer, values in enumerate(displayed(page)):
            np.testing.assert_allclose(values, expected[layer][:, index], rtol=2e-3, atol=1e-6)

    token = (13, 0)
    click_token(page, token, grid)
    check(token, [p[0].double().numpy() for p in per_image])
    assert page.locator("#query-readout").inner_text().startswith(f"{captions[0]}: query token")
    thumbs.nth(0).focus()  # the thumbnails are buttons: Tab reaches the next, Enter picks it
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    assert thumbs.nth(1).get_attribute("aria-pressed") == "true"
    check(token, [p[1].double().numpy() for p in per_image])
    thumbs.nth(2).click()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 2")
    assert page.locator("#softmax").is_disabled()  # the average is of probabilities
    average = compute_attention(model, (28, 28), images).probs
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(values, average[layer][:, 13 * 14].double(), atol=1e-5)
    page.screenshot(path=ARTIFACTS / "explorer_shipped_average.png", full_page=True)

    # logits: the readout names them, and changes with the image without moving the mouse
    thumbs.nth(0).click()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 0")
    probability = hover_value(page, 3, 1, key, "probability")
    assert probability == pytest.approx(
        float(per_image[3][0, 1, 13 * 14, key[0] * 14 + key[1]]), rel=3e-3
    )
    page.locator("#softmax").uncheck()
    logits = displayed(page)
    logit = readout_value(page, 3, 1, key, "logit")
    assert logit == pytest.approx(float(logits[3][1][key[0] * 14 + key[1]]), rel=1e-3)
    page.locator("#images button").nth(1).press("Enter")
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    other = readout_value(page, 3, 1, key, "logit")
    assert other == pytest.approx(float(displayed(page)[3][1][key[0] * 14 + key[1]]), rel=1e-3)
    assert other != logit
    page.locator("#softmax").check()

    # back to a position-only model: named, its own maps again
    switch_model(page, 1, "learned-fashion")
    learned = load_pretrained("learned-fashion", weights)
    centre = 7 * 14 + 7
    for layer, values in zip(learned.attention_layers(), displayed(page), strict=True):
        np.testing.assert_allclose(
            values, layer.attention_probs(*grid)[:, centre].detach().double(), atol=1e-6
        )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_shipped.png", full_page=True)
    assert errors == []
    page.close()

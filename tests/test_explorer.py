"""End to end: the explorer in headless Chromium, opened from file://, clicked, read back.

The page exposes what it draws as ``window.attnconv.maps[layer][head]``; the tests compare those
arrays (and the canvas pixels) with the model's own attention probabilities for the clicked
query tokens, and save screenshots to ``test-artifacts/``.
"""

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from playwright.sync_api import sync_playwright

from attnconv.viz.export import dequantize, write_site
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
    page.wait_for_function("window.attnconv && window.attnconv.ready", timeout=20_000)
    return page, errors


def click_token(page, token, grid):
    """Click the centre of token ``(row, col)`` on the query picker."""
    box = page.locator("#picker").bounding_box()
    page.mouse.click(
        box["x"] + (token[1] + 0.5) / grid[1] * box["width"],
        box["y"] + (token[0] + 0.5) / grid[0] * box["height"],
    )
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
    assert page.locator("#images canvas").count() == 0  # position-only: no images needed
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
    text = (site / "images" / f"image_{image:03d}.js").read_text()
    entry = json.loads(text[text.index("] = {") + 4 : text.rindex(";")])["layers"][layer]
    content = dequantize(entry["content"])[:, query]
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
    assert page.locator("#images canvas").count() == 2

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

    page.locator("#images canvas").nth(1).click()
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
        json.loads((tmp_path / "data.js").read_text().split("= ", 1)[1].rstrip(";\n"))["images"][0][
            "pixels"
        ]
    )
    assert list(pixels) == grey.flatten().tolist()
    page.close()

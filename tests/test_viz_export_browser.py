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
from attnconv.models import create_model
from attnconv.models.pretrained import load_pretrained, sample_images
from attnconv.viz.export import (
    PreparedModel,
    SiteModel,
    decode_content,
    dequantize,
    model_score_terms,
    read_data,
    recorded_explorer_data,
    write_explorer,
    write_site,
)
from attnconv.viz.maps import FLOOR, compute_attention, scale_top
from explorer_helpers import ACCURACY, TRANSFORMED_ACCURACY, recorded_model, shipped_folder
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
HOVER_HELP = "Hover or tap a map to read its values."
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


def colours(values, top):
    """The viridis colours the page draws ``values`` in on a probability scale from 0 to ``top``."""
    return VIRIDIS[np.clip(np.round(255 * values / top), 0, 255).astype(int)]


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
        expected_rgb = colours(values, scale_top(values.max(), 36))
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


def hover_text(page, layer, head, key):
    """Hover key token ``key`` of map (layer, head) of a 14x14 model; the readout."""
    page.mouse.move(*at_token(map_box(page, layer, head), key, (14, 14)))
    return page.locator("#hover-readout").inner_text()


def readout_value(page, layer, head, key, kind):
    text = page.locator("#hover-readout").inner_text()
    # probabilities are followed by their multiple of the uniform level, "(1.3/N)"
    match = re.fullmatch(
        rf"layer {layer}, head {head}, key \({key[0]}, {key[1]}\): {kind} (\S+)( \(\S+/N\))?", text
    )
    assert match, text
    return float(match.group(1))


def switch_model(page, index, name):
    page.locator("#model-select").select_option(str(index))
    page.wait_for_function(f"window.attnconv.ready && window.attnconv.model == {index}")
    assert page.locator("#model-name").inner_text() == name
    assert name in page.title()
    accuracy = (
        f"test accuracy {100 * {**ACCURACY, **TRANSFORMED_ACCURACY}[name]:.1f}% on fashion-mnist"
    )
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

    # colour bar: per map from 0 to the map's maximum, or one scale for all maps (at least 4/N)
    values = displayed(page)
    assert page.locator("#colorbar-hi").inner_text() == "max (≥ 4/N)"
    np.testing.assert_array_equal(
        canvas_rgb(page, 2, 5), colours(values[2][5], scale_top(values[2][5].max(), 196))
    )
    page.locator("input[name=scale][value=shared]").check()
    top = scale_top(max(v.max() for v in values), 196)
    np.testing.assert_array_equal(canvas_rgb(page, 2, 5), colours(values[2][5], top))
    assert float(page.locator("#colorbar-hi").inner_text()) == pytest.approx(top, rel=5e-3)
    page.locator("input[name=scale][value=map]").check()

    # the content model: per image, from the model's own forward pass
    switch_model(page, 2, "learned-content-fashion")
    assert page.locator("#hover-readout").inner_text() == HOVER_HELP
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
    # the keyboard, not the mouse, and no scroll (the page is taller than the window): the
    # pointer stays on the map
    page.evaluate("document.getElementById('softmax').focus({preventScroll: true})")
    page.keyboard.press("Space")
    page.wait_for_function("!window.attnconv.state.softmax")
    logits = displayed(page)
    logit = readout_value(page, 3, 1, key, "logit")
    assert logit == pytest.approx(float(logits[3][1][key[0] * 14 + key[1]]), rel=1e-3)
    page.locator("#images button").nth(1).press("Enter")
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    other = readout_value(page, 3, 1, key, "logit")
    assert other == pytest.approx(float(displayed(page)[3][1][key[0] * 14 + key[1]]), rel=1e-3)
    assert other != logit
    page.locator("#softmax").check()

    # back to a position-only model: named, its own maps again, at the same query token
    switch_model(page, 1, "learned-fashion")
    assert page.evaluate("window.attnconv.state.query") == [13, 0]
    learned = load_pretrained("learned-fashion", weights)
    for layer, values in zip(learned.attention_layers(), displayed(page), strict=True):
        np.testing.assert_allclose(
            values, layer.attention_probs(*grid)[:, 13 * 14].detach().double(), atol=1e-6
        )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_shipped.png", full_page=True)
    assert errors == []
    page.close()


# ---------------------------------------------------------------- layout, controls, states

SIZES = [(390, 844), (768, 1024), (1300, 900)]  # a phone, a tablet, a desktop
NAMES = ["quadratic-fashion", "learned-fashion", "learned-content-fashion"]


def open_sized(browser, site, width, height):
    page = browser.new_page(viewport={"width": width, "height": height})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto((site / "index.html").as_uri())
    page.wait_for_function("window.attnconv && window.attnconv.ready", timeout=60_000)
    return page, errors


def in_viewport(box, width, height):
    return (
        box["x"] >= 0
        and box["y"] >= 0
        and box["x"] + box["width"] <= width
        and box["y"] + box["height"] <= height
    )


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_every_model_fits_the_screen_with_the_image_beside_its_maps(
    browser, shipped_site, width, height
):
    _, site = shipped_site
    page, errors = open_sized(browser, site, width, height)
    for index, name in enumerate(NAMES):
        if index:
            switch_model(page, index, name)
        # nothing wider than the screen: no sideways scrolling
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert page.evaluate("document.body.scrollWidth") <= width
        # the image and the whole first row of maps (every head of layer 0) in view together
        assert in_viewport(page.locator("#picker").bounding_box(), width, height)
        maps = page.locator("#maps .map canvas")
        for head in range(9):
            box = maps.nth(head).bounding_box()
            assert in_viewport(box, width, height), (name, head, box)
            assert box["width"] >= 30  # still a map, not a speck
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=ARTIFACTS / f"explorer_{width}x{height}_{name}.png")
    # on a phone the image stays in view while the last layer's maps are scrolled to
    last = page.locator("#maps .map canvas").nth(3 * 9 + 8)
    last.scroll_into_view_if_needed()
    assert in_viewport(page.locator("#picker").bounding_box(), width, height)
    assert in_viewport(last.bounding_box(), width, height)
    assert errors == []
    page.close()


def axe_violations(page):
    """axe-core's violations on the page, every rule set (WCAG 2.0-2.2 A/AA, best practices and
    the experimental rules, among them label-in-name)."""
    from axe_playwright_python.sync_playwright import Axe

    tags = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice", "experimental"]
    options = {"resultTypes": ["violations"], "runOnly": {"type": "tag", "values": tags}}
    found = Axe().run(page, options=options).response["violations"]
    return [f"{v['id']}: {n['html'][:120]}" for v in found for n in v["nodes"]]


@pytest.mark.parametrize(("width", "height"), [SIZES[0], SIZES[2]])
def test_accessibility_checks_pass_for_every_model_and_the_average(
    browser, shipped_site, width, height
):
    _, site = shipped_site
    page, _ = open_sized(browser, site, width, height)
    for index, name in enumerate(NAMES):
        if index:
            switch_model(page, index, name)
        assert axe_violations(page) == [], name
    thumbs = page.locator("#images button")
    average = thumbs.nth(thumbs.count() - 1)
    average.click()
    page.wait_for_function(
        "window.attnconv.ready && window.attnconv.data.images[window.attnconv.state.image].average"
    )
    # the visible tag is part of the button's accessible name (WCAG 2.5.3 label in name)
    tag = average.locator("span").inner_text()
    assert tag.lower() in average.get_attribute("aria-label").lower()
    assert axe_violations(page) == []
    page.close()


def test_the_page_says_what_it_shows(browser, shipped_site):
    _, site = shipped_site
    page, _ = open_sized(browser, site, *SIZES[0])
    about = page.locator("#about")
    assert in_viewport(about.bounding_box(), *SIZES[0])
    text = " ".join(about.inner_text().split())
    assert "query token" in text and "head" in text and "layer" in text
    links = about.locator("a")
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert "https://arxiv.org/abs/1911.03584" in hrefs and len(hrefs) >= 2
    page.close()


def test_query_and_image_are_kept_across_model_switches(browser, shipped_site):
    weights, site = shipped_site
    page, errors = open_site(browser, site)
    token = (2, 11)
    click_token(page, token, (14, 14))
    page.locator("#images button").nth(1).click()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    switch_model(page, 2, "learned-content-fashion")
    assert page.evaluate("window.attnconv.state.query") == list(token)
    assert page.evaluate("window.attnconv.state.image") == 1  # the same test image
    model = load_pretrained("learned-content-fashion", weights)
    images, captions = sample_images("fashion-mnist", weights)
    with torch.no_grad():
        _, probs = model(images[1:2], return_attention=True)
    index = token[0] * 14 + token[1]
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(values, probs[layer][0][:, index], rtol=2e-3, atol=1e-6)
    assert (
        page.locator("#query-readout")
        .inner_text()
        .startswith(f"{captions[1]}: query token (row 2, col 11)")
    )
    switch_model(page, 1, "learned-fashion")
    learned = load_pretrained("learned-fashion", weights)
    for layer, values in zip(learned.attention_layers(), displayed(page), strict=True):
        np.testing.assert_allclose(
            values, layer.attention_probs(14, 14)[:, index].detach(), atol=1e-6
        )
    assert errors == []
    page.close()


def test_a_query_moves_to_the_same_place_on_a_finer_grid(browser, tmp_path):
    coarse, _ = small_model("quadratic", image_size=(12, 12), stem=2)  # 6×6 tokens
    fine, _ = small_model("learned", image_size=(12, 12), stem=1, max_size=12)  # 12×12 tokens
    write_explorer(
        [SiteModel("coarse", coarse, (12, 12)), SiteModel("fine", fine, (12, 12))], tmp_path
    )
    page, errors = open_site(browser, tmp_path)
    click_token(page, (5, 1), (6, 6))  # pixels 10-11 × 2-3
    page.locator("#model-select").select_option("1")
    page.wait_for_function("window.attnconv.ready && window.attnconv.model == 1")
    assert page.evaluate("window.attnconv.state.query") == [11, 3]
    page.locator("#model-select").select_option("0")
    page.wait_for_function("window.attnconv.ready && window.attnconv.model == 0")
    assert page.evaluate("window.attnconv.state.query") == [5, 1]
    assert errors == []
    page.close()


def test_average_view_controls_show_what_the_maps_show(browser, shipped_site):
    weights, site = shipped_site
    page, _ = open_site(browser, site)
    switch_model(page, 2, "learned-content-fashion")
    page.locator("input[name=mode][value=content]").check()
    page.locator("#softmax").uncheck()
    thumbs = page.locator("#images button")
    thumbs.nth(2).click()  # the average over the 6 test images
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 2")
    assert page.locator("input[name=mode][value=total]").is_checked()
    assert page.locator("#softmax").is_checked()
    assert page.locator("input[name=mode][value=content]").is_disabled()
    assert page.locator("#softmax").is_disabled()
    note = page.locator("#modes-note")
    assert note.is_visible()
    assert note.inner_text() == (
        "The average over 6 test images is of the attention probabilities of the total score."
    )
    model = load_pretrained("learned-content-fashion", weights)
    images, _ = sample_images("fashion-mnist", weights)
    average = compute_attention(model, (28, 28), images).probs
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(values, average[layer][:, 7 * 14 + 7], atol=1e-5)
    assert page.locator("#colorbar-caption").inner_text().startswith("probability")
    # a single image again: the choice made before comes back, and the maps follow it
    thumbs.nth(0).click()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 0")
    assert page.locator("input[name=mode][value=content]").is_checked()
    assert not page.locator("#softmax").is_checked() and page.locator("#softmax").is_enabled()
    assert note.is_hidden()
    assert page.locator("#colorbar-caption").inner_text().startswith("logit")
    page.close()


def caption_numbers(page, layer, head, heads):
    text = page.locator("#maps .map .scale").nth(layer * heads + head).inner_text()
    return text, [float(v) for v in re.findall(r"-?\d+\.?\d*(?:e-?\d+)?", text.split("=")[0])]


def test_captions_keep_three_significant_digits_of_small_logits(browser, tmp_path):
    model, _ = small_model("learned-content")
    with torch.no_grad():  # positional logits of a few thousandths
        for layer in model.attention_layers():
            for table in layer.position.parameters():
                table.mul_(2e-3)
            layer.query.weight.mul_(2e-2)
    images = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    write_site(model, tmp_path, (8, 8), images)
    page, errors = open_site(browser, tmp_path)
    page.locator("input[name=mode][value=position]").check()
    page.locator("#softmax").uncheck()
    page.wait_for_function("window.attnconv.ready && !window.attnconv.state.softmax")
    maps = displayed(page)
    spans = []
    for layer in range(2):
        for head in range(3):
            values = maps[layer][head]
            text, (lo, hi) = caption_numbers(page, layer, head, 3)
            span = values.max() - values.min()
            spans.append(span)
            assert not re.search(r"(^|[^\d])-0(\.0*)?(?![\d.])", text), text  # no "-0.0"
            assert lo == pytest.approx(values.min(), abs=span / 200)
            assert hi == pytest.approx(values.max(), abs=span / 200)
    assert max(spans) < 0.05  # small logits indeed: one decimal would have shown "-0.0 … 0.0"
    # probabilities: three significant digits and their multiple of 1/N
    page.locator("#softmax").check()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.softmax")
    values = displayed(page)[1][2]
    text, (peak,) = caption_numbers(page, 1, 2, 3)
    assert peak == pytest.approx(values.max(), rel=5e-3)
    assert re.fullmatch(r"\d\.\d+(e-\d+)? = \d+(\.\d)?/N", text), text
    assert len(text.split(" ")[0].replace(".", "").lstrip("0")) == 3
    assert float(text.split("= ")[1].removesuffix("/N")) == pytest.approx(
        64 * values.max(), abs=0.051
    )
    assert errors == []
    page.close()


def test_a_new_image_shows_a_loading_state_until_its_maps_are_ready(browser, shipped_site):
    _, site = shipped_site
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    held = []
    # the image's data file is held back until the test lets it through (file:// requests are
    # only intercepted when the route exists before the page loads)
    page.route("**/models/2/image_001.js", lambda route: held.append(route))
    page.goto((site / "index.html").as_uri())
    page.wait_for_function("window.attnconv && window.attnconv.ready", timeout=60_000)
    switch_model(page, 2, "learned-content-fashion")
    first = displayed(page)
    page.locator("#images button").nth(1).click()
    page.wait_for_function("document.getElementById('maps').getAttribute('aria-busy') == 'true'")
    assert held
    assert not page.evaluate("window.attnconv.ready")
    assert "stale" in page.locator("#maps").get_attribute("class")
    status = page.locator("#status").inner_text()
    assert status.startswith("computing the attention for test 1:")
    assert page.locator("#hover-readout").inner_text() == HOVER_HELP
    np.testing.assert_array_equal(displayed(page)[0], first[0])  # still the old maps, greyed
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_loading.png")
    held[0].continue_()
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 1")
    assert page.locator("#maps").get_attribute("aria-busy") == "false"
    assert "stale" not in (page.locator("#maps").get_attribute("class") or "")
    assert page.locator("#status").inner_text() == ""
    assert np.abs(displayed(page)[0] - first[0]).max() > 1e-3
    page.close()


def test_dragging_reaches_every_edge_of_the_image(browser, shipped_site):
    _, site = shipped_site
    page, _ = open_site(browser, site)
    box = page.locator("#picker").bounding_box()
    centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.move(*centre)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] + 40, box["y"] + box["height"] + 40, steps=8)
    page.wait_for_function("window.attnconv.state.query.join() == '13,13'")
    page.mouse.move(box["x"] - 40, box["y"] - 40, steps=8)
    page.wait_for_function("window.attnconv.state.query.join() == '0,0'")
    page.mouse.up()
    page.mouse.move(box["x"] + box["width"] + 40, centre[1])  # no button: the query stays
    assert page.evaluate("window.attnconv.state.query") == [0, 0]
    page.close()


def test_hover_readout_is_cleared_when_the_pointer_leaves_the_maps(browser, shipped_site):
    _, site = shipped_site
    page, _ = open_site(browser, site)
    value = hover_value(page, 0, 3, (6, 8), "probability")
    assert value == pytest.approx(float(displayed(page)[0][3][6 * 14 + 8]), rel=1e-3)
    page.mouse.move(5, 5)  # the header
    assert page.locator("#hover-readout").inner_text() == HOVER_HELP
    page.close()


def test_the_uniform_level_is_named_and_marked(browser, shipped_site):
    _, site = shipped_site
    page, _ = open_site(browser, site)
    switch_model(page, 1, "learned-fashion")
    assert (
        page.locator("#uniform-caption")
        .inner_text()
        .startswith("Uniform attention: 1/N = 0.00510 on each of the N = 196 tokens")
    )
    assert page.locator("#colorbar-uniform").is_hidden()  # per-map scales: no single place
    maps = displayed(page)
    for layer, head in [(0, 0), (3, 8)]:
        text, _ = caption_numbers(page, layer, head, 9)
        times, expected = (
            float(text.split("= ")[1].removesuffix("/N")),
            196 * maps[layer][head].max(),
        )
        # one decimal below 10, whole numbers above
        assert times == pytest.approx(expected, abs=0.051 if expected < 9.95 else 0.51)
    value = hover_value(page, 2, 4, (3, 3), "probability")
    multiple = re.search(r"\((\S+)/N\)$", page.locator("#hover-readout").inner_text()).group(1)
    assert float(multiple) == pytest.approx(196 * value, abs=0.051 if 196 * value < 9.95 else 0.51)
    page.locator("input[name=scale][value=shared]").check()
    mark = page.locator("#colorbar-uniform")
    assert mark.is_visible() and mark.inner_text() == "1/N"
    track = page.locator("#colorbar-track").bounding_box()
    top = scale_top(max(m.max() for m in maps), 196)
    expected = track["x"] + track["width"] * (1 / 196) / top
    assert mark.bounding_box()["x"] == pytest.approx(expected, abs=2)
    page.close()


def test_near_uniform_maps_stay_dark_and_peaked_maps_reach_the_top_colour(browser, tmp_path):
    """Probability scales reach at least 4/N, per map and shared: a head spread over the whole
    6x6 grid (its maximum about 1.03/N) is drawn in the dark quarter of the colour map, a head on
    one token reaches its top colour; logits keep the scale from their minimum to their maximum."""
    model, _ = small_model("quadratic", image_size=(12, 12), stem=2)
    with torch.no_grad():
        position = model.attention_layers()[0].position
        position.centers.zero_()
        position.spread[0] = 0.05  # near-uniform
        position.spread[1] = 3.0  # all but on the query token
    content, _ = small_model("learned-content")
    images = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    site = [
        SiteModel("gaussian", model, (12, 12)),
        SiteModel("content", content, (8, 8), images=images),
    ]
    write_explorer(site, tmp_path)
    page, errors = open_site(browser, tmp_path)
    caption = page.locator("#colorbar-caption").inner_text()
    assert caption == (
        "probability, each map from 0 to its maximum "
        "(at least 4/N so that near-uniform maps stay dark), printed under it"
    )
    assert "least 4/N (N the map's key tokens)" in page.locator(".help").inner_text()
    click_token(page, (2, 3), (6, 6))
    maps = displayed(page)
    uniform, peaked = maps[0][:2]
    assert 1.0 < 36 * uniform.max() < 1.1 and peaked.max() > 0.9
    for scale in ("map", "shared"):
        page.locator(f"input[name=scale][value={scale}]").check()
        page.wait_for_function(f"window.attnconv.state.scale == '{scale}'")
        top = FLOOR / 36 if scale == "map" else scale_top(max(m.max() for m in maps), 36)
        assert page.evaluate("window.attnconv.scales[0][0][1]") == pytest.approx(top, rel=1e-12)
        drawn = canvas_rgb(page, 0, 0)
        np.testing.assert_array_equal(drawn, colours(uniform, top))
        # the brightest token of the near-uniform map: at most a quarter up the colour map
        brightest = np.abs(VIRIDIS[None] - drawn[:, None]).sum(-1).argmin(1).max()
        assert brightest <= round(255 * 1.1 / 4)
        # the peaked map on the query token: the colour of its maximum on this scale, the top
        # colour (or next to it on the shared scale, whose top may be another map's maximum)
        np.testing.assert_array_equal(
            canvas_rgb(page, 0, 1),
            colours(peaked, scale_top(peaked.max(), 36) if scale == "map" else top),
        )
        assert np.abs(canvas_rgb(page, 0, 1)[2 * 6 + 3] - VIRIDIS[255]).max() <= 3
    caption = page.locator("#colorbar-caption").inner_text()
    assert caption.endswith(
        "0 to their largest value (at least 4/N so that near-uniform maps stay dark)"
    )
    page.locator("input[name=scale][value=map]").check()
    page.screenshot(path=tmp_path / "near-uniform.png", full_page=True)
    # logits have no uniform level: each map still spans its minimum to its maximum
    page.locator("#model-select").select_option("1")
    page.wait_for_function("window.attnconv.ready && window.attnconv.model == 1")
    page.locator("#softmax").uncheck()
    page.wait_for_function("window.attnconv.ready && !window.attnconv.state.softmax")
    assert page.locator("#colorbar-hi").inner_text() == "max"
    values = displayed(page)[1][2]
    lo, hi = values.min(), values.max()
    expected = VIRIDIS[np.round(255 * (values - lo) / (hi - lo)).astype(int)]
    np.testing.assert_array_equal(canvas_rgb(page, 1, 2), expected)
    assert errors == []
    page.close()


def test_a_transformed_network_beside_a_shipped_model(browser, tmp_path):
    """`explore --pretrained all` with a shipped T-CNN: for the clicked pixel each transformed
    layer's heads attend from the output pixel nearest it over that layer's own input grid,
    as TransformedConv2d.attention computes it (one image, then the average)."""
    from attnconv.viz.transformed import transformed_attention

    weights = shipped_folder(tmp_path / "weights", ("quadratic-fashion", "tcnn-fashion-small"))
    site = tmp_path / "site"
    argv = ["explore", "--pretrained", "all", "--weights-dir", str(weights), "--out", str(site)]
    assert main([*argv, "--images", "2"]) == 0
    page, errors = open_site(browser, site)
    click_token(page, (7, 7), (14, 14))  # quadratic-fashion's token: pixels 14-15 × 14-15
    assert page.locator("#content-readout").is_hidden()  # position-only: no content attention
    switch_model(page, 1, "tcnn-fashion-small")
    assert page.evaluate("window.attnconv.state.query") == [15, 15]  # the same place, in pixels
    assert page.locator("#modes").is_hidden()  # probabilities: no score terms to switch
    meta = page.locator("#meta").inner_text()
    assert "stages.2.0.conv1 14×14 → 7×7" in meta and "stages.3.1.conv2 4×4 → 4×4" in meta
    model = load_pretrained("tcnn-fashion-small", weights)
    images, _ = sample_images("fashion-mnist", weights)
    # its content diagnostics on the 6 shipped images, without labels (no accuracies) or a start
    from attnconv.analysis.content import content_diagnostics

    diagnostics = content_diagnostics(model, images)
    lines = page.locator("#content-readout p").all_inner_texts()
    assert lines[0].startswith("Content attention on 6 test images: entropy ÷ log N")
    for line, layer in zip(lines[1:-1], diagnostics.layers, strict=True):
        assert line.startswith(f"{layer.name} (N {layer.keys}): entropy ÷ log N ")
        assert line.endswith(f"· uniform: {layer.changed} of 6 predictions changed")
        assert "of the start" not in line  # random weights: no start recorded
    assert lines[-1] == f"every layer uniform at once: {diagnostics.changed} of 6 predictions changed"
    sizes = page.evaluate(
        "Array.from(document.querySelectorAll('#maps .map canvas'), c => [c.width, c.height])"
    )
    keys = [(14, 14)] + [(7, 7)] * 4 + [(4, 4)] * 3
    assert sizes == [list(key) for key in keys for _ in range(9)]

    def check(layers, pixel):
        queries = page.evaluate("window.attnconv.queries")
        assert queries == [list(layer.query_for_image_pixel(pixel)) for layer in layers]
        for layer, query, values in zip(layers, queries, displayed(page), strict=True):
            expected = layer.probs[:, query[0] * layer.query_grid[1] + query[1]]
            np.testing.assert_allclose(values, expected.numpy(), atol=2e-5)
        return queries

    first = transformed_attention(model, images[:1])
    assert check(first, (15, 15)) == [[3, 3]] * 4 + [[2, 2]] * 4
    # the outline on a stride-2 layer's map is the query's input pixel (6, 6) of 14×14
    canvas = map_box(page, 0, 4)
    outline = page.locator("#maps .map .marker").nth(4).bounding_box()
    assert outline["x"] == pytest.approx(canvas["x"] + 6 / 14 * canvas["width"], abs=1)
    assert outline["width"] == pytest.approx(canvas["width"] / 14, abs=1)
    click_token(page, (27, 0), (28, 28))
    assert check(first, (27, 0)) == [[6, 0]] * 4 + [[3, 0]] * 4
    page.locator("#images button").nth(2).click()  # the average over the 6 shipped images
    page.wait_for_function("window.attnconv.ready && window.attnconv.state.image == 2")
    check(transformed_attention(model, images), (27, 0))
    page.locator("#maps .map canvas").nth(5 * 9 + 1).scroll_into_view_if_needed()
    page.mouse.move(*at_token(map_box(page, 5, 1), (3, 0), (4, 4)))  # a 4×4 input's corner
    value = readout_value(page, 5, 1, (3, 0), "probability")
    assert value == pytest.approx(float(displayed(page)[5][1][3 * 4 + 0]), rel=1e-3)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_tcnn.png", full_page=True)
    assert errors == []
    page.close()


def test_the_content_readout_says_for_each_layer_whether_its_content_attention_is_alive(
    browser, tmp_path
):
    """A transformed network with its content diagnostics (attnconv.analysis.content): one line
    per layer with the entropy range of its heads' content maps, its gates, its query and key
    norms against the start and the uniform-content ablation; none on a model without them."""
    from attnconv.analysis.content import content_diagnostics
    from attnconv.models.checkpoint import build_model
    from viz_helpers import small_model, transformed_checkpoint

    model = build_model(transformed_checkpoint())  # gates 0.1·h
    start = build_model(transformed_checkpoint(moved=False))  # the same queries and keys
    with torch.no_grad():
        for layer in model.transformed_layers().values():
            layer.key.weight.mul_(0.5)
    images = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([0, 1, 2])
    diagnostics = content_diagnostics(model, images, labels, start, "its start")
    quadratic, _ = small_model("quadratic")
    site = tmp_path / "site"
    write_explorer(
        [
            SiteModel("tcnn", model.eval(), (16, 16), images=images[:1], labels=["one"],
                      average_images=images, content=diagnostics.to_dict()),
            SiteModel("quadratic", quadratic, (8, 8)),
        ],
        site,
    )  # fmt: skip
    page, errors = open_site(browser, site)
    lines = page.locator("#content-readout p").all_inner_texts()
    assert lines[0] == (
        f"Content attention on 3 test images (accuracy {100 * diagnostics.accuracy:.2f}%): "
        "entropy ÷ log N of each head's content map (1: uniform, 0: one-hot); uniform: the "
        "predictions that change when the layer's content maps are replaced by uniform attention."
    )
    assert len(lines) == 1 + 8 + 1
    for line, layer in zip(lines[1:-1], diagnostics.layers, strict=True):
        low, high = min(layer.entropy), max(layer.entropy)
        entropy = f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}–{high:.3f}"
        assert line == (
            f"{layer.name} (N {layer.keys}): entropy ÷ log N {entropy} · gate 0.00–0.80 · "
            f"q, k norms ×1.00, ×0.50 of the start · uniform: {layer.changed} of 3 predictions "
            f"changed, accuracy {100 * layer.accuracy:.2f}%"
        )
    assert lines[-1] == (
        f"every layer uniform at once: {diagnostics.changed} of 3 predictions changed, accuracy "
        f"{100 * diagnostics.ablated_accuracy:.2f}%"
    )
    page.locator("#model-select").select_option("1")
    page.wait_for_function("window.attnconv.ready && window.attnconv.model == 1")
    assert page.locator("#content-readout p").count() == 0
    assert page.locator("#content-readout").is_hidden()
    assert errors == []
    page.close()


# ---------------------------------------------------------------- class token, scores, precision


@pytest.fixture(scope="module")
def class_token_site(tmp_path_factory):
    """A page of a recorded tiny ViT with a class token, the same ViT without one, and vit-fashion
    (content scores only, no class token); with the ViT and its images."""
    site = tmp_path_factory.mktemp("class_token")
    entry, model, images = recorded_model()
    without, _, _ = recorded_model(class_token=False, name="timm:tiny-vit-registers")
    torch.manual_seed(4)
    vit = create_model("vit-fashion").eval()
    pictures = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    plain = SiteModel("vit-fashion", vit, (28, 28), images=pictures, average_images=pictures)
    write_explorer([entry, without, plain], site, title="class tokens")
    return site, model, images


def set_view(page, value):
    page.locator(f"input[name=view][value={value}]").check()
    page.wait_for_function(f"window.attnconv.ready && window.attnconv.state.view == '{value}'")


def test_class_token_and_rollout_views_draw_the_recorded_attention(browser, class_token_site):
    from test_analysis_rollout import direct_attention, direct_rollout

    site, model, images = class_token_site
    probs = direct_attention(model, images)  # per layer (B, heads, 17, 17), the class token first
    page, errors = open_site(browser, site)
    assert page.locator("#view-choice").is_visible() and page.locator("#overlay").is_visible()
    assert page.locator("#accuracy").inner_text() == "test accuracy — (not measured)"
    set_view(page, "class")
    assert page.locator("#modes").is_hidden()  # the score terms are of the per-head maps
    for layer, values in enumerate(displayed(page)):
        np.testing.assert_allclose(values, probs[layer][0, :, 0, 1:], atol=2e-5)
    assert page.locator("#maps .map .scale").first.inner_text().endswith("/N")
    set_view(page, "rollout")
    click_token(page, (2, 1), (4, 4))
    rollout = direct_rollout(probs, 0)[:, 1:]
    rows = rollout / rollout.sum(axis=1, keepdims=True)  # the class token's row, then the patches'
    (shown,) = displayed(page)
    np.testing.assert_allclose(shown, rows[[1 + 2 * 4 + 1, 0]], atol=2e-5)
    # the query's own weight is left out of its map's scale: the largest other key is the top
    # (at least 4/N)
    others = np.delete(shown[0], 2 * 4 + 1)
    top = page.evaluate("window.attnconv.scales[0][0][1]")
    assert top == pytest.approx(scale_top(others.max(), 16), abs=1e-12)
    hovered = at_token(page.locator("#maps .map canvas").first.bounding_box(), (0, 3), (4, 4))
    page.mouse.move(*hovered)
    text = page.locator("#hover-readout").inner_text()
    assert text.startswith("rollout of the query token (row 2, col 1), key (0, 3): rollout weight")
    # the maps over the image: the image in grey behind each map, drawn translucent
    page.locator("#overlay").check()
    page.wait_for_function("window.attnconv.state.overlay")
    frame = page.locator("#maps .map .frame").first
    assert frame.evaluate("el => getComputedStyle(el).backgroundImage").startswith("url(")
    canvas = page.locator("#maps .map canvas").first
    assert canvas.evaluate("el => getComputedStyle(el).opacity") == "0.65"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / "explorer_rollout.png", full_page=True)
    # no class token: no views to offer, and the per-head maps come back
    for index, name in [(1, "timm:tiny-vit-registers"), (2, "vit-fashion")]:
        page.locator("#model-select").select_option(str(index))
        page.wait_for_function(f"window.attnconv.ready && window.attnconv.model == {index}")
        assert page.locator("#model-name").inner_text() == name
        assert page.locator("#view-choice").is_hidden()
        assert page.evaluate("window.attnconv.state.view") == "heads"
        assert page.locator("#overlay").is_visible()  # the images are there to draw over
    assert errors == []
    page.close()
    # on a phone, each view fits the screen and passes the accessibility checks
    page, errors = open_sized(browser, site, 390, 844)
    for value in ("class", "rollout"):
        set_view(page, value)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert axe_violations(page) == [], value
    page.screenshot(path=ARTIFACTS / "explorer_rollout_390.png", full_page=True)
    assert errors == []
    page.close()


def test_only_the_score_controls_a_model_has_are_offered_and_named(
    browser, shipped_site, class_token_site
):
    _, site = shipped_site
    page, errors = open_site(browser, site)
    switch_model(page, 2, "learned-content-fashion")  # both terms
    labels = page.locator("#modes label")
    assert [labels.nth(i).is_visible() for i in range(4)] == [True] * 4
    assert page.locator("#softmax-label").inner_text() == "softmax"
    page.close()
    site, _, _ = class_token_site
    page, more = open_site(browser, site)
    labels = page.locator("#modes label")
    for index in (0, 2):  # recorded (log-probabilities), vit-fashion (content only)
        if index:
            page.locator("#model-select").select_option(str(index))
            page.wait_for_function(f"window.attnconv.ready && window.attnconv.model == {index}")
        # no "position only" (blank maps) nor "content only" (the total again): softmax alone
        assert [labels.nth(i).is_visible() for i in range(4)] == [False, False, False, True]
        assert page.evaluate("window.attnconv.maps.flat().every(m => m !== null)")
    page.locator("#model-select").select_option("0")
    page.wait_for_function("window.attnconv.ready && window.attnconv.model == 0")
    assert page.locator("#softmax-label").inner_text() == "softmax, else log-probability"
    page.locator("#softmax").uncheck()
    page.wait_for_function("window.attnconv.ready && !window.attnconv.state.softmax")
    assert page.locator("#colorbar-caption").inner_text().startswith("log-probability, ")
    first = page.locator("#maps .map canvas").first.bounding_box()
    page.mouse.move(*at_token(first, (1, 1), (4, 4)))
    assert ": log-probability -" in page.locator("#hover-readout").inner_text()
    assert errors == [] and more == []
    page.close()


def test_the_desktop_picker_stays_in_view_beside_twelve_layers(browser, tmp_path):
    """12 layers of 3 heads (a ViT-Tiny's) are taller than the window: scrolled to the last layer,
    the image and the settings beside the maps are still in view."""
    generator = torch.Generator().manual_seed(6)
    probs = [torch.rand(3, 196, 196, generator=generator).softmax(-1) for _ in range(12)]
    images = torch.rand(2, 3, 224, 224, generator=generator)
    data, files = recorded_explorer_data(
        [probs, probs], (14, 14), 16, images, ["a", "b"], probs, images
    )
    write_explorer([PreparedModel("timm:deep", data, files)], tmp_path)
    page, errors = open_sized(browser, tmp_path, 1300, 900)
    last = page.locator("#maps .map canvas").nth(11 * 3 + 2)
    last.scroll_into_view_if_needed()
    assert page.evaluate("window.scrollY") > 500  # the maps did scroll
    assert in_viewport(last.bounding_box(), 1300, 900)
    assert in_viewport(page.locator("#picker").bounding_box(), 1300, 900)
    assert page.locator("#softmax").is_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1300
    assert errors == []
    page.close()


def test_the_hover_readout_prints_only_the_digits_the_stored_logits_guarantee(
    browser, shipped_site
):
    """learned-content-fashion's positional logits are stored as 16-bit codes (error up to a
    step, ~1e-5 here): the readout prints fewer than four significant digits where the fourth is
    not sure, and every digit it prints is right to one unit of the last."""
    weights, site = shipped_site
    page, errors = open_site(browser, site)
    switch_model(page, 2, "learned-content-fashion")
    page.locator("input[name=mode][value=position]").check()
    page.locator("#softmax").uncheck()
    page.wait_for_function("window.attnconv.ready && !window.attnconv.state.softmax")
    model = load_pretrained("learned-content-fashion", weights)
    images, _ = sample_images("fashion-mnist", weights)
    terms = model_score_terms(model, images[:1])
    query = 7 * 14 + 7
    fewer = 0
    for layer, head in [(0, 0), (1, 3), (2, 7), (3, 8)]:
        row, col = terms[layer].position_row[0, head, query], terms[layer].position_col[0, head]
        exact = (row[:, None] + col[query][None, :]).double()  # (14, 14) over the keys
        smallest = divmod(int(exact.abs().argmin()), 14)  # its digits are the fewest sure ones
        for key in [smallest, (0, 0)]:
            text = hover_text(page, layer, head, key)
            printed = re.search(r"logit (\S+)$", text).group(1)
            decimals = len(printed.partition(".")[2])
            assert abs(float(printed) - float(exact[key])) <= 10.0**-decimals, (printed, exact[key])
            fewer += len(printed.lstrip("-0.").replace(".", "")) < 4
    assert fewer > 0  # some values indeed lose their fourth digit
    assert errors == []
    page.close()

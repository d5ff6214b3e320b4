"""The shared look: contrast ratios against WCAG's worked values, text colours, panel grids."""

import pytest

from attnconv.viz.style import (
    HEAD_COLORS,
    MIN_CONTRAST,
    contrast_ratio,
    new_figure,
    panel_axes,
    panel_grid,
    text_color_on,
)


def test_contrast_ratio_matches_known_values():
    assert contrast_ratio("black", "white") == pytest.approx(21.0)
    assert contrast_ratio("#777777", "#777777") == pytest.approx(1.0)
    # WCAG's often quoted limit: #767676 on white is just above 4.5, #777777 just below
    assert contrast_ratio("#767676", "white") == pytest.approx(4.54, abs=0.01)
    assert contrast_ratio("white", "#777777") == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("color", HEAD_COLORS)
def test_text_on_every_head_colour_is_readable(color):
    text = text_color_on(color)
    assert text in ("black", "white")
    assert contrast_ratio(text, color) >= MIN_CONTRAST
    other = "white" if text == "black" else "black"
    assert contrast_ratio(text, color) >= contrast_ratio(other, color)


@pytest.mark.parametrize(
    ("count", "shape"),
    [
        (1, (1, 1)),
        (2, (1, 2)),
        (3, (1, 3)),
        (4, (2, 2)),
        (5, (2, 3)),
        (6, (2, 3)),
        (8, (2, 4)),
        (9, (3, 3)),
        (12, (3, 4)),
        (16, (4, 4)),
        (17, (5, 4)),
    ],
)
def test_panel_grid(count, shape):
    assert panel_grid(count) == shape


def test_panel_axes_leave_no_empty_panel():
    fig = new_figure(6, 4)
    axes = panel_axes(fig, 5)  # a 2×3 grid with one spare cell
    assert len(axes) == 5 and fig.axes == axes
    with pytest.raises(ValueError, match="at least one panel"):
        panel_grid(0)

"""ropelib.viz.heatmaps draws the data it is given, one image per matrix, with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from ropelib.viz.heatmaps import draw_attention_grid, draw_attention_heatmap

TOKENS = ["dog", "bites", "man"]


def agg_figure(**kwargs) -> Figure:
    """A Figure rendered by the Agg backend, whatever pyplot's backend is (no display needed)."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def softmax_rows(n: int, seed: int) -> np.ndarray:
    scores = np.random.default_rng(seed).normal(size=(n, n))
    weights = np.exp(scores)
    return weights / weights.sum(axis=1, keepdims=True)


def test_heatmap_shows_the_matrix_with_token_ticks_and_annotations():
    weights = softmax_rows(3, 0)
    fig = agg_figure()
    ax = fig.add_subplot()
    image = draw_attention_heatmap(ax, weights, TOKENS)
    assert isinstance(image, AxesImage)
    assert ax.get_images() == [image]
    np.testing.assert_array_equal(image.get_array(), weights)
    assert image.get_clim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == TOKENS
    assert [t.get_text() for t in ax.get_yticklabels()] == TOKENS
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"{w:.2f}" for w in weights.ravel()]


def test_heatmap_annotation_colour_follows_the_cell_brightness():
    fig = agg_figure()
    ax = fig.add_subplot()
    draw_attention_heatmap(ax, [[0.0, 1.0]], ["q"], ["a", "b"], cmap="viridis")
    # viridis is dark at 0 and bright yellow at 1
    assert [t.get_color() for t in ax.texts] == ["white", "black"]


def test_heatmap_accepts_a_tensor_with_grad_and_distinct_key_labels():
    weights = torch.softmax(torch.randn(2, 4, requires_grad=True), dim=-1)
    fig = agg_figure()
    ax = fig.add_subplot()
    image = draw_attention_heatmap(ax, weights, ["a", "b"], ["w", "x", "y", "z"], annotate=False)
    np.testing.assert_allclose(image.get_array(), weights.detach().numpy())
    assert len(ax.texts) == 0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]


@pytest.mark.parametrize("weights, labels, match", [
    (np.ones((1, 3, 3)), TOKENS, "2-D"),
    (np.ones((3, 3)), TOKENS[:2], "3 query labels"),
])
def test_heatmap_rejects_bad_inputs(weights, labels, match):
    with pytest.raises(ValueError, match=match):
        draw_attention_heatmap(agg_figure().add_subplot(), weights, labels)


def test_heatmap_rejects_an_empty_colour_range():
    with pytest.raises(ValueError, match="vmin"):
        draw_attention_heatmap(agg_figure().add_subplot(), np.eye(3), TOKENS, vmin=1.0, vmax=1.0)


def test_grid_draws_one_image_per_matrix_and_one_colorbar():
    sentences = [TOKENS, TOKENS[::-1]]
    weights = [[softmax_rows(3, 2 * r + c) for c in range(2)] for r in range(2)]
    fig = agg_figure(figsize=(7, 6))
    axes = draw_attention_grid(fig, weights, sentences, row_titles=["no positions", "RoPE"],
                               col_titles=["dog bites man", "man bites dog"])
    assert axes.shape == (2, 2)
    assert len(fig.axes) == 4 + 1  # the four heatmaps and the colorbar
    for r in range(2):
        for c in range(2):
            (image,) = axes[r, c].get_images()
            np.testing.assert_array_equal(image.get_array(), weights[r][c])
            labels = [t.get_text() for t in axes[r, c].get_yticklabels()]
            assert labels == sentences[c]
    assert [axes[0, c].get_title() for c in range(2)] == ["dog bites man", "man bites dog"]
    assert axes[1, 0].get_ylabel().startswith("RoPE")
    assert isinstance(fig.canvas, FigureCanvasAgg)
    fig.canvas.draw()  # the layout engine and the Agg renderer run without error
    assert fig.canvas.buffer_rgba().shape == (round(6 * fig.dpi), round(7 * fig.dpi), 4)


def test_grid_without_colorbar_or_titles():
    fig = agg_figure()
    axes = draw_attention_grid(fig, [[np.eye(2)]], [["a", "b"]], colorbar=False)
    assert axes.shape == (1, 1)
    assert len(fig.axes) == 1
    assert axes[0, 0].get_title() == ""


@pytest.mark.parametrize("weights, labels, kwargs, match", [
    ([], [], {}, "non-empty"),
    ([[np.eye(2), np.eye(2)], [np.eye(2)]], [["a", "b"]] * 2, {}, "row lengths"),
    ([[np.eye(2)]], [["a", "b"]] * 2, {}, "one token sequence per grid column"),
    ([[np.eye(2)]], [["a", "b"]], {"row_titles": ["x", "y"]}, "row_titles"),
])
def test_grid_rejects_mismatched_inputs(weights, labels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        draw_attention_grid(agg_figure(), weights, labels, **kwargs)

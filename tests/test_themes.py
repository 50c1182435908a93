"""mpinb's views in JupyterLab's Light and Dark themes, and in the HTML export: every text reads at WCAG AA.

The browser test runs a notebook in JupyterLab (Chromium) whose cells draw every view with rows that need a look (a
NaN loss, tensors that differ and hold a NaN, names that differ or are missing, gradients that differ and a NaN
gradient), live (widgets kept) and static (the HTML and PNG a saved notebook keeps), and measures, for every text
element inside the outputs, the contrast ratio between its rendered colour and its effective background (the first
opaque background up its ancestors, with the semi-transparent ones on the way composited over it), in the Light
theme, again after switching to the Dark one, and once more with the static views' HTML alone on a blank page (an
export: none of JupyterLab's CSS or variables). It also reads the live charts: no two texts of a figure overlap, no
NaN label lies on a curve, and the NaN cell of the gradient heatmap is grey. Screenshots are kept (test-artifacts/
and /tmp/mpinb-theme-shots/).

The other tests draw the views without a browser: integer ticks on count axes, NaN grey in the live and static
heatmaps, texts that do not overlap in the static charts, opaque chart images, one headline entry per name.
"""

import contextlib
import json
import math
import shutil
from pathlib import Path

import lab_pages
import numpy as np
import pytest
from conftest import leftover_ranks, new_world_tag
from contrast import AA, contrast, luminance, over, rgb
from lab_pages import ARTIFACTS, notebook_of, run, use_theme
from waiting import wait_for

from mpinb.widgets import colors

SHOTS = Path("/tmp/mpinb-theme-shots")


# ---------------------------------------------------------------------- without a browser


def test_every_ranks_label_looks_alike_but_for_its_swatch():
    """No rank's label reads as flagged: its number is in the theme's text colour, the same for every rank, after a
    swatch of its chart colour (rank 1's orange number on a black chip looked marked beside rank 0's blue on white)."""
    labels = [colors.rank_label(rank) for rank in range(len(colors.PALETTE))]
    for rank, label in enumerate(labels):
        assert label == labels[0].replace(colors.rank_color(0), colors.rank_color(rank)).replace(">0<", f">{rank}<")
        assert f"background:{colors.rank_color(rank)}" in label and "color:" not in label.replace("background:", "")


def test_the_fallback_colours_read_on_white_and_on_their_tints():
    """What a renderer without ``color-mix`` shows: the plain colours, on white and on the tints' plain colours."""
    for name, colour in colors.FALLBACKS.items():
        for background in ("#ffffff", *colors.TINT_FALLBACKS.values()):
            assert contrast(rgb(colour), rgb(background)) >= AA, (name, background)


@pytest.mark.parametrize("ink, page", [((0, 0, 0), (255, 255, 255)), ((255, 255, 255), (17, 17, 17)),
                                       ((255, 255, 255), (33, 33, 33))], ids=["light", "dark", "dark-raised"])
def test_coloured_text_reads_on_the_theme_and_its_tints(ink, page):
    """``color-mix`` of each hue with the theme's text colour (JupyterLab's ``--jp-content-font-color0``), on the
    theme's backgrounds (``--jp-layout-color0`` and 1) bare and under each tint: at least AA, with a margin for the
    row and hover backgrounds JupyterLab lays under tables."""
    backgrounds = [page] + [over(tint, alpha, page) for tint, alpha in (colors.FLAG_TINT, colors.QUIET_TINT)]
    for kind, (hue, share) in colors.HUES.items():
        shown = over(rgb(hue), share / 100, ink)
        for background in backgrounds:
            assert contrast(shown, background) >= AA + 0.4, (kind, background)
    for background in backgrounds:  # muted: the theme's text colour, part transparent
        assert contrast(over(ink, 0.64, background), background) >= AA + 0.4, ("muted", background)


def test_count_axes_tick_integers_only():
    from mpinb.widgets.charts import count_ticks, draw_histograms, histogram_figure

    for top in (0, 1, 3, 7, 17.85, 36.8, 99, 1000, 123456):
        ticks = count_ticks(top)
        assert all(isinstance(t, int) for t in ticks) and ticks[0] == 0 and 2 <= len(ticks) <= 5, (top, ticks)
        assert ticks[-1] <= max(1, math.ceil(top)), (top, ticks)
    figure = histogram_figure("h", "value", "400px")
    draw_histograms(figure, {0: ([3, 36, 12], [0.0, 1.0, 2.0, 3.0]), 1: ([1, 2, 3], [0.0, 1.0, 2.0, 3.0])})
    count = figure.axes[1]
    assert count.label == "count" and list(count.tick_values) == [0, 10, 20, 30]
    assert count.scale.max == pytest.approx(36 * 1.05)
    assert count.label_offset and count.tick_format == "~s"


def test_a_nan_heatmap_cell_is_sent_as_null_and_drawn_grey_live_and_static():
    from mpinb.widgets import static
    from mpinb.widgets.grads import LayerReport, grads_widget

    reports = [LayerReport("0.weight", "parameter", (3,), norm={0: 1.0, 1: 1.0}, grad_norm={0: 1.0, 1: math.nan}),
               LayerReport("0.bias", "parameter", (3,), norm={0: 1.0, 1: 1.0}, grad_norm={0: 2.0, 1: 1.0})]
    widget = grads_widget(reports)
    grid = widget.heatmap.marks[0]
    assert grid.null_color == colors.NAN_COLOR
    sent = grid.get_state()["color"]  # what goes to the browser: bqplot draws null_color for a null only
    assert sent == [[1.0, None], [pytest.approx(4 / 3), pytest.approx(2 / 3)]]
    figure = static.heatmap_figure(["a"], ["rank 0", "rank 1"], np.array([[1.0, math.nan]]), title="t", label="l")
    image = figure.axes[0].images[0]
    assert tuple(round(c * 255) for c in image.cmap.get_bad()[:3]) == rgb(colors.NAN_COLOR)


def test_the_live_colour_bar_has_room_for_its_ticks_and_label():
    """bqplot draws a vertical colour bar from 100 px under the plot's top to 100 px above its bottom, its label
    centred above it: the plot is high enough for five ticks, the right margin wide enough for the label."""
    from mpinb.widgets.grads import HEATMAP_LEGEND, LayerReport, grads_widget

    reports = [LayerReport(f"layer{i}", "parameter", (3,), norm={0: 1.0, 1: 1.0}, grad_norm={0: 1.0, 1: 0.5})
               for i in range(2)]
    heatmap = grads_widget(reports).heatmap
    margin = heatmap.fig_margin
    plot_height = int(heatmap.layout.height.removesuffix("px")) - margin["top"] - margin["bottom"]
    assert plot_height - 200 >= 100
    assert margin["right"] >= 2 * 6.5 * len(HEATMAP_LEGEND) / 2 + 40


def test_each_rank_stays_visible_where_histograms_are_identical():
    from mpinb.widgets import static
    from mpinb.widgets.charts import draw_histograms, histogram_figure

    same = ([5, 9, 4], [0.0, 1.0, 2.0, 3.0])
    histograms = {0: same, 1: same, 2: same, 3: ([1, 1, 1], [0.0, 1.0, 2.0, 3.0])}
    assert colors.identical_groups(histograms) == [[0, 1, 2]]
    widths = colors.stacked_widths(histograms)
    assert widths[0] > widths[1] > widths[2] and widths[3] == widths[2]  # nested bands, the lowest underneath
    figure = histogram_figure("h", "value", "400px")
    legend = __import__("ipywidgets").HTML()
    draw_histograms(figure, histograms, legend=legend)
    assert [mark.stroke_width for mark in figure.marks] == [widths[r] for r in range(4)]
    assert "ranks 0-2 identical" in legend.value
    fig = static.histograms_figure([("same", histograms)], x_label="value")
    (ax,) = fig.axes
    assert len({patch.get_linewidth() for patch in ax.patches[:3]}) == 3
    assert "ranks 0-2 identical" in ax.get_xlabel()


def test_the_nan_label_keeps_clear_of_the_other_curves():
    from mpinb.widgets.charts import LABEL_HEIGHT, LABEL_OFFSETS, PLOT_HEIGHT, nan_label_offset

    steps = np.arange(40.0)
    curves = {rank: (steps, 1.0 / (steps + 1) + 0.3 * rank) for rank in range(4)}
    curves[1] = (steps[:25], curves[1][1][:25])
    others = {rank: curve for rank, curve in curves.items() if rank != 1}
    assert nan_label_offset(25, curves[1][1][-1], {}, curves) == LABEL_OFFSETS[0]  # above, nearest
    offset = nan_label_offset(25, curves[1][1][-1], others, curves)
    per_unit = PLOT_HEIGHT / (1.9 - 1 / 40)
    for rank, (s, v) in others.items():  # no other curve's height under the label crosses its box
        heights = (v[(s >= 24) & (s <= 38)] - curves[1][1][-1]) * per_unit
        assert not ((heights > offset - 3) & (heights < offset - 3 + LABEL_HEIGHT)).any(), rank


def _texts(fig):
    """The boxes (display pixels) of every text a matplotlib figure draws (tick labels inside their axis' limits,
    titles, axis labels, legends, free texts), with the text."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    artists = list(fig.texts) + [text for legend in fig.legends for text in legend.get_texts()]
    for ax in fig.axes:
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            low, high = sorted(limits)
            index = 0 if axis is ax.xaxis else 1
            artists += [label for label in axis.get_ticklabels()
                        if low - 1e-9 * abs(high - low) <= label.get_position()[index] <= high + 1e-9 * abs(high - low)]
            artists.append(axis.label)
        artists += list(ax.texts) + [ax.title]
        if ax.get_legend():
            artists += ax.get_legend().get_texts()
    return [(a.get_text(), a.get_window_extent(renderer)) for a in artists if a.get_visible() and a.get_text().strip()]


def _overlapping(fig, gap=3):
    """Pairs of texts of *fig* closer than *gap* pixels both ways (touching reads as one word: "1.5÷ the")."""
    texts = _texts(fig)
    return [(a, b) for i, (a, p) in enumerate(texts) for b, q in texts[i + 1:]
            if min(p.x1, q.x1) - max(p.x0, q.x0) > -gap and min(p.y1, q.y1) - max(p.y0, q.y0) > -gap]


def test_static_charts_keep_their_texts_apart_on_an_opaque_background():
    from matplotlib.image import imread

    from mpinb.notebook.models.history import History
    from mpinb.widgets import static

    ratios = np.array([[1.0, 1.3, 0.6, 1.02], [1.0, 1.2, 0.7, 1.05], [1.0, 1.1, math.nan, 0.99], [1.02, 1.0, 0.8, 1.0]])
    heat = static.heatmap_figure(["0.weight", "0.bias", "2.weight", "2.bias"], [f"rank {r}" for r in range(4)],
                                 ratios, title="gradient norm per layer and rank", label="÷ the layer's\nmedian rank")
    assert _overlapping(heat) == []  # the caption no longer covers the colour bar's "1.0"
    same = ([5, 90, 4], [0.0, 1.0, 2.0, 3.0])
    hist = static.histograms_figure([("x", {0: same, 1: same}), ("y", {0: ([1, 2], [-0.2, 0.0, 0.2])})],
                                    x_label="value")
    assert _overlapping(hist) == []
    for ax in hist.axes:
        assert all(float(t).is_integer() for t in ax.get_yticks()), ax.get_yticks()  # counts
    history = History()
    for rank in range(3):
        values = [1.0 / (step + 1) for step in range(50)]
        if rank == 1:
            values[30:] = [math.nan] * 20
        history.add(rank, [("main", step, step * 0.01, {"loss": value, "lr": 0.1})
                           for step, value in enumerate(values)])
    metrics = static.metrics_figure(history, ["main"])
    assert _overlapping(metrics) == []
    for fig in (heat, hist, metrics):
        pixels = imread(__import__("io").BytesIO(__import__("base64").b64decode(static.png(fig))))
        assert pixels.shape[2] == 3 or (pixels[..., 3] == 1.0).all()  # opaque: readable on a dark page too


def test_a_nan_leaf_is_said_to_hold_nan_not_to_differ_by_nan():
    from mpinb.notebook.models.leaf_reports import inspect_gathered

    y = {rank: np.ones(10) for rank in range(3)}
    y[2][3] = np.nan
    x = {rank: np.linspace(-1, 1, 100) * (1.5 if rank == 1 else 1.0) for rank in range(3)}
    reports = {r.label: r for r in inspect_gathered({"y": y, "x": x}, {})}
    assert reports["y"].verdict == "NaN/Inf on rank 2"
    assert reports["y"].differing == [2]  # still flagged in the table
    assert reports["x"].verdict == "differs on rank 1 (max |Δ| 0.5)"


def test_who_names_each_flagged_name_once_in_its_headline_and_aligns_names_left():
    from mpinb.widgets.who import who_html, who_report, who_text

    def rank(r, **extra):
        names = {"w": {"type": "ndarray", "shape": (3,), "dtype": "float64", "hash": f"h{r % 2}", "summary": ""},
                 "rank": {"type": "int", "shape": None, "dtype": None, "hash": f"r{r}", "summary": str(r)}}
        if r != 2:
            names["result"] = {"type": "ndarray", "shape": (4,), "dtype": "int64",
                               "hash": "b" if r == 3 else "a", "summary": ""}
        return names

    rows = who_report({r: rank(r) for r in range(4)})
    headline = who_text(rows).splitlines()[0]
    assert headline == ("3 names on 4 ranks; result: differs on rank 3, missing on rank 2; "
                        "w: differs on ranks 1, 3")
    assert headline.count("result") == 1
    page = who_html(rows)
    assert "<td style='text-align:left" in page and "text-align:right" not in page
    assert "#777" not in page and "word-break:normal" in page


# ---------------------------------------------------------------------- in JupyterLab

METRICS = """%%mpi
import time, mpinb
for step in range(40):
    nan = rank == 1 and step >= 25
    mpinb.report(step=step, loss=float("nan") if nan else 1.0 / (step + 1) + 0.3 * rank)
    time.sleep(0.04 if rank == 2 else 0.01)"""

GATHER = """%%mpi --gather same x y mask
import numpy as np
same = np.linspace(-1, 1, 1000)
mask = np.full(1000, np.finfo(np.float32).min, dtype=np.float32)  # one value, as an attention mask is filled
x = np.linspace(-1, 1, 1000) * (1.5 if rank == 3 else 1.0)
y = np.ones(10)
if rank == 2:
    y[3] = np.nan"""

MODEL = """%%mpi
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
torch.manual_seed(rank)
model(torch.randn(16, 4)).pow(2).mean().backward()
if rank == 2:
    with torch.no_grad():
        model[2].weight.grad[0, 0] = float('nan')"""

NAMES = """%%mpi
import numpy as np
w = np.full(3, float(rank % 2))
if rank != 2:
    result = np.arange(4) * (2 if rank == 3 else 1)"""

THEMED = ["%load_ext mpinb\n%config MPIMagics.keep_widgets = True\n%mpi start -n 4",
          METRICS, GATHER, MODEL, "%mpi grads model", NAMES, "%mpi who", "%mpi status",
          "%config MPIMagics.keep_widgets = False",
          METRICS, GATHER, "%mpi grads model",
          "%mpi stop"]
LIVE = {1: "live metrics", 2: "live inspector", 4: "live grads"}
STATIC = {6: "who", 7: "status", 9: "static metrics", 10: "static inspector", 11: "static grads"}

# Every visible text element inside the outputs (an element with text of its own, a select's chosen option, an
# SVG text): its colour (fill for SVG) with the opacities above it, over its background, composited up to the first
# opaque one (the page's white if none).
CONTRASTS = """roots => {
  const parse = value => {
    let m = value.match(/^rgba?\\(([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = value.match(/^color\\(srgb ([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[ /]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    if (value === 'transparent' || value === 'none' || value === '') return [0, 0, 0, 0];
    throw new Error('unparsed colour ' + value);
  };
  const over = (top, under) => {
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a)).concat([1]);
  };
  const channel = v => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  const lum = c => 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]);
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
  const opacity = el => {
    let o = 1;
    for (let e = el; e; e = e.parentElement) o *= parseFloat(getComputedStyle(e).opacity || '1');
    return o;
  };
  const hex = c => '#' + c.slice(0, 3).map(v => Math.round(v).toString(16).padStart(2, '0')).join('');
  const out = [];
  for (const root of roots) {
    for (const el of root.querySelectorAll('*')) {
      const svg = el instanceof SVGElement;
      let text;
      if (el.tagName === 'SELECT') text = el.selectedOptions.length ? el.selectedOptions[0].textContent : '';
      else if (el.tagName === 'OPTION') continue;
      else text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
      if (!text) continue;
      const style = getComputedStyle(el);
      if (style.visibility !== 'visible' || style.display === 'none' || !el.getClientRects().length) continue;
      const box = el.getBoundingClientRect();
      if (box.width < 1 || box.height < 1) continue;
      if (el.closest('[disabled], .mod-disabled')) continue;  // an inactive control: no contrast asked (WCAG 1.4.3)
      const alpha = opacity(el);
      if (alpha < 0.05) continue;
      const fg = parse(svg ? style.fill : style.color);
      fg[3] *= alpha;
      const bg = background(el);
      const shown = over(fg, bg);
      out.push({text: text.slice(0, 60), ratio: ratio(shown, bg), colour: hex(shown), background: hex(bg),
                tag: el.tagName.toLowerCase(), wordBreak: style.wordBreak, view: root.dataset.view || ''});
    }
  }
  return out;
}"""

# Per bqplot figure of the outputs: the pairs of its texts (tick labels, axis labels, titles, legends, mark labels)
# whose boxes overlap by more than a pixel each way.
OVERLAPS = """roots => {
  const out = [];
  for (const root of roots) {
    for (const figure of root.querySelectorAll('.bqplot')) {
      const boxes = [...figure.querySelectorAll('text')].filter(t => t.textContent.trim()
          && getComputedStyle(t).visibility === 'visible' && getComputedStyle(t).display !== 'none'
          && !t.closest('[style*="display: none"]') && parseFloat(getComputedStyle(t).opacity) > 0.05)
        .map(t => [t.textContent.trim(), t.getBoundingClientRect()])
        .filter(([, b]) => b.width > 0 && b.height > 0);
      // a NaN cross's label against every curve: the curve's points (sampled every 2 px) inside the label's box
      for (const label of figure.querySelectorAll('.object_grp text')) {
        const b = label.getBoundingClientRect();
        if (!label.textContent.trim() || b.width === 0) continue;
        for (const curve of figure.querySelectorAll('path.line')) {
          if (curve.closest('.g_legend') || !curve.getAttribute('d')) continue;
          const matrix = curve.getScreenCTM(), length = curve.getTotalLength();
          let inside = 0;
          for (let at = 0; at <= length; at += 2) {
            const p = new DOMPoint(curve.getPointAtLength(at).x, curve.getPointAtLength(at).y).matrixTransform(matrix);
            if (p.x > b.left + 1 && p.x < b.right - 1 && p.y > b.top + 1 && p.y < b.bottom - 1) inside++;
          }
          if (inside) out.push([root.dataset.view || '', label.textContent.trim(), '(a curve)', inside, 0]);
        }
      }
      const bars = [...figure.querySelectorAll('.ColorBar .g-rect rect')]
        .map(r => ['(colour bar)', r.getBoundingClientRect()]).filter(([, b]) => b.width > 0 && b.height > 0);
      const all = boxes.concat(bars);
      for (let i = 0; i < all.length; i++) {
        for (let j = i + 1; j < all.length; j++) {
          if (i >= boxes.length && j >= boxes.length) continue;
          const [a, p] = all[i], [b, q] = all[j];
          const w = Math.min(p.right, q.right) - Math.max(p.left, q.left);
          const h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
          if (w > 1 && h > 1) out.push([root.dataset.view || '', a, b, Math.round(w), Math.round(h)]);
        }
      }
    }
  }
  return out;
}"""

# The fills of the live gradient heatmap's cells.
HEATMAP_FILLS = """root => [...root.querySelectorAll('.bqplot rect')].filter(r => r.closest('.heatmap, .gridheatmap,'
  + ' [class*="heatmap" i]') || (r.getAttribute('class') || '').includes('heatmap'))
  .map(r => getComputedStyle(r).fill)"""


@contextlib.contextmanager
def lab(root, name, tmp_path, monkeypatch, *, viewport):
    """JupyterLab (its app exposed to the page, to switch themes) with notebook *name* of *root* open in Chromium,
    the kernel idle: yields the page and its cells."""
    pytest.importorskip("playwright.sync_api", reason="playwright is installed by make test")
    with lab_pages.lab(root, tmp_path, monkeypatch, server_args=["--LabApp.expose_app_in_browser=True"]) as (
            server, browser):
        with lab_pages.notebook_page(server, browser, name, viewport=viewport) as opened:
            yield opened


# What the outputs draw: every SVG text, path and rect with its place, shape and colours, and every image with whether
# it has loaded. Two readings in a row alike: nothing is drawing any more.
DRAWING = """() => JSON.stringify([
  ...[...document.querySelectorAll('.jp-OutputArea svg text, .jp-OutputArea svg path, .jp-OutputArea svg rect')]
    .map(e => {
      const box = e.getBoundingClientRect(), style = getComputedStyle(e);
      return [e.tagName, e.textContent, e.getAttribute('d'), Math.round(box.x), Math.round(box.y),
              Math.round(box.width), Math.round(box.height), style.fill, style.stroke, style.color, style.opacity];
    }),
  ...[...document.querySelectorAll('.jp-OutputArea img')].map(i => [i.src.length, i.complete])])"""


def drawn_still(page, what, *, timeout=30):
    """Wait until the outputs' drawing reads the same twice in a row, 0.5 s apart (:data:`DRAWING`)."""
    last = [None]

    def same():
        now = page.evaluate(DRAWING)
        alike, last[0] = now == last[0], now
        return alike

    wait_for(same, what, timeout, 0.5)


def switch_theme(page, theme):
    """Switch JupyterLab to *theme*, then wait until the outputs are drawn again in its colours (bqplot reads them
    when it draws)."""
    use_theme(page, theme)
    drawn_still(page, f"the outputs drawn in {theme}")


def measure(page, cells, theme, shots):
    """Contrasts and overlaps of every view in *theme*, with screenshots of the page and of each view."""
    roots = []
    for index, view in {**LIVE, **STATIC}.items():
        output = cells.nth(index).locator(".jp-OutputArea")
        output.evaluate("(el, view) => { el.dataset.view = view; }", view)
        roots.append(output)
    handles = [root.element_handle() for root in roots]
    contrasts = page.evaluate(CONTRASTS, handles)
    overlaps = page.evaluate(OVERLAPS, handles)
    fills = cells.nth(4).locator(".jp-OutputArea").evaluate(HEATMAP_FILLS)
    slug = theme.split()[-1].lower()
    page.screenshot(path=str(shots / f"{slug}-page.png"), full_page=True)
    for index, view in {**LIVE, **STATIC}.items():
        output = cells.nth(index).locator(".jp-OutputArea")
        output.scroll_into_view_if_needed()
        output.screenshot(path=str(shots / f"{slug}-{view.replace(' ', '-')}.png"))
    return contrasts, overlaps, fills


def chart_lightness(page, cells, slug, shots):
    """The mean luminance (0 black, 1 white) of each static chart image as the page shows it, with a screenshot of
    each named after *slug*: an image's own rule darkens it on a dark page."""
    import io

    from PIL import Image

    lightness = {}
    for index, view in STATIC.items():
        charts = cells.nth(index).locator(".jp-OutputArea img.mpinb-chart")
        for n in range(charts.count()):
            charts.nth(n).scroll_into_view_if_needed()
            shot = charts.nth(n).screenshot(path=str(shots / f"{slug}-{view.replace(' ', '-')}-{n}.png"))
            pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("RGB"), dtype=float)
            lightness[f"{view} #{n}"] = float(np.mean([luminance(p) for p in pixels.reshape(-1, 3)[::97]]))
    return lightness


def reload_saved(page, root, name, count):
    """Save the notebook, reload the page (the theme is a setting and stays) and wait for its *count* cells."""
    before = (root / name).stat().st_mtime_ns
    page.keyboard.press("Control+s")
    wait_for(lambda: (root / name).stat().st_mtime_ns != before, f"{name} saved", 30, 0.2)
    page.reload()
    page.locator(".jp-Notebook >> visible=true").wait_for(timeout=60_000)
    cells = page.locator(".jp-Notebook >> visible=true").locator(".jp-Cell")
    cells.nth(count - 1).wait_for(timeout=60_000)
    page.locator(".jp-OutputArea img.mpinb-chart").first.wait_for(timeout=60_000)
    return cells


def measure_export(page, cells, shots):
    """Contrasts of the static views' HTML on a blank white page, as an export shows it without JupyterLab's CSS."""
    parts = []
    for index, view in STATIC.items():
        shown = cells.nth(index).locator(".jp-OutputArea-output.jp-RenderedHTMLCommon").evaluate_all(
            "outputs => outputs.map(output => output.innerHTML).join('')")
        parts.append(f'<div data-view="{view} (export)">{shown}</div>')
    plain = page.context.browser.new_page()
    try:
        plain.set_content("<!doctype html><html><body>" + "".join(parts) + "</body></html>")
        contrasts = plain.evaluate(CONTRASTS, plain.locator("body > div").element_handles())
        plain.screenshot(path=str(shots / "export-page.png"), full_page=True)
    finally:
        plain.close()
    return contrasts, [], None


@pytest.mark.browser
@pytest.mark.server
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_view_reads_at_wcag_aa_in_the_light_and_the_dark_theme(tmp_path, monkeypatch):
    root = notebook_of(tmp_path, "themes.ipynb", THEMED)
    shots = tmp_path / "shots"
    shots.mkdir()
    tag = new_world_tag()
    measured = {}
    try:
        with lab(root, "themes.ipynb", tmp_path, monkeypatch, viewport={"width": 1400, "height": 1400}) as (
                page, cells):
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
            switch_theme(page, "JupyterLab Light")
            for index in range(len(THEMED) - 1):
                run(cells.nth(index), page, wait=True)
            cells.nth(11).locator(".jp-OutputArea img").first.wait_for(timeout=60_000)
            for index in LIVE:  # the live charts drawn: their axes, then nothing more changing
                cells.nth(index).locator(".bqplot text").first.wait_for(timeout=60_000)
            drawn_still(page, "the live charts drawn")
            lightness = {}
            for theme in ("JupyterLab Light", "JupyterLab Dark"):
                switch_theme(page, theme)
                measured[theme] = measure(page, cells, theme, shots)
                lightness[theme] = chart_lightness(page, cells, theme.split()[-1].lower(), shots)
            measured["HTML export"] = measure_export(page, cells, shots)
            errors = list(page.console_errors)
            run(cells.nth(len(THEMED) - 1), page, wait=True)
            # the notebook as saved, reopened in the dark theme: its static views read, and no chart glares
            cells = reload_saved(page, root, "themes.ipynb", len(THEMED))
            switch_theme(page, "JupyterLab Dark")
            roots = []
            for index, view in STATIC.items():
                output = cells.nth(index).locator(".jp-OutputArea")
                output.evaluate("(el, view) => { el.dataset.view = view + ' (reloaded)'; }", view)
                roots.append(output.element_handle())
            measured["JupyterLab Dark, reloaded"] = page.evaluate(CONTRASTS, roots), [], None
            lightness["JupyterLab Dark, reloaded"] = chart_lightness(page, cells, "dark-reloaded", shots)
    finally:
        SHOTS.mkdir(parents=True, exist_ok=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for shot in shots.glob("*.png"):
            shutil.copy(shot, SHOTS / shot.name)
            shutil.copy(shot, ARTIFACTS / f"themes-{shot.name}")
    failures = []
    for theme, (contrasts, overlaps, fills) in measured.items():
        contrasts.sort(key=lambda item: item["ratio"])
        worst = contrasts[0]
        print(f"{theme}: worst contrast {worst['ratio']:.2f} ({worst['text']!r} {worst['colour']} on "
              f"{worst['background']} in the {worst['view']}) over {len(contrasts)} texts")
        for item in contrasts[:8]:
            print(f"    {item['ratio']:.2f} {item['view']}: {item['text']!r} {item['colour']} on {item['background']}")
        low = [item for item in contrasts if item["ratio"] < AA]
        if low:
            failures.append(f"{theme}: {len(low)} texts under {AA}: " + json.dumps(low[:10]))
        broken = [item for item in contrasts if item["wordBreak"] == "break-all"]
        if broken:
            failures.append(f"{theme}: texts broken mid-word: {json.dumps(broken[:5])}")
        if overlaps:
            failures.append(f"{theme}: overlapping texts in the live charts: {overlaps[:10]}")
        black = [fill for fill in fills or () if fill in ("rgb(0, 0, 0)", "black")]
        if fills is not None and (black or not fills):
            failures.append(f"{theme}: the live heatmap's cells: {fills}")
    for theme, charts in lightness.items():
        print(f"{theme}: mean luminance of the static charts {charts}")
        assert charts, f"{theme}: no static chart found"
        dark = "Dark" in theme
        glaring = {view: value for view, value in charts.items() if (value > 0.25 if dark else value < 0.6)}
        if glaring:
            failures.append(f"{theme}: static charts {'brighter' if dark else 'darker'} than the page: {glaring}")
    print("screenshots:", SHOTS)
    assert not failures, "\n".join(failures)
    assert errors == [], errors
    assert not leftover_ranks(tag)

"""The MPI panel's texts as the browser draws them: each text's colour and the colour it is drawn on, and those that
read below WCAG AA on it, for the panel's tests in JupyterLab and in Notebook 7."""

import re

from contrast import AA, contrast

# each text of the panel, its colour and the colour it is drawn on (the first ancestor with a background)
COLOURS = """panel => [...panel.querySelectorAll(`.mpinb-Panel-title, .mpinb-Panel-details, .mpinb-Panel-rank,
  .mpinb-Panel-where, .mpinb-Panel-usage, .mpinb-Panel-state, .mpinb-Panel-holding:not([hidden]), .mpinb-Panel-loss,
  .mpinb-Panel-button, .mpinb-Panel-message:not([hidden])`)].map(node => {
    let back = node;
    while (back && ['rgba(0, 0, 0, 0)', 'transparent'].includes(getComputedStyle(back).backgroundColor)) {
      back = back.parentElement;
    }
    return [node.className, getComputedStyle(node).color, back ? getComputedStyle(back).backgroundColor : 'rgb(255, 255, 255)'];
  })"""


def low_contrast(panel):
    """The panel's texts that read below WCAG AA (4.5:1) on what they are drawn on."""
    numbers = lambda text: tuple(float(v) for v in re.findall(r"[\d.]+", text)[:3])  # noqa: E731
    found = [(name, colour, back) for name, colour, back in panel.evaluate(COLOURS)]
    assert found
    return [(name, colour, back, round(contrast(numbers(colour), numbers(back)), 2)) for name, colour, back in found
            if contrast(numbers(colour), numbers(back)) < AA]

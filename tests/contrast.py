"""Colour contrast as WCAG 2 defines it (relative luminance of sRGB colours), and a colour seen through another's
transparency: what the browser tests measure in the page with their JavaScript, in Python."""

AA = 4.5  # WCAG 2 level AA, normal text


def _channel(value):
    value /= 255
    return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4


def luminance(rgb):
    r, g, b = (_channel(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a, b):
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def over(colour, alpha, background):
    return tuple(alpha * c + (1 - alpha) * b for c, b in zip(colour, background))


def rgb(hex_colour):
    hex_colour = hex_colour.lstrip("#")
    return tuple(int(hex_colour[i:i + 2], 16) for i in (0, 2, 4))

"""The planner's roofline chart with the nine models a speaker compares: eight colours at most, the ninth line
dashed, no two colours alike (CIE76 distance computed here from the hex codes)."""
import pandas as pd

from attn_core.studies.planner import chart


def _lab(hex_colour: str) -> tuple[float, float, float]:
    """sRGB hex → CIE L*a*b* (D65), the textbook formulas."""
    rgb = [int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    x = (0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    z = (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_nine_models_get_eight_distinct_colours_and_the_ninth_is_dashed():
    rows = [dict(model=f"model {m}", context=c, decode_tokens_per_s=100.0 + m, prefill_seconds=1.0,
                 crossover=False, bound="bytes") for m in range(9) for c in (1024, 4096)]
    spec = chart.roofline_chart(pd.DataFrame(rows)).to_dict()
    line = spec["layer"][0]
    scale = line["encoding"]["color"]["scale"]
    colours = list(dict.fromkeys(scale["range"]))
    assert len(colours) == 8
    labs = [_lab(c) for c in colours]
    gaps = [sum((a - b) ** 2 for a, b in zip(p, q)) ** 0.5 for i, p in enumerate(labs) for q in labs[i + 1:]]
    assert min(gaps) > 10
    dash = line["encoding"]["strokeDash"]
    assert dash["condition"]["test"]["oneOf"] == ["model 8"] and dash["condition"]["value"] != dash["value"]

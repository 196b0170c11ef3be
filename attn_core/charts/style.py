"""The house look every chart shares: one colour per mechanism, installed fonts, and talk mode's large type."""
from __future__ import annotations

from typing import Iterable

import altair as alt

from ..mechanisms import MECHANISMS

# One colour per mechanism in every chart, by its place in the catalogue: Okabe–Ito plus brown for the first eight,
# then eight more distinct ones (room for 16); a second setting of one mechanism takes a spare.
COLOURS = ["#D55E00", "#0072B2", "#009E73", "#CC79A7", "#56B4E9", "#8C564B", "#E69F00", "#000000",
           "#6A3D9A", "#B15928", "#1B9E77", "#E7298A", "#66A61E", "#A6761D", "#1F78B4", "#FB9A99"]
SPARE_COLOURS = ["#7F7F7F", "#BCBD22", "#17BECF", "#9467BD", "#E377C2", "#AEC7E8"]
REFERENCE_GREY = "#6E6E6E"  # figures measured elsewhere, and mechanisms outside the catalogue
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
TALK_MIN_PX = 18  # the smallest chart text in talk mode


def colour_scale(lines: Iterable[tuple[str, str]], unknown: str | None = None) -> alt.Scale:
    """A colour for each (mechanism, line) pair: a mechanism's first line takes its catalogue colour (the same on
    every page), a second setting of it a spare colour; a mechanism outside the catalogue takes `unknown`, or a
    spare colour when None."""
    order = list(MECHANISMS)
    ranked = sorted(lines, key=lambda ml: order.index(ml[0]) if ml[0] in order else len(order))
    domain, colours, used, spare = [], [], set(), iter(SPARE_COLOURS * 4)
    for mechanism, line in ranked:
        first = mechanism in order and mechanism not in used
        used.add(mechanism)
        domain.append(line)
        colours.append(COLOURS[order.index(mechanism) % len(COLOURS)] if first
                       else unknown if unknown and mechanism not in order else next(spare))
    return alt.Scale(domain=domain, range=colours)


def house_config(talk: bool = False) -> alt.Config:
    """House look, with installed fonts so exports show text; talk: large type and thick strokes for a projector."""
    big = 1.4 if talk else 1.0  # talk: every text at least 18 px (TALK_MIN_PX), read from the back row
    return alt.Config(
        font=FONT, background="white",
        title=alt.TitleConfig(fontSize=round(18 * big), subtitleFontSize=round(13 * big), color="#000000",
                              subtitleColor="#222222"),
        axis=alt.AxisConfig(labelFontSize=round(13 * big), titleFontSize=round(14 * big), labelColor="#000000",
                            titleColor="#000000", gridColor="#DDDDDD", domainColor="#000000", tickColor="#000000"),
        legend=alt.LegendConfig(labelFontSize=round(13 * big), titleFontSize=round(13 * big), labelColor="#000000",
                                titleColor="#000000", orient="right", labelLimit=0, titleLimit=0,
                                symbolStrokeWidth=3 if talk else 2, symbolSize=220 if talk else 120),
        text=alt.MarkConfig(fontSize=round(13 * big)), header=alt.HeaderConfig(labelFontSize=round(13 * big),
                                                                              titleFontSize=round(13 * big)),
        view=alt.ViewConfig(stroke="#000000" if talk else "#BBBBBB"))


def styled(chart: alt.TopLevelMixin, talk: bool = False) -> alt.TopLevelMixin:
    """Any chart in the house look (see house_config)."""
    return chart.properties(config=house_config(talk))

"""The house look every chart shares: one colour per series from one colour-blind-safe palette, installed fonts, and
talk mode's large type."""
from __future__ import annotations

import textwrap
from typing import Iterable

import altair as alt

from ..mechanisms import MEASURED

# One categorical palette for every chart, safe for colour-blind readers and visible as a thin line on white: five
# of Okabe & Ito's (Okabe & Ito 2008, "Color Universal Design") and seven of Paul Tol's "muted" scheme (Paul Tol's
# notes "Colour schemes", 2021): of their fourteen not too pale for a line (no yellow, sand, pale cyan), the twelve
# whose closest pair is farthest apart, ΔE2000 ≥ 15 (CIE76 ≥ 25) in normal vision. Entry i is the home colour of the
# catalogue's i-th mechanism, ordered so that the mechanisms a preset shows together differ by ΔE2000 ≥ 21 also in
# simulated protan, deutan and tritan vision (Machado et al. 2009); Softmax and Linear: Okabe & Ito's orange and sky
# blue. In order: orange, indigo, olive, blue, black, vermillion, teal, purple, wine, sky blue, green, rose.
PALETTE = ["#E69F00", "#332288", "#999933", "#0072B2", "#000000", "#D55E00",
           "#44AA99", "#AA4499", "#882255", "#56B4E9", "#117733", "#CC6677"]
REFERENCE_GREY = "#6E6E6E"  # published figures, measured elsewhere (no palette entry is grey)
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
TALK_MIN_PX = 18  # the smallest chart text in talk mode
TALK_SCALE = 1.4  # talk mode's type against the usual: 13 px becomes 18
MAX_COLOURS = 8  # colours one chart uses at most: past eight, hues are hard to tell apart and to name
REPEAT_DASH = [6, 3]  # a line whose colour an earlier line of the chart already has
SUBTITLE_CHARS = 78  # a subtitle line's characters at most: 13 px DejaVu Sans is ~7.5 px a character, 78 fill ~580 px
TALK_SUBTITLE_CHARS = 56  # talk mode's 18 px subtitles: ~10.4 px a character, 56 fill the same ~580 px


def colour_scale(lines: Iterable[tuple[str, str]], most: int = len(PALETTE)) -> alt.Scale:
    """A colour for each (mechanism, line) pair, at most `most` in a chart, all different up to that many lines
    (a chart that tells a repeat apart by its dash passes MAX_COLOURS; the default keeps every palette colour for
    charts that cannot, whose lines would otherwise share a colour): a mechanism's first line takes its home colour (PALETTE at its place in the catalogue, so the same on
    every page) unless an earlier mechanism took it; the rest (a second setting, a mechanism outside the catalogue
    or whose home was taken) take the first palette colour still free, in the catalogue's order. Past `most` lines
    the colours repeat, in the domain's order; `repeated` names those lines, which a chart draws dashed."""
    order = list(MEASURED)
    ranked = sorted(dict.fromkeys(lines), key=lambda ml: order.index(ml[0]) if ml[0] in order else len(order))
    colour: dict[str, str] = {}
    homed: set[str] = set()
    for mechanism, line in ranked:  # first pass: each mechanism's first line, in its home colour if still free
        if mechanism in order and mechanism not in homed:
            homed.add(mechanism)
            home = PALETTE[order.index(mechanism) % len(PALETTE)]
            if home not in colour.values():
                colour[line] = home
    for i, (_, line) in enumerate(ranked):  # second pass: the rest, each in the first colour still free
        if line not in colour:
            free = [c for c in PALETTE if c not in colour.values()]
            colour[line] = free[0] if free else PALETTE[i % len(PALETTE)]
    domain = list(dict.fromkeys(line for _, line in ranked))
    used: list[str] = []
    for k, line in enumerate(domain):  # the cap: colour most + 1 is replaced by the first one again, and so on
        if colour[line] not in used and len(used) == most:
            colour[line] = used[(k - most) % most]
        used += [colour[line]] if colour[line] not in used else []
    return alt.Scale(domain=domain, range=[colour[line] for line in domain])


def repeated(scale: alt.Scale) -> list[str]:
    """The lines of a colour_scale whose colour an earlier line of its domain has (only past MAX_COLOURS)."""
    seen: set[str] = set()
    out = []
    for line, colour in zip(scale.domain, scale.range):
        if colour in seen:
            out.append(line)
        seen.add(colour)
    return out


def wrapped(lines: str | Iterable[str], chars: int = SUBTITLE_CHARS) -> list[str]:
    """A title's or subtitle's text as lines of at most `chars` characters, broken between words (Vega-Lite draws a
    list as lines; one long line is cut with "…" at the chart's edge). A word longer than `chars` is broken."""
    lines = [lines] if isinstance(lines, str) else list(lines)
    return [part for line in lines for part in (textwrap.wrap(line, chars, break_on_hyphens=False) or [""])
            if line]


def house_config(talk: bool = False) -> alt.Config:
    """House look, with installed fonts so exports show text; talk: large type and thick strokes for a projector."""
    big = TALK_SCALE if talk else 1.0  # talk: every text at least 18 px (TALK_MIN_PX), read from the back row
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


TALK_MARK = "attn_lab_talk_layout"  # in a chart's usermeta: for_talk has laid it out


def for_talk(chart: alt.TopLevelMixin, big: float = TALK_SCALE) -> alt.TopLevelMixin:
    """The chart laid out for talk mode's larger type: its subtitle's lines wrapped to TALK_SUBTITLE_CHARS (a line
    written for 13 px runs past the chart's width at 18 px, where Vega cuts it with "…"), and a height given in
    pixels `big` times larger, as its texts are. A page draws a single or layered chart to its column's width with
    titles, axes and legend inside that height (Vega's autosize "fit"): at the old height the larger texts left the
    planner's plot 60 px tall at 1280×720. Once only: a chart laid out so (marked in its usermeta) comes back as it is,
    as a page may style again a chart made for talk mode (the payoff chart)."""
    meta = chart.usermeta if isinstance(chart.usermeta, dict) else {}
    if meta.get(TALK_MARK):
        return chart
    chart = chart.properties(usermeta={**meta, TALK_MARK: True})
    title = chart.title
    if isinstance(title, alt.TitleParams) and title.subtitle is not alt.Undefined:
        title = title.copy()
        title.subtitle = wrapped(title.subtitle, TALK_SUBTITLE_CHARS)
        chart = chart.properties(title=title)
    height = getattr(chart, "height", alt.Undefined)
    if isinstance(height, (int, float)) and not isinstance(height, bool):
        chart = chart.properties(height=round(height * big))
    return chart


def styled(chart: alt.TopLevelMixin, talk: bool = False) -> alt.TopLevelMixin:
    """Any chart in the house look (see house_config); talk: laid out for the larger type (for_talk)."""
    return (for_talk(chart) if talk else chart).properties(config=house_config(talk))


THEME_VIEW = ("continuousWidth", "continuousHeight")  # what Altair's default theme adds to a chart's view


def page_spec(chart: alt.TopLevelMixin) -> dict:
    """The chart's Vega-Lite spec as a page shows it (st.vega_lite_chart): what Streamlit's st.altair_chart sends,
    without Altair's default theme's 300-pixel view (a chart that sets its own keeps it), and without validating
    the spec against the whole Vega-Lite schema once more. st.altair_chart validated at every rerun: about a quarter
    of the Learn page's script under the profiler (its 39 charts are validated as they are made too). A chart is
    validated where it is saved to a file (export) and by its tests (tests/charts)."""
    spec = chart.to_dict(validate=False)
    view = spec.get("config", {}).get("view")
    if alt.theme.active == "default" and isinstance(view, dict):
        config = getattr(chart, "config", alt.Undefined)
        own = {} if config is alt.Undefined else config.to_dict(validate=False).get("view", {})
        for key in THEME_VIEW:
            if key not in own:
                view.pop(key, None)
        if not view:
            del spec["config"]["view"]
        if not spec["config"]:
            del spec["config"]
    return spec

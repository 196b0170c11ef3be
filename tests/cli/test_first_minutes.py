"""A newcomer's first minutes through AppTest (issue 30): the Learn page's export popovers hold their buttons."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def download_places(node, path=()) -> dict[str, tuple]:
    """Each download button's key and the kinds of the blocks that hold it, outermost first."""
    found = {}
    for child in getattr(node, "children", {}).values():
        kind = getattr(child, "type", None)
        if kind == "download_button":
            found[child.key] = path
        found.update(download_places(child, (*path, kind)))
    return found


def test_learn_export_buttons_sit_inside_their_popovers():
    at = AppTest.from_file(str(ROOT / "pages" / "learn.py"), default_timeout=60).run()
    assert not at.exception
    places = download_places(at._tree)
    learn = {key: path for key, path in places.items() if key.startswith("learn_dl_")}
    assert len(learn) >= 30  # ten figures and more, three formats each
    assert all("popover" in path for path in learn.values()), [k for k, p in learn.items() if "popover" not in p]
    popovers = at.get("popover")
    assert len(popovers) * 3 == len(learn)


def test_n_star_is_told_to_two_significant_figures():
    from attn_core.engine.analysis import rounded_n

    assert [rounded_n(n) for n in (215.4, 217.9, 218.2, 280.0, 99.6, 1234.0, 64.0)] == \
        [220, 220, 220, 280, 100, 1200, 64]


def test_home_points_a_newcomer_to_the_learn_page():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    links = [e for e in at.main.get("page_link") if e.proto.page == "pages/learn.py" or "learn" in e.proto.page]
    assert links and "Learn page" in links[0].proto.label


def test_theory_says_which_lines_coincide_and_close_budgets_share_one_label():
    import pandas as pd

    from attn_core.insight import charts as insight

    frame = pd.DataFrame({"label": ["A", "A", "B", "B", "C", "C"], "n": [1, 2] * 3, "mechanism": list("aabbcc"),
                          "status": "ok", "total_bytes": [1.0, 4.0, 1.0, 4.0, 1.0, 2.0]})
    spec = insight.theory_chart(frame, "total_bytes", budgets={"this device": 23.6 * 2**30, "24 GB GPU": 24 * 2**30,
                                                                "80 GB GPU": 80 * 2**30}).to_dict()
    assert "one line hides another (the same values): A = B" in spec["title"]["subtitle"]
    (text,) = [layer for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert [r["budget"] for r in spec["datasets"][text["data"]["name"]]] == ["this device · 24 GB GPU", "80 GB GPU"]

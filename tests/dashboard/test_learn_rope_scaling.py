"""The Learn page's RoPE scaling view through AppTest: the chosen published config's curves, unscaled and scaled,
drawn in place of the positions step."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from attn_core.positions import chart
from tests.apptest_helpers import chart_specs

ROOT = Path(__file__).resolve().parents[2]


def test_the_view_draws_the_chosen_config_with_and_without_its_scaling():
    at = AppTest.from_file(str(ROOT / "pages" / "learn.py"), default_timeout=60)
    at.session_state["learn_pos_view"] = "RoPE past the trained length"
    at.session_state["learn_rope_scaling"] = "Qwen3 with YaRN (×4)"
    at.run()
    assert not at.exception and not at.error
    spec = next(s for s in chart_specs(at) if s.get("title", {}).get("text") == "RoPE's scores past the trained length")
    curves = {r["scaling"] for data in spec["datasets"].values() for r in data if "scaling" in r}
    assert curves == {"unscaled", "yarn ×4"}
    assert any(r.get("label") == "trained length 32,768" for data in spec["datasets"].values() for r in data)
    assert any(c.value == chart.CAPTION for c in at.caption)
    assert len(chart_specs(at)) >= 3  # the lookup and the explanation still follow

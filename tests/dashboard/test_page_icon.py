"""The page icon loads offline: Streamlit draws an emoji icon into a data: URL, while a ":material/…:" favicon is
fetched from fonts.gstatic.com (read in Streamlit 1.67's frontend: `SET_PAGE_FAVICON`), which fails in a lecture
hall with no network."""
import ast
from pathlib import Path

from streamlit.commands.page_config import _get_favicon_string

APP = Path(__file__).resolve().parents[2] / "app.py"


def page_icon() -> object:
    """The value app.py passes as set_page_config's page_icon (a constant of app.py, or a literal)."""
    tree = ast.parse(APP.read_text("utf-8"))
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") ==
               "set_page_config"]
    (value,) = [k.value for k in call.keywords if k.arg == "page_icon"]
    value = constants.get(value.id, value) if isinstance(value, ast.Name) else value
    return ast.literal_eval(value)


def test_the_page_icon_is_one_the_browser_draws_without_a_request():
    icon = page_icon()
    assert isinstance(icon, str) and not icon.startswith(":material")
    assert _get_favicon_string(icon) == f"emoji:{icon}"  # the frontend's data: URL, no font server

"""The Streamlit app: `app.py` routes to these pages; `data` is the only module they read the
store through, `charts` builds every figure (pure functions, tested without a browser), `state`
keeps each page's view in the URL and runs the live refresh."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    key: str  # the page's file name under workbench/app/pages/, and its widget-key prefix
    title: str
    icon: str

    @property
    def path(self) -> str:
        """The page file relative to app.py (what st.Page and st.switch_page take)."""
        return f"workbench/app/pages/{self.key}.py"


# Emoji icons: Streamlit makes the favicon of an emoji in the page itself, while a `:material/...:`
# icon's favicon is fetched from fonts.gstatic.com on every page change (the app makes no request
# off the machine).
PAGES = [
    Page("runs", "Runs", "📋"),
    Page("curves", "Curves", "📈"),
    Page("backtest", "Alerts & backtest", "🔔"),
    Page("lineage", "Lineage", "🌳"),
]
PAGE = {p.key: p for p in PAGES}

"""The Streamlit app: `app.py` routes to these pages; `data` is the only module they read the
store through, `charts` builds every figure (pure functions, tested without a browser), `compare`
builds the run comparer's tables, `state` keeps each page's view in the URL and runs the live
refresh."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    key: str  # the page's file name under workbench/app/pages/, and its widget-key prefix
    title: str
    icon: str | None

    @property
    def path(self) -> str:
        """The page file relative to app.py (what st.Page and st.switch_page take)."""
        return f"workbench/app/pages/{self.key}.py"


# No page icons: a `:material/...:` icon's favicon is fetched from fonts.gstatic.com on every page
# change, and an emoji needs an emoji font the machine may lack; Streamlit's own favicon is served
# by the app (it makes no request off the machine).
PAGES = [
    Page("runs", "Runs", None),
    Page("curves", "Curves", None),
    Page("compare", "Compare runs", None),
    Page("histograms", "Histograms", None),
    Page("backtest", "Alerts & backtest", None),
    Page("lineage", "Lineage", None),
]
PAGE = {p.key: p for p in PAGES}

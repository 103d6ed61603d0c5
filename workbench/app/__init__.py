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


PAGES = [
    Page("runs", "Runs", ":material/table_rows:"),
    Page("curves", "Curves", ":material/show_chart:"),
    Page("backtest", "Alerts & backtest", ":material/notifications:"),
    Page("lineage", "Lineage", ":material/account_tree:"),
]
PAGE = {p.key: p for p in PAGES}

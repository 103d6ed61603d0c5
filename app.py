"""Streamlit entry point: routes to the pages; all logic lives in workbench/."""

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).parent / "workbench" / "pages"

st.set_page_config(page_title="Training-Log Workbench", layout="wide")
nav = st.navigation(
    [
        st.Page(str(PAGES / "runs.py"), title="Runs", icon=":material/table_rows:", default=True),
        st.Page(str(PAGES / "curves.py"), title="Curves", icon=":material/show_chart:"),
        st.Page(str(PAGES / "backtest.py"), title="Alerts & backtest", icon=":material/notifications:"),
        st.Page(str(PAGES / "lineage.py"), title="Lineage", icon=":material/account_tree:"),
    ]
)
nav.run()

"""Streamlit entry point: routes to the pages listed in workbench.app.PAGES (all logic lives there)."""

from pathlib import Path

import streamlit as st

from workbench.app import PAGES

HERE = Path(__file__).parent

st.set_page_config(page_title="Training-Log Workbench", layout="wide")
nav = st.navigation(
    [st.Page(str(HERE / p.path), title=p.title, icon=p.icon, default=i == 0) for i, p in enumerate(PAGES)]
)
nav.run()

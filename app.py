"""Attention Lab: the frame and router of the dashboard."""
import streamlit as st

st.set_page_config(page_title="Attention Lab", page_icon="📈", layout="wide")
st.title("Attention Lab")
st.write("What each attention mechanism costs as the sequence grows, measured live on this machine.")

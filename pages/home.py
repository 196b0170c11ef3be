"""Home: what the dashboard shows, the device it measures on, and one-click demos (forward pass, generation)."""
import pandas as pd
import streamlit as st

from attn_core.engine import env, presets
from pages._shared import bench_state, ensure_routed, open_benchmark

ensure_routed()
st.title("Attention Lab")
st.markdown(
    "Attention Lab measures, live on this machine, how the time and memory of each attention mechanism grow with "
    "the sequence length n. Every measured point is drawn against the theoretical curves, O(n²) for softmax and "
    "O(n) for the efficient mechanisms, scaled to the data. The chart marks the length n* where an efficient "
    "mechanism overtakes softmax, and exports to a slide in one click."
)

st.page_link("pages/learn.py", label="New to attention? The Learn page explains it step by step, one picture each",
             icon=":material/school:")

st.subheader("Devices found")
rows = []
for device in env.available_devices():
    info = env.device_info(device)
    rows.append({"device": device, "name": info["name"], "memory (GiB)": round(info["total_memory_bytes"] / 2**30, 1),
                 "free (GiB)": round(info["free_memory_bytes"] / 2**30, 1), "threads": info["threads"],
                 "dtypes": ", ".join(info["dtypes"])})
st.dataframe(pd.DataFrame(rows), hide_index=True)

busy = bench_state().running
st.caption(presets.QUICK_DEMO.look_for + f" About {presets.QUICK_DEMO.seconds:.0f} s on a 2-core laptop CPU with one core "
           "busy, as measured; a point the machine disturbs past that is kept hollow, not retaken.")
if st.button("Run the quick demo", key="home_demo", type="primary", icon=":material/play_arrow:", disabled=busy,
             help="A sweep is running; stop it on the Benchmark page first." if busy else None):
    open_benchmark(presets.QUICK_DEMO.name)  # the Benchmark page sets its panel, queues it
st.markdown("Generating text is the other half of the story: each new token reads everything its mechanism "
            "remembers. The Benchmark page's generate mode times one token's step against the cache of n tokens and "
            "weighs that cache.")
KV = presets.PRESETS["Why the KV cache hurts"]
if st.button("Show why the KV cache hurts", key="home_generate", icon=":material/play_arrow:", disabled=busy,
             help=KV.look_for):
    open_benchmark(KV.name)
st.page_link("pages/benchmark.py", label="Or choose your own settings on the Benchmark page", icon=":material/tune:")

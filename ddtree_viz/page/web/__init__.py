"""The page's Gradio layer, the only place gradio is imported: app.py (the app, its options, main), one module per
tab (step_tab.py, analyze_tab.py: layout and wiring side by side), wiring.py (what both share), script.py (the
page's script and style). Every handler calls the page's logic (ddtree_viz/page/), never maths of its own."""

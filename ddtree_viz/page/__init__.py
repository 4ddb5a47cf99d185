"""The web page's logic, without gradio, in rooms by job (docs/ARCHITECTURE.md: module map; recipe "Add a view"):

- host.py: ModelHost, the models loaded once and shared by every tab (one fair lock); cpu_threads.
- state.py: one browser tab's state (TabState), its settings as the controls give them (TabSettings, read by name).
- actions.py: what the controls do to a tab (step, run, check, reset, replay, move, inspect, download, export).
- views.py: what the page shows, by view name (VIEWS): the widgets, the actions' outputs and the renderers meet there.
- analyze_tab.py: the Analyze tab (a report read back, a prompt set run on the page).
- web/: the Gradio layer, the only place gradio is imported: the layout and wiring of each tab, the page's script.
"""

"""Training pipeline of the embedded default pair (issue 3): corpus, tokenizer, target, drafter, eval.

Run as ``python -m ddtree_viz.train --help``. Nothing here is imported by the engine or the app.
"""

"""A prompt set decoded into a report directory, and such a directory read back: the library under `analyze` and
the page's Analyze tab (no argparse here). Decode every prompt of a set, write one ordinary trace per prompt
(DIR/traces/NNNN.json, replayable); the summary is computed ONLY from the traces written in DIR, so a resumed run,
an interrupted run and a run split over several processes all give their figures one way. Every figure comes from
ddtree_viz/analysis.py.

Files in DIR:
  prompts.json            the prompt set as read (index, source, prompt or messages) and the run's settings
  traces/NNNN.json        prompt NNNN's trace (trace.py's contract)
  traces/NNNN.error.json  prompt NNNN failed: {index, error, kind}
  traces/NNNN.meta.json   prompt NNNN's wall time and the process that decoded it (not part of the figures)
  traces/NNNN.dflash.json (and .dflash.error.json, .dflash.meta.json) with --method both: the DFlash chain's
                          decode of prompt NNNN, the same settings otherwise (NNNN.json is then DDTree's)
  summary.json            the figures (the contract in docs/ARCHITECTURE.md); with --method both the chain's under
                          "dflash", the same keys
  report.html             self-contained (no network), figures inline
  figures/*.svg, *.pdf    the report's figures

Modules: files (prompt files, the shipped sets, a directory's file names and records), decode (THE loop that
decodes a set into DIR), report (a directory's files read back, every trace validated), summary (summary.json's
figures from the traces; the report written).
"""

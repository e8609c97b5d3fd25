"""The HTML report: per-study tables, figures and observations computed from the run files.

`study` turns one study's metrics.json files into tables, `observations` writes sentences from
those numbers, `figures` draws them, and `html` assembles one self-contained page.
"""

"""The HTML report: per-study tables, figures and observations computed from the run files.

`study` turns one study's metrics.json files into tables, `observations` writes sentences from
those numbers, `figures` draws them, and `page` assembles one self-contained page. `cells`
writes every table cell, `captions` the figure captions of both reports (report/captions.yaml).
"""

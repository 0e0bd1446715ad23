"""Statistics over per-response and per-question numbers: correlations and the paper's binned r
(``correlation``), the question-level bootstrap (``resampling``), multiple-comparison control (``fdr``), paired
tests of two methods on the same questions and their power (``paired``).

numpy and scipy only — no torch, no models (an import-linter contract keeps it so): the studies hand this room
plain arrays of numbers they have already read out, voted or graded.
"""

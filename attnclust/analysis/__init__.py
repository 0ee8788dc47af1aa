"""Analyses of attention maps and heads, each declared next to its code in a registry.

- :mod:`.stats`: per-map statistics (one value per (feature, layer, head)), computed during extraction;
- :mod:`.heads`: per-head analyses (columns of ``heads.parquet``), computed when the atlas is built;
- :mod:`.atlas`: the joins of cluster labels, statistics and features, and the per-head / per-cluster tables.

A new statistic or head analysis is one module that registers itself; it then appears in the parquet outputs
and in the report with no other edit.
"""

from . import answer  # noqa: F401, I001  (registers the "answer_attention" and "unanswerable_attention" analyses)
from . import induction  # noqa: F401  (registers the "induction" head analysis)
from . import modes  # noqa: F401  (registers the "modes" head analysis)
from . import retrieval  # noqa: F401  (registers the "retrieval" and "answer_step_attention" analyses)
from . import roles  # noqa: F401  (registers the "roles" head analysis)
from . import sink  # noqa: F401  (registers the "sink" head analysis)

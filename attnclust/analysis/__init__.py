"""Analyses of attention maps and heads, each declared next to its code in a registry.

- :mod:`.stats`: per-map statistics (one value per (feature, layer, head)), computed during extraction;
- :mod:`.heads`: per-head analyses (columns of ``heads.parquet``), computed when the atlas is built;
- :mod:`.extraction`: analyses run at extraction with the model, per extract task (what heads move) or once per
  model on the driver (a decoder's induction diagnostic and the papers' protocols);
- :mod:`.detectors`: the decoder protocols' head detectors (induction, previous-token, duplicate-token ...);
- :mod:`.plugins`: analyses with settings and files of their own (``importance``, ``head_distances``,
  ``syntax``, ``probe``), each declaring its settings (a job section), outputs, fingerprint and report section;
- :mod:`.atlas`: the joins of cluster labels, statistics and features, and the per-head / per-cluster tables.
- :mod:`.naming`: each cluster's type and description from its mean statistics; :mod:`.thumbnails`: each
  cluster's mean and medoid maps.

A new statistic, head analysis, head detector or analysis plugin is one module that registers itself; it then
appears in the job's settings, the outputs and the report with no other edit. Importing this package registers the
built-in ones; :mod:`attnclust` imports it, so that their job sections are known whatever module a program imports
first.
"""

from . import answer  # noqa: F401, I001  (registers the "answer_attention" and "unanswerable_attention" analyses)
from . import induction  # noqa: F401  (registers the "induction" head analysis and per-model extraction analysis)
# the built-in head detectors of the decoder protocols, in the order of their columns (each registers its head analysis)
from .detectors import induction_arena, induction_tl, previous_token, duplicate_token  # noqa: F401
from . import protocols  # noqa: F401  (the papers' protocols: "sink_rate", "needle_retrieval", "decoder_protocols")
from . import modes  # noqa: F401  (registers the "modes" head analysis)
from . import loss  # noqa: F401  (registers the "loss_modes" head analysis: next-token loss of text runs)
from . import moved  # noqa: F401  (registers the "moved_norm" extraction analysis: what heads move)
from . import retrieval  # noqa: F401  (registers the "retrieval" and "answer_step_attention" analyses)
from . import roles  # noqa: F401  (registers the "roles" head analysis)
from . import sink  # noqa: F401  (registers the "sink" head analysis)
# the analyses with settings of their own, in the order their job sections follow the stages' (importance, syntax,
# probe) and the report stage runs them
from . import importance  # noqa: F401  (registers the "importance" analysis and the job's importance section)
from . import distances  # noqa: F401  (registers the "head_distances" analysis: the head map)
from . import syntax  # noqa: F401  (registers the "syntax" analysis and the job's syntax section)
from . import probes  # noqa: F401  (registers the "probe" analysis and the job's probe section)

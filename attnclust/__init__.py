"""attnclust: an attention-head atlas for transformer models at dataset scale.

Notebook use::

    import attnclust
    result = attnclust.run("jobs/demo.yaml", out="runs/demo")
    atlas = attnclust.open_output("runs/demo")
    atlas.attention            # xarray.DataArray (feature, layer, head, query, key), lazy
    atlas.maps.head()          # pandas tables: maps, heads, clusters, features, predictions
"""

from __future__ import annotations

from . import analysis  # noqa: F401 -- registers the analyses, whose sections (syntax, probe ...) join the job
from .api import Output, open_output, run
from .config import JobConfig, load_job
from .errors import AttnclustError, BackendUnavailable, ConfigError, DataError, ModelError, StoreError
from .plugins import load_plugins
from .store.contract import DIMS

PLUGINS = load_plugins()
"""The installed extensions imported with attnclust (:mod:`attnclust.plugins`), after which the job's model is
assembled (:func:`attnclust.plugins.assemble_job_config`)."""

__all__ = ["DIMS", "AttnclustError", "BackendUnavailable", "ConfigError", "DataError", "JobConfig", "ModelError",
           "Output", "PLUGINS", "StoreError", "load_job", "open_output", "run"]
__version__ = "0.1.0"

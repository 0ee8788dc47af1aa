"""The sections that plugins declare: an analysis' settings model becomes a section of every job
(:func:`register_section`), and each featurizer's settings join the ``featurize`` section as the featurizer registry
changes (:func:`attnclust.featurize.watch_featurizers`)."""

from __future__ import annotations

import re

from pydantic.fields import FieldInfo

from .._settings import _add_fields, _Model, _plugin_fields, _remove_fields
from ..featurize import FEATURIZERS, watch_featurizers
from .job import CORE_SECTIONS, JobConfig, _section
from .sections import FeaturizeConfig

__all__ = ["register_section", "unregister_section"]


def register_section(model: type[_Model]) -> type[_Model]:
    """Make ``model`` (a frozen settings model, its ``SECTION`` its name) a section of every job, after the others:
    a key of job files, ``--set``, ``to_dict``, fingerprints and the job reference, read as ``cfg.<SECTION>``.

    Called by :func:`attnclust.analysis.plugins.register_analysis` for an analysis' settings; registering the same
    model again (a module reloaded) changes nothing.

    Raises
    ------
    ValueError
        The name is not a lower-case identifier, is ``name``, ``backend`` or a stage's section, or another model
        declares it.
    """
    name = model.SECTION
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name) or name in CORE_SECTIONS \
            or name in ("name", "backend"):
        raise ValueError(f"section {name!r} of {model.__name__}: allowed: a lower-case name (letters, digits, '_') "
                         f"that is not name, backend or a stage's section ({', '.join(CORE_SECTIONS)})")
    _add_fields(JobConfig, {name: FieldInfo.from_annotated_attribute(model, _section(model))}, model)
    JobConfig.SECTIONS[name] = model
    return model


def unregister_section(name: str) -> None:
    """Remove a section :func:`register_section` added (a plugin unregistered); a stage's section stays."""
    if name in CORE_SECTIONS:
        raise ValueError(f"section {name!r} is a stage's section; only sections that plugins declared are removed")
    _remove_fields(JobConfig, (name,))
    JobConfig.SECTIONS.pop(name, None)


def _join_featurizer_settings() -> None:
    """The ``featurize`` section: ``method`` and the settings of every registered featurizer, in registration
    order (called by the featurizer registry on each change, :func:`attnclust.featurize.watch_featurizers`)."""
    models = list(dict.fromkeys(m for m in (getattr(f, "settings", None) for f in FEATURIZERS.values()) if m))
    _remove_fields(FeaturizeConfig, tuple(FeaturizeConfig.DECLARED_IN))
    for model in models:
        _add_fields(FeaturizeConfig, _plugin_fields(model), model)
    JobConfig.model_rebuild(force=True)  # the job validates and dumps its sections with their fields


watch_featurizers(_join_featurizer_settings)

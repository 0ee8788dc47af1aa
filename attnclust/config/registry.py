"""The sections that plugins declare, joined to the job at one point: :func:`assemble_job` makes :class:`JobConfig`
the stages' sections followed by the analyses' (each analysis' settings model a section of every job), and the
``featurize`` section ``method`` followed by the settings of every registered featurizer.

:func:`attnclust.plugins.load_plugins` calls it once the installed plugins are imported (``import attnclust`` does
both), so importing a module never changes the job; a plugin registered by hand afterwards (a notebook, a test)
joins it when :func:`attnclust.plugins.assemble_job_config` is called again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic.fields import FieldInfo

from .._settings import _add_fields, _Model, _name_of, _plugin_fields, _remove_fields
from ..featurize import FEATURIZERS
from .job import CORE_SECTIONS, JobConfig, _section
from .sections import FeaturizeConfig

__all__ = ["assemble_job", "check_section"]


def check_section(model: type[_Model]) -> None:
    """Refuse a settings model whose ``SECTION`` cannot be a section of the job.

    Raises
    ------
    ValueError
        The name is not a lower-case identifier, is ``name``, ``backend`` or a stage's section.
    """
    name = model.SECTION
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name) or name in CORE_SECTIONS \
            or name in ("name", "backend"):
        raise ValueError(f"section {name!r} of {model.__name__}: allowed: a lower-case name (letters, digits, '_') "
                         f"that is not name, backend or a stage's section ({', '.join(CORE_SECTIONS)})")


def assemble_job(sections: Iterable[type[_Model]]) -> None:
    """Make the job's model from what is registered: the stages' sections and then ``sections``, and the
    ``featurize`` section's ``method`` and then the settings of every registered featurizer, in registration order.

    A section joins every job after the stages' (a key of job files, ``--set``, ``to_dict``, fingerprints and the
    job reference, read as ``cfg.<SECTION>``); what an earlier call added and is not given now goes. Checked whole
    before anything changes.

    Parameters
    ----------
    sections
        Frozen settings models, each with its ``SECTION`` name (the analyses' settings; the same model given twice,
        or a module reloaded, counts once).

    Raises
    ------
    ValueError
        A section name :func:`check_section` refuses, two models declaring one section, or a featurizer's setting
        that another model declares already.
    """
    models: dict[str, type[_Model]] = {}
    for model in sections:
        check_section(model)
        first = models.setdefault(model.SECTION, model)
        if _name_of(first) != _name_of(model):
            raise ValueError(f"section {model.SECTION!r} of {model.__name__}: already declared by {first.__name__}; "
                             f"choose another name")
    settings = list(dict.fromkeys(m for m in (getattr(f, "settings", None) for f in FEATURIZERS.values()) if m))
    declared = {name: FeaturizeConfig for name in FeaturizeConfig.model_fields
                if name not in FeaturizeConfig.DECLARED_IN}
    for model in settings:
        for name in model.model_fields:
            first = declared.setdefault(name, model)
            if _name_of(first) != _name_of(model):
                raise ValueError(f"{model.__name__}: setting {name!r} is already declared by {first.__name__} "
                                 f"(section 'featurize'); choose another name, or use that model")
    _remove_fields(FeaturizeConfig, tuple(FeaturizeConfig.DECLARED_IN))
    for model in settings:
        _add_fields(FeaturizeConfig, _plugin_fields(model), model)
    added = tuple(name for name in JobConfig.SECTIONS if name not in CORE_SECTIONS)
    _remove_fields(JobConfig, added)
    for name in added:
        del JobConfig.SECTIONS[name]
    for name, model in models.items():
        _add_fields(JobConfig, {name: FieldInfo.from_annotated_attribute(model, _section(model))}, model)
        JobConfig.SECTIONS[name] = model
    JobConfig.model_rebuild(force=True)  # the job validates and dumps its sections with their fields

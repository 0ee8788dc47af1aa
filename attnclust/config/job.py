"""The job: :class:`JobConfig`, one section per stage plus the job's name and backend, and the registry of its
sections (:attr:`JobConfig.SECTIONS`), which the analyses' sections join (:mod:`attnclust.config.registry`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar

from pydantic import Field

from .._settings import _choice, _Model, _setting, _unknown
from ..errors import ConfigError
from .sections import (
    Backend,
    ClusterConfig,
    DataConfig,
    ExtractConfig,
    FeaturizeConfig,
    FinetuneConfig,
    ModelConfig,
    QAConfig,
    ReportConfig,
)

__all__ = ["CORE_SECTIONS", "JobConfig"]

_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,47}$"


def _unknown_section(key: Any) -> ConfigError:
    return _unknown(JobConfig, key)


def _section(model: type[_Model]) -> Any:
    return Field(default_factory=model,
                 json_schema_extra={"allowed": f"the '{model.SECTION}' settings ({model.__name__}, or a mapping)"})


class JobConfig(_Model):
    """A whole job: one section per stage plus the job name and backend.

    Parameters
    ----------
    name
        Letters, digits and ``_``, starting with a letter; prefixes every Dask task key of the job.
    backend
        ``cpu``, ``gpu`` or ``auto`` (gpu only when every worker has a usable GPU).
    data, model, extract, featurize, cluster, report, qa, finetune
        The stages' sections (:data:`CORE_SECTIONS`); each defaults to its model's defaults. ``SECTIONS`` maps
        each name to its model, these and the sections the analyses declare after them (``importance``,
        ``syntax``, ``probe`` ...: :func:`~attnclust.config.assemble_job`), which their own models describe.
    """

    name: str = _setting("attnclust", "letters, digits and '_', starting with a letter (max 48)",
                         "for example name: squad_dev", pattern=_NAME_PATTERN)
    backend: Backend = _choice("auto", Backend)
    data: DataConfig = _section(DataConfig)
    model: ModelConfig = _section(ModelConfig)
    extract: ExtractConfig = _section(ExtractConfig)
    featurize: FeaturizeConfig = _section(FeaturizeConfig)
    cluster: ClusterConfig = _section(ClusterConfig)
    report: ReportConfig = _section(ReportConfig)
    qa: QAConfig = _section(QAConfig)
    finetune: FinetuneConfig = _section(FinetuneConfig)

    SECTIONS: ClassVar[dict[str, type[_Model]]] = {
        "data": DataConfig, "model": ModelConfig, "extract": ExtractConfig, "featurize": FeaturizeConfig,
        "cluster": ClusterConfig, "report": ReportConfig, "qa": QAConfig, "finetune": FinetuneConfig}

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> JobConfig:
        """Build the job from a mapping of ``name``, ``backend`` and sections (a job file's, or ``job.json``'s).

        Parameters
        ----------
        raw
            The top-level mapping; ``None`` or a missing section gives the defaults. An unknown section or
            setting, or a value that is not allowed, raises ``ConfigError`` naming its dotted key.
        """
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"job config: expected a mapping at the top level, got {type(raw).__name__}")
        unknown = [key for key in raw if key not in cls.model_fields]
        if unknown:
            raise _unknown_section(unknown[0])
        values = {key: raw[key] for key in ("name", "backend") if key in raw}
        values.update({key: section.from_dict(raw.get(key)) for key, section in cls.SECTIONS.items()})
        return cls(**values)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every dotted key: ``("data.path", ..., "finetune.eval_max_examples", "name", "backend")``."""
        return tuple(f"{name}.{key}" for name, section in cls.SECTIONS.items() for key in section.model_fields) \
            + ("name", "backend")

    def value(self, key: str) -> Any:
        """The value of one dotted key of :meth:`keys`, e.g. ``cfg.value("cluster.k")``.

        Parameters
        ----------
        key
            ``"section.setting"``, ``"name"`` or ``"backend"``; any other raises ``ConfigError`` naming it.
        """
        section, dot, setting = key.partition(".") if isinstance(key, str) else (key, "", "")
        if not dot and section in ("name", "backend"):
            return getattr(self, section)
        owner = self.SECTIONS.get(section)
        if owner is None or not dot:
            raise ConfigError(f"config {key}: unknown key; allowed: name, backend, or section.setting with a "
                              f"section among {', '.join(self.SECTIONS)} (JobConfig.keys() lists them all)")
        if setting not in owner.model_fields:
            raise _unknown(owner, setting)
        return getattr(getattr(self, section), setting)

    def fingerprint(self, *sections: str) -> str:
        """Hash (16 hex digits) of the given sections' settings (all, with name and backend, when none given).

        Parameters
        ----------
        *sections
            Top-level keys of :meth:`to_dict` (section names, ``name``, ``backend``).
        """
        blob = self.to_dict()
        if sections:
            unknown = [key for key in sections if key not in blob]
            if unknown:
                raise _unknown_section(unknown[0])
            blob = {key: blob[key] for key in sections}
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


CORE_SECTIONS: tuple[str, ...] = tuple(JobConfig.SECTIONS)
"""The stages' sections, declared here; the analyses' sections join :attr:`JobConfig.SECTIONS` after them."""

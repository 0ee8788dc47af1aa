"""Sphinx extension of attnclust's documentation, and the checks that keep the references true to the code.

- The directive ``attnclust-job-reference`` writes the job reference from the pydantic config models
  (:class:`attnclust.config.JobConfig` and the section models it holds): every key with its default, what is
  allowed and the description from the ``Parameters`` section of its model's numpydoc docstring. A setting a
  plugin declared (a featurizer's, joined to the ``featurize`` section) is described by the plugin's own model
  (``DECLARED_IN``), a section an analysis declared by its model's summary. A key without a description, or a
  described name that is no key, is a build warning (an error under ``sphinx-build -W``).
- The directive ``attnclust-commands`` prints every ``attnclust`` subcommand's ``--help``.
- The directives ``attnclust-statistics`` and ``attnclust-head-analyses`` list the registered per-map statistics
  and head analyses (name, unit, description as declared next to their code); ``attnclust-head-detectors`` the
  decoder protocols' head detectors (their columns of ``decoder_protocols.parquet``, how each scores, its threshold)
  and ``attnclust-extraction-analyses`` the analyses run at extraction (per extract task: the columns each adds;
  once per model: the files each writes).
- :func:`undocumented_columns` compares the parquet tables of a finished run with the output reference
  (``docs/reference/outputs.md`` and the generated tables): every column written must be documented there, and
  :func:`documented_but_missing` finds documented columns that no table has (``tests/docs`` runs both).

The functions work on any pydantic model, so the tests can show that they find an undocumented key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = ["STATISTIC_TABLES", "JobKey", "command_help", "described_but_missing", "documented_columns",
           "documented_but_missing", "documented_files", "extraction_analyses", "field_descriptions",
           "generated_columns", "head_analyses", "head_detectors", "job_keys", "job_reference_rst", "setup",
           "statistics", "undocumented_columns", "undocumented_files", "undocumented_keys"]


# --- the job reference ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JobKey:
    """One dotted key of a job file.

    Attributes
    ----------
    key : str
        The dotted key, e.g. ``cluster.k`` (``name`` at the top level).
    default : str
        The default as written in YAML (``null``, ``true``, ``[a, b]``); empty for a section.
    allowed : str
        What the model accepts, from the field's ``json_schema_extra["allowed"]``.
    description : str
        From the ``Parameters`` section of the owning model's docstring; empty when it has none.
    section : bool
        True when the key is a section (a nested model) rather than a setting.
    """

    key: str
    default: str
    allowed: str
    description: str
    section: bool = False


def field_descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Name -> description from the ``Parameters`` section of ``model``'s numpydoc docstring.

    A parameter line naming several settings (``arch, weights, image_size``) describes each of them; a name given
    with a trailing ``*`` or a type after `` : `` is read without them. Descriptions are joined into one line.
    """
    from numpydoc.docscrape import NumpyDocString

    doc = NumpyDocString(model.__doc__ or "")
    out: dict[str, str] = {}
    for param in doc["Parameters"]:
        text = " ".join(line.strip() for line in param.desc).strip()
        for name in param.name.split(","):
            name = name.strip().lstrip("*")
            if name:
                out[name] = text
    return out


def _nested(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _declared_in(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The model whose docstring describes ``model``'s field ``name``: a plugin's model for a field it added
    (``DECLARED_IN``, :func:`attnclust._settings._add_fields`), else ``model``."""
    return getattr(model, "DECLARED_IN", {}).get(name, model)


def _description(model: type[BaseModel], name: str, described: dict[str, str]) -> str:
    """``name``'s description: from its model's docstring, or from the plugin's model that declared it; a section
    a plugin declared (an analysis' ``syntax``) by that section model's one-line summary."""
    owner = _declared_in(model, name)
    if owner is model:
        return described.get(name, "")
    text = field_descriptions(owner).get(name, "")
    nested = _nested(model.model_fields[name].annotation)
    if not text and nested is owner:
        from numpydoc.docscrape import NumpyDocString

        text = " ".join(line.strip() for line in NumpyDocString(owner.__doc__ or "")["Summary"])
    return text


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def job_keys(model: type[BaseModel] | None = None, prefix: str = "") -> list[JobKey]:
    """Every key of ``model`` (default :class:`attnclust.config.JobConfig`), walking nested models recursively.

    A nested model's own key comes first (``section=True``), then its settings as ``section.setting``.
    """
    if model is None:
        from attnclust.config import JobConfig

        model = JobConfig
    described = field_descriptions(model)
    keys: list[JobKey] = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        nested = _nested(info.annotation)
        default = "" if nested is not None or info.default_factory is not None else _yaml(info.default)
        keys.append(JobKey(prefix + name, default, str(extra.get("allowed", "")),
                           _description(model, name, described), section=nested is not None))
        if nested is not None:
            keys.extend(job_keys(nested, f"{prefix}{name}."))
    return keys


def _models(model: type[BaseModel]) -> Iterable[tuple[str, type[BaseModel]]]:
    yield "", model
    for name, info in model.model_fields.items():
        nested = _nested(info.annotation)
        if nested is not None:
            yield from ((f"{name}.{inner}" if inner else name, m) for inner, m in _models(nested))


def undocumented_keys(model: type[BaseModel] | None = None) -> list[str]:
    """Dotted keys of ``model`` (default ``JobConfig``) whose docstring gives no description."""
    return [k.key for k in job_keys(model) if not k.description]


def described_but_missing(model: type[BaseModel] | None = None) -> list[str]:
    """Names described in a model's ``Parameters`` section that are no field of it (documented but missing)."""
    if model is None:
        from attnclust.config import JobConfig

        model = JobConfig
    missing = []
    for prefix, owner in _models(model):
        plugins = dict.fromkeys(m for m in getattr(owner, "DECLARED_IN", {}).values()
                                if getattr(m, "SECTION", None) == getattr(owner, "SECTION", ""))
        for described_in in (owner, *plugins):  # a plugin's model describes the settings it added to ``owner``
            for name in field_descriptions(described_in):
                if name not in described_in.model_fields:
                    missing.append(f"{prefix}.{name}" if prefix else name)
    return missing


def _cell(text: str) -> str:
    return text.replace("\n", " ").strip() or "\\-"


def _summary(model: type[BaseModel]) -> str:
    from numpydoc.docscrape import NumpyDocString

    doc = NumpyDocString(model.__doc__ or "")
    return "\n\n".join(part for part in (" ".join(doc["Summary"]), "\n".join(doc["Extended Summary"])) if part)


def job_reference_rst(model: type[BaseModel] | None = None) -> str:
    """The job reference as reStructuredText: the top-level keys, then one section per nested model."""
    if model is None:
        from attnclust.config import JobConfig

        model = JobConfig
    keys = job_keys(model)
    sections = {k.key: _nested(model.model_fields[k.key].annotation) for k in keys if k.section and "." not in k.key}
    lines: list[str] = []

    def table(rows: list[JobKey]) -> None:
        lines.extend([".. list-table::", "   :header-rows: 1", "   :widths: 22 12 22 44", "   :class: job-keys", "",
                      "   * - key", "     - default", "     - allowed", "     - meaning"])
        for k in rows:
            default = f"``{k.default}``" if k.default else "\\-"
            lines.extend([f"   * - ``{k.key}``", f"     - {default}", f"     - {_cell(k.allowed)}",
                          f"     - {_cell(k.description)}"])
        lines.append("")

    top = [k for k in keys if "." not in k.key and not k.section]
    title = "Top-level keys"
    lines.extend([title, "-" * len(title), "", _summary(model), ""])
    table(top)
    for name, section in sections.items():
        title = f"{name}"
        lines.extend([f".. _job-{name}:", "", title, "-" * len(title), "", _summary(section), ""])
        table([k for k in keys if k.key.startswith(name + ".") and not k.section])
    return "\n".join(lines)


# --- the output reference ---------------------------------------------------------------------------------------

_HEADING = re.compile(r"^#{2,4}\s+(.*)$")
_CODE = re.compile(r"`([^`]+)`")


def documented_files(markdown: str) -> set[str]:
    """File and directory names given (in backticks) in the headings of the output reference."""
    names: set[str] = set()
    for line in markdown.splitlines():
        match = _HEADING.match(line)
        if match:
            names.update(name.strip() for name in _CODE.findall(match.group(1)))
    return names


def documented_columns(markdown: str) -> dict[str, list[str]]:
    """Parquet file name -> the column names documented under its heading (first cell of each table row).

    Names may hold a placeholder in angle brackets (``share_<c>``), which stands for one or more characters.
    """
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in markdown.splitlines():
        match = _HEADING.match(line)
        if match:
            files = [n for n in _CODE.findall(match.group(1)) if n.endswith(".parquet")]
            current = []
            for name in files:
                current = out.setdefault(name, current)
            continue
        if line.startswith("|") and not set(line) <= set("|-: "):
            first = line.strip().strip("|").split("|")[0]
            current.extend(_CODE.findall(first))
    return out


def _pattern(name: str) -> re.Pattern:
    parts = re.split(r"<[^>]+>", name)
    return re.compile(".+".join(re.escape(p) for p in parts) + r"\Z")


def statistics() -> list[tuple[str, str, str]]:
    """``(name, unit, description)`` of every registered per-map statistic (:mod:`attnclust.maps.stats`)."""
    import attnclust.analysis  # noqa: F401 -- registers the built-in statistics and head analyses
    from attnclust.maps.stats import STATISTICS

    return [(s.name, s.unit, s.description) for s in STATISTICS.values()]


def head_analyses() -> list[tuple[str, tuple[str, ...], str, str]]:
    """``(name, columns, unit, description)`` of every registered head analysis (:mod:`attnclust.analysis.heads`)."""
    import attnclust.analysis  # noqa: F401
    from attnclust.analysis.heads import HEAD_ANALYSES

    return [(a.name, a.columns, a.unit, a.description) for a in HEAD_ANALYSES.values()]


def head_detectors() -> list[tuple[str, tuple[str, ...], str, str]]:
    """``(name, columns, scale, meaning)`` of every registered head detector (:mod:`attnclust.analysis.detectors`):
    its columns of ``decoder_protocols.parquet``, how it scores and its threshold, and its description with its
    version."""
    import attnclust.analysis  # noqa: F401
    from attnclust.analysis.detectors import HEAD_DETECTORS, PROTOCOL_FDR

    out = []
    for d in HEAD_DETECTORS.values():
        scale = ("its own (a perfect head scores 1)" if d.kind == "score" else
                 "TransformerLens's mul score of a 0/1 pattern of the tokens")
        threshold = f"{d.threshold:g}" if d.kind == "score" else f"{d.threshold:g} x what a perfect head scores"
        out.append((d.name, (d.name, f"{d.name}_p"), scale,
                    f"{d.description}; {d.name}_p: its one-sided permutation p-value against keys drawn at random "
                    f"from those each row sees; one of its heads: above {threshold} with a Benjamini-Hochberg "
                    f"q-value at most {PROTOCOL_FDR:g} (version {d.version})" if d.description.strip() else ""))
    return out


def extraction_analyses() -> list[tuple[str, str, str, str, str]]:
    """``(name, when, version, what it writes, description)`` of every registered extraction analysis
    (:mod:`attnclust.analysis.extraction`): per extract task (the ``map_stats.parquet`` columns it adds) or once per
    model (the files it writes)."""
    import attnclust.analysis  # noqa: F401
    from attnclust.analysis.extraction import EXTRACTION_ANALYSES, MODEL_ANALYSES
    from attnclust.layout import RunLayout

    layout = RunLayout(Path("run"))
    return [*((a.name, "each extract task", str(a.version), ", ".join(a.columns), a.description)
              for a in EXTRACTION_ANALYSES.values()),
            *((a.name, "once per model", str(a.current_version()), ", ".join(p.name for p in a.outputs(layout)),
               a.description) for a in MODEL_ANALYSES.values())]


STATISTIC_TABLES = ("map_stats.parquet", "maps.parquet", "heads.parquet", "clusters.parquet")
"""Tables holding one column per statistic (``heads`` and ``clusters``: their means)."""


def generated_columns() -> dict[str, list[str]]:
    """Columns the output reference documents through its generated tables: the registered statistics, head
    analyses and head detectors (``attnclust-statistics``, ``attnclust-head-analyses`` and
    ``attnclust-head-detectors``), each only when it has a description."""
    stats = [name for name, _, text in statistics() if text.strip()]
    out = {table: list(stats) for table in STATISTIC_TABLES}
    out["heads.parquet"] += [c for _, columns, _, text in head_analyses() if text.strip() for c in columns]
    out["decoder_protocols.parquet"] = [c for _, columns, _, text in head_detectors() if text.strip() for c in columns]
    return out


def undocumented_columns(run_dir: str | Path, markdown: str,
                         generated: dict[str, list[str]] | None = None) -> list[str]:
    """``file: column`` for every column of every ``*.parquet`` in ``run_dir`` that ``markdown`` does not document.

    ``generated`` (default :func:`generated_columns`) adds the columns documented by the generated tables. A
    table whose file has no heading in ``markdown`` is reported as ``file: (no section)``.
    """
    import pyarrow.parquet as pq

    documented = documented_columns(markdown)
    for table, names in (generated_columns() if generated is None else generated).items():
        if table in documented:
            documented[table] = documented[table] + names
    missing = []
    for path in sorted(Path(run_dir).glob("*.parquet")):
        names = documented.get(path.name)
        if names is None:
            missing.append(f"{path.name}: (no section)")
            continue
        patterns = [_pattern(n) for n in names]
        for column in pq.read_schema(path).names:
            if not any(p.match(column) for p in patterns):
                missing.append(f"{path.name}: {column}")
    return missing


def documented_but_missing(run_dirs: Iterable[str | Path], markdown: str) -> list[str]:
    """``file: column`` for every column the output reference documents that no table of ``run_dirs`` has.

    Files documented under one heading share their columns: a name counts as present when any of them has it.
    Headings none of whose files is in ``run_dirs`` are not checked (the runs did not write them).
    """
    import pyarrow.parquet as pq

    run_dirs = [Path(d) for d in run_dirs]
    groups: dict[int, tuple[list[str], list[str]]] = {}
    for name, columns in documented_columns(markdown).items():
        groups.setdefault(id(columns), (columns, []))[1].append(name)
    missing = []
    for columns, files in groups.values():
        paths = [d / f for d in run_dirs for f in files if (d / f).is_file()]
        if not paths:
            continue
        present = {c for p in paths for c in pq.read_schema(p).names}
        missing.extend(f"{', '.join(files)}: {c}" for c in columns
                       if not any(_pattern(c).match(name) for name in present))
    return missing


def undocumented_files(run_dir: str | Path, markdown: str) -> list[str]:
    """Names of the files and directories at the top of ``run_dir`` that no heading of ``markdown`` names."""
    documented = documented_files(markdown)
    return sorted(p.name for p in Path(run_dir).iterdir() if p.name not in documented)


# --- the command line -------------------------------------------------------------------------------------------

def command_help() -> list[tuple[str, str, str]]:
    """``(command, one-line help, full --help text)`` of every ``attnclust`` subcommand, from the CLI's parser."""
    import argparse
    import os

    from attnclust.cli import _parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "90"  # argparse wraps to the terminal's width; 90 fits the page
    try:
        parser = _parser()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        helps = {c.dest: c.help or "" for c in sub._choices_actions}
        return [(name, helps.get(name, ""), p.format_help()) for name, p in sub.choices.items()]
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# --- Sphinx -----------------------------------------------------------------------------------------------------

def setup(app):
    """Register the ``attnclust-job-reference`` directive."""
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective
    from sphinx.util.nodes import nested_parse_with_titles

    logger = logging.getLogger(__name__)

    class JobReference(SphinxDirective):
        """Every job key from the config models (``.. attnclust-job-reference::``)."""

        has_content = False

        def run(self):
            where = self.get_location()
            for key in undocumented_keys():
                logger.warning(f"job key {key!r} has no description in its config model's docstring "
                               "(Parameters section)", location=where)
            for key in described_but_missing():
                logger.warning(f"job key {key!r} is described in a config model's docstring but is no field",
                               location=where)
            node = nodes.section()
            node.document = self.state.document
            nested_parse_with_titles(self.state, StringList(job_reference_rst().splitlines(), source=where),
                                     node)
            return node.children

    def table(headers: list[str], rows: list[list[tuple[str, bool]]], widths: list[int]) -> nodes.table:
        group = nodes.tgroup(cols=len(headers))
        group.extend(nodes.colspec(colwidth=w) for w in widths)
        head, body = nodes.thead(), nodes.tbody()
        head += nodes.row("", *(nodes.entry("", nodes.paragraph(text=h)) for h in headers))
        for cells in rows:
            body += nodes.row("", *(nodes.entry("", nodes.paragraph("", "", nodes.literal(text=text) if code
                                                                    else nodes.Text(text)))
                                    for text, code in cells))
        group += head
        group += body
        return nodes.table("", group, classes=["attnclust-generated"])

    def described(directive, what: str, entries, headers: list[str], widths: list[int]) -> list[nodes.table]:
        """A generated table of a registry: ``entries`` yields ``(name, cells, text)``, ``cells`` its first
        cells (the first in code), ``text`` its description (last column); a missing description is warned about."""
        rows = []
        for name, cells, text in entries:
            if not text.strip():
                logger.warning(f"{what} {name!r} has no description", location=directive.get_location())
            rows.append([(cells[0], True), *((c, False) for c in cells[1:]), (text, False)])
        return [table(headers, rows, widths)]

    class Statistics(SphinxDirective):
        """Every registered per-map statistic (``attnclust-statistics``)."""

        def run(self):
            return described(self, "statistic", ((name, [name, unit], text) for name, unit, text in statistics()),
                             ["column", "unit", "meaning"], [20, 10, 70])

    class HeadAnalyses(SphinxDirective):
        """Every registered head analysis and its columns (``attnclust-head-analyses``)."""

        def run(self):
            return described(self, "head analysis", ((name, [", ".join(columns), name, unit], text)
                                                     for name, columns, unit, text in head_analyses()),
                             ["columns", "analysis", "unit", "meaning"], [30, 15, 10, 45])

    class HeadDetectors(SphinxDirective):
        """Every registered head detector and its columns (``attnclust-head-detectors``)."""

        def run(self):
            return described(self, "head detector", ((name, [", ".join(columns), name, scale], text)
                                                     for name, columns, scale, text in head_detectors()),
                             ["columns", "detector", "scale", "meaning"], [30, 15, 15, 40])

    class ExtractionAnalyses(SphinxDirective):
        """Every registered extraction analysis, what it writes (``attnclust-extraction-analyses``)."""

        def run(self):
            rows = [[(name, True), (when, False), (version, False), (writes, True), (text, False)]
                    for name, when, version, writes, text in extraction_analyses()]
            return [table(["analysis", "runs", "version", "writes", "what it measures"], rows, [15, 15, 8, 27, 35])]

    class Commands(SphinxDirective):
        """Every ``attnclust`` subcommand with its ``--help`` (``attnclust-commands``)."""

        def run(self):
            out = []
            for name, text, usage in command_help():
                section = nodes.section(ids=[f"command-{name}"], names=[f"attnclust {name}"])
                section += nodes.title(text=f"attnclust {name}")
                section += nodes.paragraph(text=text[:1].upper() + text[1:] + ".")
                section += nodes.literal_block(usage, usage, language="text")
                out.append(section)
            return out

    app.add_directive("attnclust-job-reference", JobReference)
    app.add_directive("attnclust-commands", Commands)
    app.add_directive("attnclust-statistics", Statistics)
    app.add_directive("attnclust-head-analyses", HeadAnalyses)
    app.add_directive("attnclust-head-detectors", HeadDetectors)
    app.add_directive("attnclust-extraction-analyses", ExtractionAnalyses)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

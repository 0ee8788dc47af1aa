"""Sphinx configuration of the attnclust documentation (``.venv/bin/sphinx-build -W -b html docs docs/_build/html``).

Markdown pages are MyST, the tutorial notebook is executed on every build by myst-nb (a failing cell fails the
build), docstrings are numpydoc, and the job reference is generated from the config models by ``_ext``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

import attnclust  # noqa: E402

project = "attnclust"
author = "the attnclust developers"
copyright = "2026, the attnclust developers"  # noqa: A001 -- Sphinx's name
version = release = attnclust.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
    "attnclust_docs",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints", "README.md"]
root_doc = "index"
smartquotes = False  # quotes in descriptions stay as written (token names like '.' and ',')

# MyST: ``{ref}`` targets from headings, definition lists, $math$.
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# myst-nb: execute the tutorial on every build, in a temporary directory (its runs never land in docs/); an
# error in a cell is an error of the build.
nb_execution_mode = "force"
nb_execution_in_temp = True
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# autodoc + numpydoc: members are listed explicitly in api.rst.
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autosummary_generate = False
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = "attnclust"
html_static_path = ["_static"]
html_css_files = ["attnclust.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": [], "getting-started": []}
html_show_sourcelink = False

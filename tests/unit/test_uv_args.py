""".ci/uv_args.py: pip's configuration on the machine as the options of ``uv pip install`` (.ci/setup)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "uv_args.py"


def _uv_options():
    spec = importlib.util.spec_from_file_location("uv_args", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.uv_options


def test_each_index_wheel_folder_and_constraint_becomes_an_option_the_variables_over_the_files():
    listed = "\n".join([
        ":env:.cert='/etc/ssl/certs/ca.crt'",
        ":env:.find-links='/opt/wheels'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/srv/old-wheels'",
        "user.index-url='\\nhttps://mirror.example/simple\\n'",  # a value over several lines of a config file
        "site.timeout='60'",
    ])
    assert sorted(_uv_options()(listed)) == sorted([
        "--find-links=/opt/wheels", "--constraint=/etc/xdg/pip/constraints.txt",
        "--extra-index-url=file:///opt/a/simple", "--extra-index-url=file:///opt/b/simple",
        "--index-url=https://mirror.example/simple"])


def test_a_machine_without_pip_configuration_gives_no_options():
    assert _uv_options()("") == []

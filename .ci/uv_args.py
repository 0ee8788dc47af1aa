"""Print pip's configuration on this machine as the matching `uv pip install` options, one per line.

`.ci/setup` installs with uv (it unpacks torch and the CUDA libraries its wheel depends on in parallel: about a
minute against pip's two to three, bench/HISTORY.md), but uv does not read pip's configuration files or `PIP_*`
variables. The indexes, wheel folders and constraints a machine points pip at (a local torch wheel, a version
cap) must hold for uv too, so they are carried over here. Run with the venv's Python: `python uv_args.py`.
"""

import ast
import subprocess
import sys

# pip's option -> uv's; pip takes a list separated by spaces or newlines in one value for these
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# later wins, as pip reads them: the files global < user < site, then the PIP_* variables
SCOPES = ("global", "user", "site", ":env:")


def main() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    for option in uv_options(listed):
        print(option)


def uv_options(listed: str) -> list[str]:
    """The ``uv pip install`` options of what ``pip config list`` printed (``listed``)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        if key not in OPTIONS or scope not in SCOPES:
            continue
        rank = SCOPES.index(scope)
        if key not in chosen or rank >= chosen[key][0]:
            chosen[key] = (rank, _value(value))
    return [f"{OPTIONS[key]}={item}" for key, (_, value) in chosen.items() for item in value.split()]


def _value(shown: str) -> str:
    """A value as ``pip config list`` shows it: Python's ``repr`` of the string (newlines escaped)."""
    try:
        value = ast.literal_eval(shown.strip())
    except (ValueError, SyntaxError):
        return shown.strip()
    return value if isinstance(value, str) else shown.strip()


if __name__ == "__main__":
    main()

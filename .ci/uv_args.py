"""Print pip's configuration on this machine as the matching `uv pip install` options, one per line.

`.ci/setup` installs with uv (it unpacks torch and the CUDA libraries its wheel depends on in parallel: about a
minute against pip's two to three, bench/HISTORY.md), but uv does not read pip's configuration files or `PIP_*`
variables. The indexes, wheel folders and constraints a machine points pip at (a local torch wheel, a version
cap) must hold for uv too, so they are carried over here. Run with the venv's Python: `python uv_args.py`.
"""

import shlex
import subprocess
import sys

# pip's option -> uv's; pip takes a space-separated list in one value for these
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
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        scope, _, key = name.rpartition(".")
        if key not in OPTIONS or scope not in SCOPES:
            continue
        rank = SCOPES.index(scope)
        if key not in chosen or rank >= chosen[key][0]:
            chosen[key] = (rank, value.strip().strip("'\""))
    for key, (_, value) in chosen.items():
        for item in shlex.split(value):
            print(f"{OPTIONS[key]}={item}")


if __name__ == "__main__":
    main()

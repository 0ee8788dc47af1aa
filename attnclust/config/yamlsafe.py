"""YAML safety: the values a job's YAML may expand to through its aliases are bounded, before anything reads them."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

__all__ = ["MAX_EXPANDED_VALUES"]


MAX_EXPANDED_VALUES = 100_000
"""Most values a job's YAML aliases (``*name``) may expand to: a job holds about a hundred settings."""


def _refuse_alias_bombs(raw: Any, where: str) -> None:
    """Refuse YAML whose aliases expand past :data:`MAX_EXPANDED_VALUES` values, or make a list hold itself.

    ``yaml.safe_load`` builds an aliased node once and shares it, so a "billion laughs" (ten levels of lists of
    nine aliases of the level below: 9^10 values from about 500 bytes) loads quickly; whatever walks or prints the value
    afterwards (validation, an error message) would not finish. The expanded size is counted here over the shared
    lists and mappings, each once, before anything reads the values.
    """
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()
    shared = False

    def size(item: Any) -> int:
        nonlocal shared
        if not isinstance(item, (list, dict)):
            return 1
        if id(item) in open_ids:
            raise ConfigError(f"{where}: a YAML alias refers to itself (a list or mapping that holds itself); a job "
                              f"setting is never recursive: write the value out")
        if id(item) in sizes:
            shared = True
            return sizes[id(item)]
        open_ids.add(id(item))
        total = 1
        for child in [*item.keys(), *item.values()] if isinstance(item, dict) else item:
            total += size(child)  # one frame a level: the parser's own nesting limit keeps it in the stack
        sizes[id(item)] = total
        open_ids.discard(id(item))
        return total

    try:
        total = size(raw)
    except RecursionError:
        raise ConfigError(f"{where}: is nested too deeply (lists or mappings inside each other); a job file nests "
                          f"two levels: fix the file") from None
    if total <= MAX_EXPANDED_VALUES or not shared:  # without aliases the file's size bounds it
        return
    path, node = [], raw
    while isinstance(node, dict) and len(path) < 2:  # name the section.key that expands
        big = next((k for k, v in node.items() if size(v) > MAX_EXPANDED_VALUES), None)
        if big is None:
            break
        path.append(str(big))
        node = node[big]
    at = f" in {'.'.join(path)}" if path else ""
    raise ConfigError(f"{where}: YAML aliases (*name){at} expand to {total:,} values, more than the "
                      f"{MAX_EXPANDED_VALUES:,} a job may hold (an alias expansion bomb?); write the values out "
                      f"instead of aliasing them")

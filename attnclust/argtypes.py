"""Argument types of the two command lines (``attnclust``, :mod:`attnclust.cli`; ``dask-submit``,
:mod:`attnclust.service.submit`): numbers in ASCII digits, so that both read ``--port`` or ``--timeout`` alike.
"""

from __future__ import annotations

import argparse

__all__ = ["ascii_digits", "integer", "number", "port"]


def port(value: str) -> int:
    """An argparse type: a TCP port 0..65535 in ASCII digits."""
    if not ascii_digits(value) or int(value) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a port number 0..65535")
    return int(value)


def ascii_digits(value: str) -> bool:
    """Digits 0-9 only: Python's ``int()`` also reads other scripts' digits (``'١٢'`` -> 12), the CLI does not."""
    return 0 < len(value) <= 18 and value.isascii() and value.isdigit()


def integer(value: str) -> int:
    """An argparse type: an integer written in ASCII digits (the command checks its range)."""
    if not ascii_digits(value.removeprefix("-")):
        raise argparse.ArgumentTypeError(f"{value!r}: expected an integer (digits 0-9)")
    return int(value)


def number(value: str) -> float:
    """An argparse type: a finite number written in ASCII (``0.5``, ``1e-3``)."""
    import math

    try:
        parsed = float(value) if value.isascii() else math.nan
    except ValueError:
        parsed = math.nan
    if not math.isfinite(parsed):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a finite number such as 0.5 (ASCII digits)")
    return parsed

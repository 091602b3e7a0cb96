"""argparse value types shared by every ``irpe`` subcommand (irpe, data, training, export):
a bad value is a one-line usage error naming the flag, exit status 2."""
from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["number", "positive"]


def number(kind: type = int, minimum: float = 1) -> Callable[[str], float]:
    """argparse type: a ``kind`` number >= ``minimum``, with a clear usage error otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


positive = number(int, 1)  # an integer >= 1 (sizes, counts, threads)

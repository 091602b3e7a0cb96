"""The one vocabulary of the product's three-way switches (docs/settings.md): ``auto`` (the code
chooses: the faster path where it is there, else the plain one), ``on`` (that path: required or
forced) and ``off`` (never). The ONNX Runtime custom-op library mode and the fused iRPE
attention mode of torch models are such switches.

Older spellings a configuration file or an environment variable may still hold (``1/true/yes``,
``0/false/no``; ``fused`` / ``unfused`` of the fused-attention switch) are mapped by
:data:`SWITCH_ALIASES`, the one alias table; code, help texts and docs use the three words.
"""
from __future__ import annotations

from typing import Dict, Literal, Tuple

from irpe.errors import InvalidInput

__all__ = ["Switch", "SWITCHES", "SWITCH_ALIASES", "normalize_switch", "parse_switch"]

Switch = Literal["auto", "on", "off"]
SWITCHES: Tuple[Switch, ...] = ("auto", "on", "off")
SWITCH_ALIASES: Dict[str, Switch] = {
    "1": "on", "true": "on", "yes": "on", "fused": "on",
    "0": "off", "false": "off", "no": "off", "unfused": "off",
}


def normalize_switch(text: str) -> str:
    """``text`` stripped and lower-cased, an older spelling replaced by its value (unchecked:
    a typed setting then refuses what is not a switch value)."""
    value = text.strip().lower()
    return SWITCH_ALIASES.get(value, value)


def parse_switch(text: str, what: str) -> Switch:
    """The switch value ``text`` spells (any case, older spellings accepted); ValueError naming
    ``what`` (e.g. "custom-ops mode") otherwise."""
    value = normalize_switch(text)
    for switch in SWITCHES:
        if value == switch:
            return switch
    raise InvalidInput(f"{what} must be auto, on or off, got {text!r}")

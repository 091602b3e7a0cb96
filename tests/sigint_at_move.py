"""``python tests/sigint_at_move.py SUFFIX[@N] ARGS...``: ``irpe ARGS`` in this process, with a
real SIGINT sent to it just before the N-th (default 1st) file whose name ends in SUFFIX is
moved into place: inside irpe.atomic's held block, so the Ctrl-C arrives while it is held, as a
key pressed during the final write would. Nothing else changes; the exit status is irpe's."""
import os
import signal
import sys

from irpe.cli import main

_SUFFIX, _, _NTH = sys.argv[1].partition("@")
_REPLACE = os.replace
_seen = [0]


def _replace(src, dst, *args, **kwargs):
    """os.replace, with SIGINT raised before the chosen move (delivered after the held block)."""
    if str(dst).endswith(_SUFFIX):
        _seen[0] += 1
        if _seen[0] == int(_NTH or 1):
            os.kill(os.getpid(), signal.SIGINT)
    return _REPLACE(src, dst, *args, **kwargs)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
    os.replace = _replace
    sys.exit(main(sys.argv[2:]))

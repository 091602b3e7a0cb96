"""``python -m irpe`` == the ``irpe`` console script (also torchrun's entry: ``-m irpe``)."""
import os
import sys

from .console import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
    # A torchrun worker whose job is done (process group destroyed, files written) leaves
    # without running C++ static destructors: gloo's left a joinable thread there and the
    # process aborted at exit ("terminate called without an active exception", exit -6) in
    # 2 of the 6 full test runs of this session (in 2 different torchrun tests), after its work
    # had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)

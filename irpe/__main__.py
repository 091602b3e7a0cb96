"""``python -m irpe`` == the ``irpe`` console script."""
import sys

from .cli import main

sys.exit(main())

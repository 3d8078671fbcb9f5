"""``python -m sqs_lease._sim run|soak|replay`` (see :mod:`sqs_lease._sim.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

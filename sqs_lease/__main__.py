"""``python -m sqs_lease``: the ``sqs-lease`` command line (e.g. ``python -m sqs_lease worker``)."""

from .cli import main

if __name__ == "__main__":
    main()

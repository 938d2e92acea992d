"""`python -m via_sd`: runs the command line in via_sd/cli/ (one module per sub-command)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m vlmgym.cli ...`: the `vlmgym` command where the package is on PYTHONPATH but not installed."""

import sys

from vlmgym.cli import main

sys.exit(main())

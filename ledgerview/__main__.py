"""``python -m ledgerview``: the same command line as the ``ledgerview`` console script."""

import sys

from ledgerview.cli import main

sys.exit(main())

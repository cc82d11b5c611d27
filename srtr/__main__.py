"""`python -m srtr`: the same entry point as the `srtr` console script."""

import sys

from srtr.cli import main

sys.exit(main())

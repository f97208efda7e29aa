"""`python -m iasgd.plot`: see iasgd.plot.cli."""

import sys

from iasgd.plot.cli import main

sys.exit(main())

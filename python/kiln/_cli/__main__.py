"""python -m kiln._cli: the kiln command (where it is not installed as a console script)."""

import sys

from . import main

sys.exit(main())

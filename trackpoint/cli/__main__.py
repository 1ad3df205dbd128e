"""``python -m trackpoint.cli``."""

import sys

from trackpoint.cli.main import main

sys.exit(main())

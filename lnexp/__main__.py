"""``python -m lnexp``: the same as the ``lnexp`` command."""

import sys

from lnexp.cli import main

sys.exit(main())

"""``python -m veil.server.cli``: the ``veil`` command without its console script."""

import sys

from veil.server.cli import main

sys.exit(main())

"""``python -m scenarios.cli ARGS``: the ``coevo`` command line."""

import sys

from scenarios.cli.main import main

sys.exit(main())

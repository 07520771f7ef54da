"""``python -m scipy_gpuqr``: the command-line interface."""

import sys

from ._cli.main import main

sys.exit(main())

"""``python -m ablate``: the ``ablate`` command."""

import sys

from ablate.main import main

sys.exit(main())

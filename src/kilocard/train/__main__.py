"""``python -m kilocard.train <run_dir>``: the per-rank training entry (see ``kilocard.train.entry``)."""

import sys

from kilocard.train.entry import main

sys.exit(main())

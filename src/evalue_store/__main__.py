"""``python -m evalue_store``: the ``evalue-store`` command line, without the script on PATH."""

import sys

from .cli import script

sys.exit(script())

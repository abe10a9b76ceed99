"""``python -m vtinfer``: the same as the ``vtinfer`` command."""

import sys

from vtinfer.cli import main

sys.exit(main())

"""``python -m frontier.demo``: see :mod:`frontier.demo.run`."""

import sys

from frontier.demo.run import main

sys.exit(main())

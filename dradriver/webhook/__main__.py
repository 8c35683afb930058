"""``python -m dradriver.webhook``: the same as ``dradriver-webhook``."""

import sys

from dradriver.webhook.server import main

sys.exit(main())

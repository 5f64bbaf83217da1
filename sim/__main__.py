from __future__ import annotations

import sys

from sim.cli.main import main

sys.exit(main())

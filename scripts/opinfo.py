#!/usr/bin/env python3
"""jvpc against PyTorch's OpInfo database (the figures of docs/opinfo.md). The code is
python/tests/opinfo.py, which ctest runs on the CI subset; see its --help.

  PYTHONPATH=build/python python3 scripts/opinfo.py [--ops sin,mm,...] [--timeout 120] [--json out.json]
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
import opinfo  # noqa: E402

if __name__ == "__main__":
    sys.exit(opinfo.main())

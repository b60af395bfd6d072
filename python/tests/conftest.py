"""The tests' shared setup: the small DiT they train is the MeanFlow example's
(examples/meanflow_digits/dit.py), imported as `dit` with that folder on sys.path."""

import os
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "meanflow_digits")
if EXAMPLE not in sys.path:
    sys.path.insert(0, EXAMPLE)

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # python/
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

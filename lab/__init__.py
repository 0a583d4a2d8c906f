"""Instruments that drive other programs (npm agents, a headless Chromium, llama.cpp's own
tools built with cmake) against edgespec. They run from a checkout (``python -m lab.…``)
and are not installed with the package; they may import ``edgespec``, never the reverse."""

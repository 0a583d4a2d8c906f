"""Load llama.cpp's shared libraries before numpy's, in a process that will run a model.

A CUDA build of llama.cpp can crash (SIGSEGV) inside ``llama_model_load_from_file`` in a
process that imported numpy before ``llama_cpp``, and not in one that imported
``llama_cpp`` first (llama-cpp-python issue 1581 reports the same with pandas; what was
seen, and where, is in docs/gpu.md). The cause is unknown, so this runs before anything
of ours imports numpy: in ``edgespec.decoding``'s package init, the first of our modules
to import numpy, through which the CLI, the Python API, the app, the server and the
benchmark all come (the set-up's smoke check imports no numpy before llama.cpp). A
program that imports numpy, pandas or gradio before edgespec is on its own: import
edgespec (or ``llama_cpp``) first. This module imports nothing else.
"""

from __future__ import annotations

import contextlib
import sys


def load_llama_cpp_first() -> None:
    """Import ``llama_cpp`` (whose first module loads libllama and its backends) unless
    numpy is in already, when it is too late to matter. A missing or broken install is not
    reported here: the import that needs it says so in one line."""
    if "llama_cpp" in sys.modules or "numpy" in sys.modules:
        return
    with contextlib.suppress(ImportError, OSError, RuntimeError):
        import llama_cpp  # noqa: F401  (loaded for its side effect: the libraries' order)

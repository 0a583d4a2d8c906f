"""edgespec: exact speculative decoding for local GGUF models through llama.cpp.

Layers, each importing only from the ones listed before it:

* ``errors``, ``progress`` — one-line user errors and progress bars, used everywhere;
* ``models`` — the catalog, pulls, the verified cache, the GGUF header reader;
* ``runtime`` — one loaded model in llama.cpp, chat templates, pair compatibility;
* ``decoding`` — the math (sampling, acceptance), drafters, policies, the controller and
  its cost model, the engine loop and the events it yields;
* ``api`` — ``EdgeSpec``, the Python API every front end uses;
* ``bench``, ``ui``, ``server``, ``cli`` — front ends over the API and its events.

``bootstrap`` stands apart: it sets the machine up with the standard library alone.

    from edgespec import EdgeSpec
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from edgespec.api import EdgeSpec

__all__ = ["EdgeSpec", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `python -m edgespec.bootstrap` runs before llama.cpp is
    # installed, and `edgespec --help` should not load it either.
    if name == "EdgeSpec":
        from edgespec.api import EdgeSpec

        return EdgeSpec
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")

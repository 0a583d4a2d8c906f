"""Speculative decoding itself. The math as pure functions (``sampling``, ``acceptance``);
the proposers, one file each (``drafters/``); who drafts how much (``policy`` for fixed
settings, ``controller`` with its measured ``costs`` for ``auto``); the loop that joins
them (``engine``) and what it yields (``events``, ``textstream``). A change to how tokens
are proposed, verified, priced or streamed goes here."""

from edgespec.runtime.preload import load_llama_cpp_first

# Every front end (the CLI, the Python API, the app, the server, the benchmark) comes through here
# before any module below imports numpy: llama.cpp's libraries go first (see
# edgespec.runtime.preload).
load_llama_cpp_first()

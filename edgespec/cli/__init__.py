"""The ``edgespec`` command: ``main`` parses and reports errors; one module per
subcommand family (``generate`` for generate/chat, ``models``, ``bench``). A new
subcommand is a new module here, using only the API and its events."""

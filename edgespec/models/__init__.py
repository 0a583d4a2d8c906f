"""Model files: the catalog (``catalog``), pulls from the hub or the package registry
(``fetch``), the sha256-verified cache (``store``), turning a name or path into a local
file (``resolve``), and the GGUF header reader that rejects bad files in one line
(``gguf``). Nothing here loads llama.cpp; a change to where models come from goes here."""

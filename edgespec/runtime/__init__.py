"""The llama.cpp layer: one loaded model with its KV cache, batched decode, rollback and
tokenizer (``model``), chat templates rendered from the GGUF (``chat_template``), the
draft/target vocabulary check (``compat``). A change to how llama.cpp is called, loaded
or configured goes here; nothing here knows about speculation."""

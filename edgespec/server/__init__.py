"""The OpenAI-compatible HTTP server (``edgespec serve``): ``app.py`` holds the FastAPI
routes (health, models, chat and text completions) and the authentication and error
handling around them, ``schemas.py`` turns request bodies into validated generation jobs,
``queue.py`` runs those jobs one at a time on the shared engine in arrival order, and
``chunks.py`` builds the OpenAI-shaped responses and stream chunks with the speculation
figures (usage, timings, which drafter ran) added."""

"""The Gradio chat app: ``layout`` builds the page and wires events, ``handlers`` holds
what the buttons do, ``session`` per-tab state, ``answer`` folds one
answer's events into what the panels show, ``text`` and ``figures`` render them, and
``reasons`` puts the controller's reason for each step into words."""

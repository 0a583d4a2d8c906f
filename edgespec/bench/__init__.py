"""The benchmark: configurations run side by side through one engine (``runner``) on
the built-in prompts (``prompts``). Its command is ``edgespec bench`` (``cli.bench``)."""

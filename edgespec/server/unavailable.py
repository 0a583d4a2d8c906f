"""The target cannot answer (a worker it is split over was lost): every answer running or
waiting ends at once with an error, and every model endpoint refuses with 503 and
``Retry-After`` until the server is serving again (``cli/serve_restart.py`` restarts it).

A lost worker leaves the pair's loop waiting for good inside a pass, so nothing the loop
would do ends those answers: ``EdgeSpec.end_answers`` ends them, each with its error and
``END`` handed to its reader once, and every call waiting on the loop (an embedding
request's batches), with the same refusal (a later hand-over, from a loop that was not
stuck after all, goes nowhere). An answer that a request queues just after the loss is ended the same way
by a sweep that runs until the process restarts.
"""

from __future__ import annotations

import threading
import time

from edgespec.api import EdgeSpec
from edgespec.server.errors import ApiError
from edgespec.server.pipeline import RETRY_AFTER_S

CODE = "target_unavailable"
SWEEP_S = 0.5  # how soon an answer queued after the loss is ended


def refusal(reason: str) -> ApiError:
    """What a request is told while the target is unavailable, ``reason`` saying why."""
    return ApiError(
        503,
        f"the target is unavailable: {reason}",
        type="server_error",
        code=CODE,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def sweep(lm: EdgeSpec, error: BaseException, every_s: float = SWEEP_S) -> threading.Thread:
    """Go on ending the answers queued on ``lm`` (a request that was past the check when
    the worker was lost), every ``every_s`` seconds, for the process's life."""

    def run() -> None:
        while True:
            time.sleep(every_s)
            lm.end_answers(error)

    thread = threading.Thread(target=run, name="edgespec-unavailable", daemon=True)
    thread.start()
    return thread

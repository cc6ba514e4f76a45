"""A test helper that does something in a thread for as long as a `with` block lasts."""

from __future__ import annotations

import threading
from typing import Any


class Background:
    """Runs `run()` in a daemon thread from entering the `with` block to leaving it; `run()` must
    return soon after `stopping` is set."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._thread.join(timeout=120)

    def run(self) -> None:
        raise NotImplementedError

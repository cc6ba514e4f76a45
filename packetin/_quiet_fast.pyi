# Types of the C module packetin/_quiet_fast.c (see packetin/quiet.py).
from typing import Any

def wait(epfd: int, maxevents: int, timeout_ms: int, sock: int, arm: tuple[Any, ...] | None,
         /) -> tuple[list[tuple[int, int]], tuple[bytes, float, float, Any, bool, str | None, int, int] | None]: ...

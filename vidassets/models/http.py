"""POST to a model server with retries: exponential backoff on transport errors, 429 and 5xx (and on a
reply that does not parse); other HTTP errors are final. Standard library only."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def post_with_retries(url: str, body: bytes, headers: dict[str, str], timeout: float, retries: int, backoff: float,
                      parse: Callable[[bytes], T], on_attempt: Callable[[], None] = lambda: None,
                      what: str = "response") -> tuple[T | None, str | None, int]:
    """(parsed reply, None, attempts) or (None, the last error, attempts)."""
    last = "not sent"
    attempt = 0
    for attempt in range(1, retries + 2):
        on_attempt()
        try:
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return parse(response.read()), None, attempt
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace')}"
            if exc.code not in RETRYABLE_STATUS:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = f"{exc.__class__.__name__}: {getattr(exc, 'reason', exc)}"
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            last = f"malformed {what}: {exc!r}"
        if attempt <= retries:
            time.sleep(backoff * 2 ** (attempt - 1))
    return None, last, attempt

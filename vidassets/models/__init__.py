"""Model wrappers (no Dagster). Each loads once, declares ``version`` and scores a batch of RGB
uint8 frames; nothing outside this package imports the model libraries."""

import functools
from importlib.metadata import PackageNotFoundError, version


@functools.cache
def package_version(name: str) -> str:
    """A distribution's installed version ("missing" when it is not installed)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


_CALLS = [0]


def record_calls(n: int = 1) -> None:
    """Every wrapper reports each frame it runs a model on (so stages can prove they made none)."""
    _CALLS[0] += n


def model_calls_total() -> int:
    return _CALLS[0]

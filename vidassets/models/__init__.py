"""Model wrappers (no Dagster). Each loads once, declares ``version`` and scores a batch of RGB
uint8 frames; nothing outside this package imports the model libraries."""

from importlib.metadata import PackageNotFoundError, version


def package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"

"""MkDocs hook: fills each page's generated parts and figures in (``gen.fill``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import gen  # noqa: E402


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return gen.fill(markdown)

"""Stored blobs as values: an embedding vector from its bytes, saved context frames (JPEG) as RGB
arrays. Every stage that reads what another stored goes through these."""

from __future__ import annotations

import cv2
import numpy as np

from vidassets.storage.objects import ObjectStore


def vector_of(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


def load_images(objects: ObjectStore, keys) -> list[np.ndarray]:
    """Saved context frames (JPEG blobs) as RGB arrays; unreadable blobs are skipped."""
    images = []
    for key in keys:
        bgr = cv2.imdecode(np.frombuffer(objects.get_bytes(key), np.uint8), cv2.IMREAD_COLOR)
        if bgr is not None:
            images.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return images

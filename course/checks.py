"""What the notebooks' checks share: error demonstrations that name their error, and
tolerances derived from the number format instead of tuned until a test passes."""

import numpy as np

UNIT_ROUNDOFF = {  # u = 2^-(significand bits): one rounding errs by at most u of its result
    "float32": 2.0**-24,
    "tensorfloat32": 2.0**-11,  # a GPU's default float32 matmul (Ampere and newer): 10 stored bits
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,  # 7 stored bits + the implicit one; a TPU's default float32 matmul passes
}


def matmul_format(device, dtype: str = "float32") -> str:
    """The number format a matmul of `dtype` inputs really rounds to on `device` at JAX's default
    precision: float32 inputs go through bfloat16 passes on a TPU and TF32 on an Ampere or newer
    GPU (JAX's "Matmul precision"); XLA:CPU computes in float32."""
    if dtype != "float32":
        return dtype
    if device.platform == "tpu":
        return "bfloat16"
    if device.platform == "gpu" and not any(old in device.device_kind for old in ("T4", "V100", "P100")):
        return "tensorfloat32"
    return "float32"


def tolerance(fmt: str, roundings: int) -> float:
    """How far two computations of the same values may drift apart, relative to the size of the
    values they sum: each rounding in `fmt` errs by at most u (UNIT_ROUNDOFF) of its result, the
    errors of `roundings` successive roundings add up (first order), and each of the two
    computations carries its own: 2 · roundings · u."""
    return 2 * roundings * UNIT_ROUNDOFF[fmt]


def assert_close(actual, expected, fmt: str, roundings: int, what: str = "") -> float:
    """|actual - expected| <= tolerance(fmt, roundings) · max|expected|, elementwise. The bound is
    relative to the array's scale, not to each element: a sum's rounding error scales with the
    terms summed, so an element that cancels to near zero keeps the error of its terms.
    Returns the largest difference as a fraction of the scale."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert np.all(np.isfinite(actual)), f"{what}: not finite"
    scale = float(np.max(np.abs(expected))) or 1.0
    gap = float(np.max(np.abs(actual - expected))) / scale
    limit = tolerance(fmt, roundings)
    assert gap <= limit, (f"{what}: differs by {gap:.2e} of its scale, more than {fmt} allows after "
                          f"{roundings} roundings ({limit:.2e})")
    return gap


class expect_error:
    """`with expect_error(ValueError): ...` shows an error on purpose: it prints the error's type
    and message and carries on, and fails if nothing is raised or something else is (a NameError
    from a typo, a TypeError from a changed API). jax=True accepts any error JAX defines (some
    have no public import path), never Python's NameError, AttributeError, ImportError or
    TypeError."""

    def __init__(self, *types: type, jax: bool = False):
        self.types, self.jax, self.error = types, jax, None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        wanted = " or ".join([t.__name__ for t in self.types] + ["an error from JAX"] * self.jax)
        if kind is None:
            raise AssertionError(f"expected {wanted}, but nothing was raised: the error this cell "
                                 "shows stopped happening")
        from_jax = kind.__module__.split(".")[0] in ("jax", "jaxlib") and not issubclass(
            kind, (NameError, AttributeError, ImportError, TypeError))
        if not (issubclass(kind, self.types) or (self.jax and from_jax)):
            return False  # not the error this cell shows: let it propagate
        self.error = error
        print(f"{kind.__name__}: {error}")
        return True

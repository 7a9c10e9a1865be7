"""Count a step's FLOPs the same way on every backend, and the peak to divide them by.

`matmul_flops` counts the matrix products in the program JAX traces (its jaxpr), 2 FLOPs per
multiply-add, with each loop's body times its trip count. It does not ask the compiler, whose
count differs by backend: XLA:GPU's `cost_analysis()` leaves out the matmuls it hands to cuBLAS,
and every backend's counts a while loop's body (a `scan`) once. What it leaves out, the
elementwise work (softmax, norms, the optimizer), is a few percent in a Transformer.
"""

import math

import jax

PEAK_FLOPS = (  # (part of device_kind, dense FLOP/s per JAX device, what the figure is); first match wins
    ("TPU7x", 2307e12, "bf16"),  # Ironwood: 4,614 TFLOP/s in fp8, half that in bf16
    ("TPU v7", 2307e12, "bf16"),
    ("TPU v5 lite", 197e12, "bf16"),  # TPU v5e
    ("TPU v5e", 197e12, "bf16"),
    ("TPU v5", 459e12, "bf16"),  # TPU v5p
    ("TPU v6 lite", 918e12, "bf16"),  # TPU v6e (Trillium)
    ("TPU v6e", 918e12, "bf16"),
    ("TPU v4", 275e12, "bf16"),
    ("TPU v3", 61.5e12, "bf16, one TensorCore: half a chip"),
    ("TPU v2", 22.5e12, "bf16, one TensorCore: half a chip"),
    ("GB200", 2.5e15, "bf16 dense, per Blackwell GPU of a GB200"),  # before "B200": a substring
    ("B200", 2.25e15, "bf16 dense"),
    ("H100 PCIe", 756e12, "bf16 dense"),
    ("H100 NVL", 835e12, "bf16 dense"),
    ("H100", 989e12, "bf16 dense, SXM"),
    ("H200", 989e12, "bf16 dense"),
    ("A100", 312e12, "bf16 dense"),
    ("L40S", 362e12, "bf16 dense"),
    ("L40", 181e12, "bf16 dense"),
    ("L4", 121e12, "bf16 dense"),
    ("V100", 125e12, "fp16: no bf16 tensor cores"),
    ("T4", 65e12, "fp16: no bf16 tensor cores"),
    ("P100", 18.7e12, "fp16: no tensor cores"),
)


def peak_flops(device_kind: str) -> tuple[float, str] | None:
    """(dense FLOP/s of one device, what the figure is) from the vendor's data sheet, or None
    (a CPU, or a device missing from PEAK_FLOPS)."""
    return next(((flops, what) for key, flops, what in PEAK_FLOPS if key in device_kind), None)


def _subjaxprs(value):
    """The jaxprs inside one equation parameter (a jaxpr, a closed one, or a tuple of them)."""
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _subjaxprs(v)]
    return []


def jaxpr_flops(jaxpr) -> float:
    """Matmul FLOPs of one run of a jaxpr, nested calls, loops and branches included."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        if name == "dot_general":
            (contract, _), _ = params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape  # kernel [out features, in features / groups, *window]
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs[1:])
        elif name == "scan":
            total += params["length"] * jaxpr_flops(params["jaxpr"].jaxpr)
        elif name == "cond":  # the costliest branch
            total += max(jaxpr_flops(j) for j in _subjaxprs(params["branches"]))
        elif name == "while":
            if any(jaxpr_flops(j) for j in _subjaxprs(params["body_jaxpr"])):
                raise ValueError("matmuls in a while loop whose trip count is unknown at trace time: "
                                 "use lax.scan, or fori_loop with Python-int bounds")
        elif name == "shard_map":  # its body is one device's work: times the devices that run it
            mesh = params["mesh"]
            devices = math.prod(mesh.shape[a] for a in params["newly_manual_axes"])
            total += devices * jaxpr_flops(params["jaxpr"])
        else:  # jit, remat, custom_jvp/vjp calls: their jaxprs run once
            total += sum(jaxpr_flops(j) for v in params.values() for j in _subjaxprs(v))
    return total


def matmul_flops(fn, *args, **kwargs) -> float:
    """FLOPs of the matrix products in one call of fn(*args, **kwargs), all devices together,
    counted from the program JAX traces; args may be arrays or jax.ShapeDtypeStruct.
    Recomputation that remat asks for is counted, since it is in the traced program."""
    return jaxpr_flops(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)

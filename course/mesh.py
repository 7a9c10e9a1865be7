"""The series' 2-D meshes on 1, 2, 4 or 8 (any power of two) devices."""


def mesh_shape_for(n_devices: int, inner: int = 2) -> tuple[int, int]:
    """(outer, inner) sizes of a 2-D mesh: the inner axis (model, stage or expert) gets up to
    `inner` devices, the outer one (data) the rest. 8 devices, inner=2: (4, 2); 2: (1, 2)."""
    if n_devices < 1 or n_devices & (n_devices - 1):
        raise ValueError(
            f"This course needs 1, 2, 4, 8, ... (a power of two) devices; found {n_devices}. "
            "On a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts; "
            "on a GPU machine, pick devices with CUDA_VISIBLE_DEVICES.")
    inner = min(inner, n_devices)
    return n_devices // inner, inner

"""Read a compiled program: its collectives (what, over which mesh axes, how many bytes, how
often per step) and its memory per device. The same reader serves XLA:CPU, TPU and GPU HLO.

A collective inside a while loop (a `scan` over layers) runs once per iteration: it counts that
many times, from the loop's known trip count. XLA's own cost analysis does not do this.
"""

import itertools
import math
import re
from collections import Counter
from typing import NamedTuple

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
         "collective-permute")
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(KINDS) + r")(-start)?\(")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(")
_CALLS = re.compile(r"\b(body|condition|calls|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


class Collective(NamedTuple):
    kind: str  # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute, ...
    axes: str  # the mesh axes its device groups span: 'data', 'model', 'data+model'; 'none'
    #            for groups of one device (no traffic); 'other' where no mesh axes explain them
    tensors: int  # operands (XLA merges several tensors into one tuple op)
    result_bytes: int  # of its result, per device
    sent_bytes: float  # what each device sends, ring algorithm
    runs: int  # times per call of the program (loop iterations)
    backward: bool  # from the backward pass (JAX names it transpose(...))
    op_name: str  # JAX's name for where it came from (jit(f)/.../attention/...)
    line: str


def memory_bytes(compiled) -> int:
    """Bytes one device holds at the peak of a compiled program: arguments, outputs and
    temporaries, less the outputs that reuse (alias) an argument's buffer."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


def stored_bytes(*arrays) -> int:
    """Bytes one device takes to store `arrays` (jax.Arrays, or ShapeDtypeStructs with shardings,
    in any pytrees) as this backend lays them out: the arguments of a program compiled to receive
    them and nothing else. XLA:CPU and GPU store exactly each shard's bytes; a TPU pads every
    buffer to whole tiles (8 x 128 values of a float32 matrix, 1,024 of a vector), which a small
    or narrow array does not fill. A compiled step's arguments are these bytes on every backend."""
    import jax

    receive = jax.jit(lambda *a: None, keep_unused=True)  # keep_unused: jit drops unused arguments
    return receive.lower(*arrays).compile().memory_analysis().argument_size_in_bytes


_PLAN_NOTE = []


def plan_mesh(mesh):
    """The mesh whose compiled memory plan a notebook reads for its small model: `mesh` itself,
    except on a TPU, where the same shape over the host's CPU devices stands in (said once). A
    TPU's compiler keeps the buffers of a program this small in the chip's on-chip memory (VMEM,
    memory space S(1) in its HLO), and memory_analysis() counts only HBM, so there a toy
    model's temporaries read near zero and do not grow with layers or micro-batches. At scale,
    where HBM is what runs out, the notebooks compile for the TPU itself."""
    import jax

    if mesh.devices.flat[0].platform != "tpu":
        return mesh
    cpu = jax.devices("cpu")
    if len(cpu) < mesh.size:
        raise RuntimeError(f"the memory plan needs {mesh.size} CPU devices and JAX has {len(cpu)}: set "
                           f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before JAX starts")
    if not _PLAN_NOTE:
        print("note: on a TPU, the small model's memory plan is compiled for this host's CPU: the TPU "
              "keeps buffers this small in on-chip memory (VMEM), which memory_analysis() does not count")
        _PLAN_NOTE.append(True)
    return jax.sharding.Mesh(np.array(cpu[: mesh.size]).reshape(mesh.devices.shape), mesh.axis_names,
                             axis_types=mesh.axis_types)


def ring_bytes(kind: str, result_bytes: int, n: int) -> float:
    """Bytes each of n devices sends for one collective, ring algorithm (collective-permute
    sends its result once)."""
    return {"all-reduce": 2 * (n - 1) / n * result_bytes,  # a reduce-scatter, then an all-gather
            "all-gather": (n - 1) / n * result_bytes,  # the result is the gathered tensor
            "reduce-scatter": (n - 1) * result_bytes,  # the result is one n-th of the input
            "all-to-all": (n - 1) / n * result_bytes}.get(kind, result_bytes)


def array_bytes(types: str) -> int:
    """Bytes of the arrays in an HLO type: 'bf16[8,64]{1,0}' -> 1024; tuples add up."""
    total = 0
    for dtype, dims in re.findall(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\]", types):
        bits = 8 if dtype == "pred" else int(re.match(r"[a-z]+(\d+)", dtype)[1])
        total += math.prod(int(d) for d in dims.split(",") if d) * max(bits, 8) // 8
    return total


def _iota(dims: str, perm: str | None) -> np.ndarray:
    ids = np.arange(math.prod(shape := [int(d) for d in dims.split(",")])).reshape(shape)
    return ids.transpose([int(p) for p in perm.split(",")]) if perm else ids


def device_groups(line: str, n: int) -> list[list[int]] | None:
    """The device groups (positions in the program's device list) of one collective, in any of
    HLO's spellings: {{0,1},{2,3}}, [2,4]<=[8] (an iota, maybe transposed), mesh['a'=4,'b'=2]
    {'b'}, {} (all n devices), or a collective-permute's source_target_pairs."""
    if m := re.search(r"source_target_pairs=\{(.*?)\}\}", line + "}"):
        pairs = [tuple(map(int, p.split(","))) for p in re.findall(r"\{(\d+,\d+)\}", m[1] + "}")]
        group_of = {i: {i} for pair in pairs for i in pair}  # devices that exchange: one group
        for a, b in pairs:
            merged = group_of[a] | group_of[b]
            for i in merged:
                group_of[i] = merged
        return [sorted(g) for g in {frozenset(g) for g in group_of.values()}]
    if re.search(r"replica_groups=\{\}", line) or "replica_groups=" not in line:
        return [list(range(n))]
    if m := re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line):
        return [[int(i) for i in g.split(",") if i] for g in re.findall(r"\{([\d,]*)\}", m[1])]
    if m := re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line):
        return _iota(m[2], m[3]).reshape([int(d) for d in m[1].split(",")]).tolist()
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?"
                      r"\s*\{([^}]*)\}", line):
        names, sizes = zip(*[(a, int(s)) for a, s in re.findall(r"'(\w+)'=(\d+)", m[1])], strict=True)
        ids = _iota(m[2], m[3]).ravel() if m[2] else np.arange(math.prod(sizes))
        spanned = [names.index(a) for a in re.findall(r"'(\w+)'", m[4])]
        kept = [i for i in range(len(names)) if i not in spanned]
        ids = ids.reshape(sizes).transpose(kept + spanned)
        return ids.reshape(-1, math.prod(sizes[i] for i in spanned)).tolist()
    return None


def mesh_axes(groups: list[list[int]] | None, mesh) -> str:
    """The mesh axes whose device groups these are ('model', 'data+model'), 'none' for groups
    of one device, or 'other'. Device i is mesh.devices.flat[i], as in a program jit compiled."""
    if groups is None:
        return "other"
    if all(len(g) == 1 for g in groups):
        return "none"
    seen = {frozenset(g) for g in groups}
    ids = np.arange(mesh.size).reshape(mesh.devices.shape)
    big = [a for a in mesh.axis_names if mesh.shape[a] > 1]
    for r in range(1, len(big) + 1):
        for axes in itertools.combinations(big, r):
            moved = np.moveaxis(ids, [mesh.axis_names.index(a) for a in axes], range(-r, 0))
            if seen == {frozenset(g) for g in moved.reshape(-1, math.prod(mesh.shape[a] for a in axes)).tolist()}:
                return "+".join(axes)
    return "other"


def _bodies(text: str) -> dict[str, list[str]]:
    """{computation name ('ENTRY' for the entry): its instruction lines}."""
    bodies, current = {}, None
    for line in text.splitlines():
        if header := _HEADER.match(line):
            current = "ENTRY" if header[1] else header[2]
            bodies[current] = []
        elif current:
            bodies[current].append(line)
    return bodies


def _trips(line: str, bodies: dict[str, list[str]]) -> int | None:
    """A while loop's trip count: XLA's known_trip_count where it wrote one (XLA:CPU, GPU), else
    the one integer constant its condition compares the counter with (a JAX scan counts from 0:
    TPU HLO)."""
    if t := _TRIPS.search(line):
        return int(t[1])
    condition = re.search(r"condition=%?([\w.\-]+)", line)
    constants = [c for cond_line in bodies.get(condition[1] if condition else "", [])
                 for c in re.findall(r"= s32\[\]\S* constant\((\d+)\)", cond_line)]
    return int(constants[0]) if len(constants) == 1 else None


def runs_per_call(text: str, loop_trips: int | None = None) -> dict[str, int | None]:
    """How often each computation of an HLO module runs per call: a while loop's body as often
    as its trip count (else `loop_trips`; None where neither says), whatever a computation
    calls as often as the computation."""
    bodies = _bodies(text)
    calls = {name: [(callee, (_trips(line, bodies) or loop_trips) if how == "body" else 1)
                    for line in lines for how, names in _CALLS.findall(line)
                    for callee in re.findall(r"[\w.\-]+", names)]
             for name, lines in bodies.items()}
    runs: dict[str, int | None] = {}

    def visit(name: str, times: int | None) -> None:
        runs[name] = None if times is None or runs.get(name, 0) is None else runs.get(name, 0) + times
        for callee, k in calls.get(name, []):
            visit(callee, None if times is None or k is None else times * k)

    visit("ENTRY", 1)
    return runs


def _operands(line: str, start: int) -> str:
    """The text between the parenthesis opened just before `start` and its match."""
    depth = 1
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return line[start:i]
    return line[start:]


def collectives(compiled, mesh=None, strict: bool | None = None,
                loop_trips: int | None = None) -> list[Collective]:
    """The collectives of a compiled program (or its HLO text), one per instruction. `mesh`
    names their axes; strict (default: on XLA:CPU) raises for groups no mesh axes explain.
    `loop_trips` counts a while loop whose trip count XLA did not record."""
    text = compiled if isinstance(compiled, str) else compiled.as_text()
    if strict is None:
        strict = mesh is not None and mesh.devices.flat[0].platform == "cpu"
    n = mesh.size if mesh is not None else None
    runs, current, found = runs_per_call(text, loop_trips), "ENTRY", []
    for line in text.splitlines():
        if header := _HEADER.match(line):
            current = "ENTRY" if header[1] else header[2]
        if not (m := _OP.search(line)) or "-done(" in line:
            continue
        types, kind, start, operands = m[1], m[2], m[3], _operands(line, m.end())
        if runs.get(current) is None:
            raise ValueError(f"a {kind} in a loop whose trip count XLA did not record: pass loop_trips=")
        groups = device_groups(line, n or 1)
        axes = mesh_axes(groups, mesh) if mesh is not None else "?"
        if strict and axes == "other":
            raise ValueError(f"a {kind} over device groups that no mesh axes explain: {line.strip()[:300]}")
        tensors = max(len(re.findall(r"%[\w.\-]+", operands)), 1)
        shapes = re.findall(r"\b(?:pred|[a-z]+\d+[a-z0-9]*)\[[\d,]*\]", types)
        if start and len(shapes) >= 2 * tensors:  # an async start returns (operands, results, ...)
            shapes = shapes[tensors:2 * tensors]
        result = array_bytes(" ".join(shapes))
        size = len(groups[0]) if groups else (n or 1)
        if kind == "all-reduce" and current.startswith("all-reduce-scatter"):  # the TPU's fused
            kind, result = "reduce-scatter", result // size                  # reduce-scatter
        name = re.search(r'op_name="([^"]*)"', line)
        found.append(Collective(kind, axes, tensors, result, ring_bytes(kind, result, size),
                                runs[current], bool(name and "transpose(" in name[1]),
                                name[1] if name else "", line.strip()))
    return found


def tally(ops: list[Collective], *fields: str, weight: str = "ops") -> Counter:
    """Per step: {(field values): ops executed, or the sum of `weight` ('tensors',
    'sent_bytes', 'result_bytes') over them}. tally(ops, 'kind', 'axes') -> {('all-reduce',
    'model'): 4, ...}; one field gives plain keys."""
    counts = Counter()
    for op in ops:
        key = tuple(getattr(op, f) for f in fields)
        counts[key[0] if len(fields) == 1 else key] += op.runs * (1 if weight == "ops" else getattr(op, weight))
    return counts

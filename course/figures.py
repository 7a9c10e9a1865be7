"""Pictures of a sharded matmul, drawn by code, so that every notebook shows the same one.

The notation is the scaling book's: `In[B_X, D]` names an array and its dimensions (B batch,
D model width, F hidden width), and a subscript names the mesh axis that splits a dimension
(X = `data`, Y = `model`); a dimension with no subscript is whole on every device of that axis.
`In[B_X, D] · W[D, F_Y]` multiplies over D.

- draw_parallel_matmul(ax, kind): who holds what on each `model` device, one row per device,
  and the collective that follows, in red. kind "column" (W split by columns: each device keeps
  a block of Out, and an all-gather only if Out is wanted whole), "row" (W split by rows: each
  device holds a partial sum of all of Out, and an all-reduce adds them) or "mlp" (the two in a
  row, as in a Megatron MLP: one all-reduce at the end). backward=True writes under it what the
  backward pass sends (notebook 02's f and g).
- parallel_matmul_collectives(kind): the collectives drawn, per pass, for checks to compare
  with a compiled program's.
- parallel_matmuls_figure(kinds): one figure with a panel per kind.
"""

import matplotlib.pyplot as plt
from matplotlib import patches

KINDS = ("column", "row", "mlp")
COLLECTIVE = "#c0392b"  # red: what crosses devices
NOTHING_SENT = "#1e8449"  # green: "no communication"
WHOLE = "#d5d8dc"  # grey: the whole array, the same on every device
SIZES = {"B": 1.0, "D": 1.0, "F": 1.5}  # drawn sizes of the dimensions


def parallel_matmul_collectives(kind: str, gather: bool = True) -> dict[str, list[str]]:
    """The collectives a matmul split over the model axis needs, per pass: {'forward': [...],
    'backward': [...]} (the backward pass here: the gradient with respect to In)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {KINDS}")
    forward = {"column": ["all-gather"] if gather else [], "row": ["all-reduce"], "mlp": ["all-reduce"]}
    backward = {"column": ["all-reduce"], "row": [], "mlp": ["all-reduce"]}
    return {"forward": forward[kind], "backward": backward[kind]}


def _color(device: int) -> str:
    return plt.get_cmap("tab10")(device % 10)


def _matrix(ax, x: float, y: float, w: float, h: float, held: tuple, text: str = "") -> None:
    """One device's view of a matrix at (x, y) (its lower left corner): its outline dashed, and
    filled where the device holds it. held: ('whole',) the same on every device; ('cols' or
    'rows', j, n) block j of n; ('partial', j) all of it, a partial sum; ('gathered', n) all
    of it, its column blocks from each device; ('sum', n) all of it, the sum of n partials."""
    ax.add_patch(patches.Rectangle((x, y), w, h, fill=False, ls="--", lw=0.8, ec="0.45"))
    how = held[0]
    if how == "whole":
        ax.add_patch(patches.Rectangle((x, y), w, h, fc=WHOLE, ec="0.3", lw=1))
    elif how in ("cols", "rows"):
        j, n = held[1], held[2]
        box = (x + j * w / n, y, w / n, h) if how == "cols" else (x, y + (n - 1 - j) * h / n, w, h / n)
        ax.add_patch(patches.Rectangle(box[:2], *box[2:], fc=_color(j), ec="0.2", lw=1, alpha=0.85))
    elif how == "partial":
        ax.add_patch(patches.Rectangle((x, y), w, h, fc=_color(held[1]), ec="0.2", lw=1, alpha=0.45,
                                       hatch="///"))
    elif how == "gathered":
        n = held[1]
        for j in range(n):
            ax.add_patch(patches.Rectangle((x + j * w / n, y), w / n, h, fc=_color(j), ec="0.2", lw=1,
                                           alpha=0.85))
    elif how == "sum":
        ax.add_patch(patches.Rectangle((x, y), w, h, fc=WHOLE, ec="0.2", lw=1.5))
    else:
        raise ValueError(f"held={held!r}")
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)


def _terms(kind: str, j: int, n: int, gather: bool) -> tuple[list, list]:
    """(what device j holds, left to right: (label, width, height, held, text) or an operator
    string; what every device holds after the collective)."""
    B, D, F = SIZES["B"], SIZES["D"], SIZES["F"]
    partial = ("partial", j)
    sum_text = " + ".join(f"P{i}" for i in range(n)) if n <= 3 else f"P0 + ... + P{n - 1}"
    if kind == "column":
        terms = [("In[B_X, D]", D, B, ("whole",), ""), "·", ("W[D, F_Y]", F, D, ("cols", j, n), ""), "=",
                 ("Out[B_X, F_Y]", F, B, ("cols", j, n), "")]
        after = [("Out[B_X, F]", F, B, ("gathered", n), "")] if gather else []
    elif kind == "row":
        terms = [("In[B_X, D_Y]", D, B, ("cols", j, n), ""), "·", ("W[D_Y, F]", F, D, ("rows", j, n), ""),
                 "=", ("partial\nOut[B_X, F]", F, B, partial, f"P{j}")]
        after = [("Out[B_X, F]", F, B, ("sum", n), sum_text)]
    else:  # mlp: column-parallel W1, then row-parallel W2 on the split hidden activations
        terms = [("In[B_X, D]", D, B, ("whole",), ""), "·", ("W1[D, F_Y]", F, D, ("cols", j, n), ""), "=",
                 ("H[B_X, F_Y]", F, B, ("cols", j, n), ""), "·", ("W2[F_Y, D]", D, F, ("rows", j, n), ""),
                 "=", ("partial\nOut[B_X, D]", D, B, partial, f"P{j}")]
        after = [("Out[B_X, D]", D, B, ("sum", n), sum_text)]
    return terms, after


TITLES = {
    "column": "Column-parallel: In[B_X, D] · W[D, F_Y] → Out[B_X, F_Y]",
    "row": "Row-parallel: In[B_X, D_Y] · W[D_Y, F] → Out[B_X, F]",
    "mlp": "An MLP, column- then row-parallel: In[B_X, D] · W1[D, F_Y] → H[B_X, F_Y];  H · W2[F_Y, D] → Out[B_X, D]",
}
BACKWARD = {
    "column": "backward: dIn = dOut[B_X, F_Y] · Wᵀ is a partial sum on each device → all-reduce over model",
    "row": "backward: dIn[B_X, D_Y] = dOut[B_X, F] · Wᵀ needs only this device's rows of W → no collective",
    "mlp": "backward: dIn is a partial sum on each device → all-reduce before W1; none after W2",
}


def draw_parallel_matmul(ax, kind: str, devices: int = 2, gather: bool = True, backward: bool = False,
                         title: str | None = None) -> dict[str, list[str]]:
    """Draw a matmul split over `devices` model devices on `ax`: one row per device, blocks in
    that device's colour, then the collective (red) and what each device holds after it. Returns
    parallel_matmul_collectives(kind, gather). gather: for "column", draw the all-gather that
    makes Out whole (False: Out stays split, nothing is sent)."""
    sent = parallel_matmul_collectives(kind, gather)
    gap, op_w, pad = 0.45, 0.45, 0.25
    rows = []
    for j in range(devices):
        terms, after = _terms(kind, j, devices, gather)
        rows.append((terms, after))
    height = max(t[2] for t in rows[0][0] if isinstance(t, tuple))
    for j, (terms, after) in enumerate(rows):
        y_mid = (devices - 1 - j) * (height + gap) + height / 2
        ax.text(-0.15, y_mid, f"model\ndevice {j}", ha="right", va="center", fontsize=9,
                color=_color(j), fontweight="bold")
        x = 0.0
        for term in terms:
            if isinstance(term, str):
                ax.text(x + op_w / 2, y_mid, term, ha="center", va="center", fontsize=22 if term == "·" else 14)
                x += op_w
                continue
            label, w, h, held, text = term
            _matrix(ax, x, y_mid - h / 2, w, h, held, text)
            if j == 0:
                ax.text(x + w / 2, y_mid + height / 2 + 0.12, label, ha="center", va="bottom", fontsize=9)
            x += w
        x_result = x
        if after:
            x_after = x_result + 1.9
            for _, w, h, held, text in after:
                _matrix(ax, x_after, y_mid - h / 2, w, h, held, text)
                if j == 0:
                    ax.text(x_after + w / 2, y_mid + height / 2 + 0.12, f"{after[0][0]}\non every device",
                            ha="center", va="bottom", fontsize=9)
            ax.annotate("", xy=(x_after - 0.1, y_mid), xytext=(x_result + 0.1, y_mid),
                        arrowprops=dict(arrowstyle="-|>", color=COLLECTIVE, lw=2))
    top = (devices - 1) * (height + gap) + height
    if sent["forward"]:
        x_mid = x_result + 0.95
        ax.plot([x_mid, x_mid], [height / 2, top - height / 2], color=COLLECTIVE, lw=2)
        note = "\n(only to make\nOut whole)" if kind == "column" else ""
        ax.text(x_mid, top / 2, f"{sent['forward'][0]}\nover model{note}", ha="center", va="center",
                fontsize=10, color=COLLECTIVE, fontweight="bold",
                bbox=dict(boxstyle="round", fc="white", ec=COLLECTIVE))
        right = x_result + 1.9 + max(t[1] for t in after)
    else:
        ax.text(x_result + 0.2, top / 2, "no communication:\nOut stays split", ha="left", va="center",
                fontsize=10, color=NOTHING_SENT, fontweight="bold")
        right = x_result + 1.9
    ax.text(-1.3, top + 0.75, TITLES[kind] if title is None else title, ha="left", va="bottom",
            fontsize=11, fontweight="bold")
    bottom = -pad
    if backward:
        ax.text(-1.3, -0.35, BACKWARD[kind], ha="left", va="top", fontsize=9, style="italic")
        bottom = -0.8
    ax.set_xlim(-1.35, right + pad)
    ax.set_ylim(bottom, top + 1.15)
    ax.set_aspect("equal")
    ax.axis("off")
    return sent


KEY = ("Colour: the model device that holds a block.   Grey: the whole array, the same on every device.\n"
       "Dashed outline: the part a device does not hold.   Hatched Pj: device j's partial sum.   "
       "Red: sent between devices.")


def parallel_matmuls_figure(kinds=("column", "row"), devices: int = 2, gather: bool = True,
                            backward: bool = False, width: float = 10.0):
    """A figure with one panel per kind, stacked, and the key under them: (figure, [each
    panel's parallel_matmul_collectives])."""
    height = 1.25 * (devices + 1) * len(kinds) + 0.4 * backward * len(kinds) + 0.45
    fig, axes = plt.subplots(len(kinds), 1, figsize=(width, height), squeeze=False)
    sent = [draw_parallel_matmul(ax, kind, devices, gather, backward)
            for ax, kind in zip(axes[:, 0], kinds, strict=True)]
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    fig.text(0.5, 0.05 / height, KEY, ha="center", va="bottom", fontsize=8.5)
    return fig, sent

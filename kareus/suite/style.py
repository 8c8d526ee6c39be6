"""How every figure draws a method: one colour, marker and name per optimizer, and the fonts and
sizes of figures meant for a paper's column (3.4 in) or page (7 in) width.

Built-in methods have fixed styles (Okabe-Ito colours, distinguishable in colour-blind vision and
by marker in greyscale); a third-party optimizer gets one from :data:`EXTRA_COLORS` and
:data:`EXTRA_MARKERS` chosen by a hash of its name, so it looks the same in every figure and
every run.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodStyle:
    """How one method is drawn.

    Attributes:
        label: Name shown in legends (e.g. ``Megatron-LM``).
        color: Matplotlib colour.
        marker: Matplotlib marker of its points.
        size: Area (pt^2) of its max-throughput marker; methods whose points often coincide
            (Megatron-LM, Zeus's power limit, a uniform clock, all at the top clock) get
            different sizes, and smaller markers are drawn on top, so each stays visible.
    """

    label: str
    color: str
    marker: str
    size: float


STYLES: dict[str, MethodStyle] = {
    "megatron": MethodStyle("Megatron-LM", "#000000", "s", 95.0),
    "perseus": MethodStyle("Perseus", "#0072B2", "o", 75.0),
    "nanobatch": MethodStyle("Nanobatching", "#E69F00", "^", 80.0),
    "nanobatch-perseus": MethodStyle("Nanobatching + Perseus", "#009E73", "v", 70.0),
    "envpipe": MethodStyle("EnvPipe", "#CC79A7", "D", 45.0),
    "zeus-power-limit": MethodStyle("Zeus power limit", "#56B4E9", "P", 55.0),
    "kareus": MethodStyle("Kareus", "#D55E00", "*", 130.0),
}

#: Colours and markers for third-party optimizers (none used by a built-in).
EXTRA_COLORS = ("#7F3C8D", "#8C564B", "#999933", "#882255", "#332288", "#888888")
EXTRA_MARKERS = ("X", "h", "<", ">", "p", "8")

#: Font sizes (pt) of figures printed at their own size (no scaling in the paper).
FONT_RC = {"font.size": 7.5, "axes.titlesize": 7.5, "axes.labelsize": 7.5,
           "xtick.labelsize": 6.5, "ytick.labelsize": 6.5, "legend.fontsize": 6.5,
           "figure.titlesize": 8.0, "hatch.linewidth": 0.6, "axes.linewidth": 0.6,
           "grid.linewidth": 0.5, "lines.linewidth": 1.1}

#: Widths (in) of a paper's column and page.
COLUMN_IN = 3.4
PAGE_IN = 7.0

#: Resolution of saved figures (dots per inch).
DPI = 250


def method_style(name: str) -> MethodStyle:
    """The style of optimizer ``name`` (a built-in's, or a stable one for a plugin)."""
    if name in STYLES:
        return STYLES[name]
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return MethodStyle(name, EXTRA_COLORS[h % len(EXTRA_COLORS)],
                       EXTRA_MARKERS[(h // len(EXTRA_COLORS)) % len(EXTRA_MARKERS)], 40.0)


@contextmanager
def figure_style() -> Iterator[None]:
    """Seaborn's white grid and :data:`FONT_RC` for the figures made inside (nothing leaks)."""
    import matplotlib as mpl
    import seaborn as sns

    with sns.axes_style("whitegrid"), mpl.rc_context(FONT_RC):
        yield

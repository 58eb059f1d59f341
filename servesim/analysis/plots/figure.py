"""The matplotlib plumbing every figure shares: the figure class (imported on use, drawn on the
Agg canvas, displayed by notebooks), titles and captions, CDF thinning and axis helpers.

matplotlib is imported only when a figure is drawn (``pip install 'servesim[plot]'``). Figures
are plain :class:`~matplotlib.figure.Figure` objects rendered with the Agg canvas: pyplot's global
state and backend are left alone, so they work in scripts, servers and notebooks alike.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from servesim.analysis.plots.data import ResultsData
from servesim.simcore.errors import ScenarioError

INSTALL_HINT = "pip install 'servesim[plot]'"
CDF_MAX_POINTS = 4000  # points per CDF line (more are thinned evenly in rank)
DPI = 110


_FIGURE_CLASSES: dict[type, type] = {}


def _matplotlib() -> tuple[Any, Any]:
    """(figure class, FigureCanvasAgg), imported on use; a clear error if matplotlib is missing.

    The figure class is matplotlib's Figure with a ``_repr_png_``, so a figure returned in a
    notebook cell shows itself even when pyplot (and its inline backend) was never imported.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ScenarioError(
            "plot",
            "matplotlib",
            f"matplotlib is not installed; install the plotting extra: {INSTALL_HINT}",
        ) from None
    if Figure not in _FIGURE_CLASSES:

        class RunFigure(Figure):
            """A servesim figure: a matplotlib Figure on the Agg canvas that notebooks display."""

            def _repr_png_(self) -> bytes:
                buf = io.BytesIO()
                self.savefig(buf, format="png", dpi=DPI)
                return buf.getvalue()

        RunFigure.__qualname__ = "RunFigure"  # found by pickle via __getattr__ below
        _FIGURE_CLASSES[Figure] = RunFigure
    return _FIGURE_CLASSES[Figure], FigureCanvasAgg


def __getattr__(name: str) -> Any:
    """``RunFigure``: the figure class, created when matplotlib is first needed."""
    if name == "RunFigure":
        return _matplotlib()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _figure(
    nrows: int, ncols: int, size: tuple[float, float], ax: Any = None, **kw: Any
) -> tuple[Any, Any]:
    """A new figure with ``nrows`` x ``ncols`` panels, or the caller's axes (``ax``: one Axes,
    or as many as the figure has panels, in row order) in the figure they belong to. Sharing
    options (``sharex``...) apply to new figures only."""
    if ax is not None:
        axes = np.atleast_1d(np.asarray(ax, dtype=object)).ravel()
        if len(axes) != nrows * ncols or not all(hasattr(a, "plot") for a in axes):
            raise ScenarioError(
                "ax",
                f"{len(axes)} object(s)",
                f"this figure draws {nrows * ncols} panel(s): give that many matplotlib Axes",
            )
        return axes[0].figure, axes.reshape(nrows, ncols)
    figure_class, canvas_class = _matplotlib()
    fig = figure_class(figsize=size, dpi=DPI, layout="constrained")
    canvas_class(fig)
    fig.servesim_own = True
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _finish(fig: Any, title: str, data: ResultsData, caption: str, note: str = "") -> Any:
    """Title the figure, print ``note`` under it, remember the caption for reports."""
    if not getattr(fig, "servesim_own", False):  # the caller's figure: its title is theirs
        fig.servesim_caption = caption + (f" Note: {note}" if note else "")
        return fig
    fig.suptitle(f"{title} — {data.name}", fontsize=13, fontweight="bold")
    if note:
        fig.get_layout_engine().set(rect=(0, 0.045, 1, 0.955))
        fig.text(0.01, 0.008, note, fontsize=8, color="0.3", ha="left", va="bottom", wrap=True)
    fig.servesim_caption = caption + (f" Note: {note}" if note else "")
    return fig


def figure_caption(fig: Any) -> str:
    """The caption a figure function attached (what it shows and how it was derived)."""
    return str(getattr(fig, "servesim_caption", ""))


def _class_colors(classes: list[str]) -> dict[str, str]:
    return {c: f"C{i % 10}" for i, c in enumerate(classes)}


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def _cdf(values: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of an empirical distribution, thinned to CDF_MAX_POINTS points."""
    order = np.argsort(values, kind="stable")
    x = values[order]
    w = np.ones(len(x)) if weights is None else weights[order].astype(np.float64)
    y = np.cumsum(w) / w.sum()
    if len(x) > CDF_MAX_POINTS:
        keep = np.unique(np.linspace(0, len(x) - 1, CDF_MAX_POINTS).astype(np.int64))
        x, y = x[keep], y[keep]
    return x, y


def _wide(values: np.ndarray) -> bool:
    """Whether values spread over more than 1.5 decades (then a log axis reads better)."""
    positive = values[np.isfinite(values) & (values > 0)]
    return len(positive) > 1 and float(positive.max()) / float(positive.min()) > 30.0


def _quantile_marks(ax: Any) -> None:
    for q, label in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        ax.axhline(q, color="0.75", lw=0.7, ls=":", zorder=0)
        ax.text(1.0, q, f" {label}", transform=ax.get_yaxis_transform(), fontsize=7, va="center")

"""report.py — a results CSV as the paper's tables (2, 3, 6) and figures (2/8, 3, 4), and runs'
logs as curves over training; sweep.py reads the run folders and writes the files.

Learning-rate sensitivity (Eq. 22) of one size, tying and head over the n_η learning rates η,
L(η) the final test loss (our validation split), L₀ the loss at initialisation (≈ ln V):

    LRS = Σ_η [min(L(η), L₀) − min_η L(η)] / (n_η − 1),   a diverged run counting as L₀

Eq. 22 divides by n_η (mean="literal"); n_η − 1 gives back every printed digit of the paper's
Table 2(ii) for the four heads the published runs' CSV holds (not soft-capping) and of Table 3
(tests/test_sweep.py::test_reference_reproduces_table2 and ::test_reference_reproduces_table3).
"""
import csv
import io
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from matplotlib import colormaps, ticker
from matplotlib.figure import Figure  # no pyplot: files only, no display, nothing to close

PAPER_SIZES = ("16M", "29M", "57M", "109M", "221M")
HEADS = ("baseline", "soft_cap", "z_loss", "mu_loss", "mu_center")
LAMBDA_HEADS = ("z_loss", "mu_loss")  # the heads with a regularisation weight λ
DEFAULT_LAM, DEFAULT_CAP = 1e-4, 30.0  # the paper's λ (outside Sec. 5) and soft-cap c
# L₀ where a CSV has no init_loss (the published runs), as their README gives it (≈ ln 50304)
L0_BY_SIZE = {**dict.fromkeys(PAPER_SIZES, 10.83), "221M": 10.85}
SIZE_ORDER = ("tiny", "small") + PAPER_SIZES
# A run's numbers: (rule in words, test), NaN failing lr, lam, cap and seed (the losses and
# train_time_s may be NaN); sweep.py's grid too
RULES = {"lr": ("a finite number > 0", lambda v: math.isfinite(v) and v > 0),
         "lam": ("a finite number ≥ 0", lambda v: math.isfinite(v) and v >= 0),
         "cap": ("a finite number > 0", lambda v: math.isfinite(v) and v > 0),
         "test_loss": ("≥ 0 (a cross-entropy; NaN or empty if diverged)", lambda v: not v < 0),
         "init_loss": ("≥ 0 (a cross-entropy)", lambda v: not v < 0),
         "train_time_s": ("≥ 0", lambda v: not v < 0),
         "seed": ("an integer >= 0", lambda v: v == "" or str(v).isdigit())}
TABLE_COLUMNS = ("size", "lr", "head", "lam", "tie", "test_loss", "train_time_s")
# (column, in words): Fig. 3's in the paper's order, then the matmul's rounding, where logged
METRICS = (("logit_mean", "mean logit l̄"), ("logit_std", "logit spread σ_l"),
           ("mu_norm", "‖μ‖, the output rows' mean"), ("logit_absmax", "largest |logit|"))
PRECISION_METRICS = (("prec_err_cast", "logit error from rounding the inputs"),
                     ("prec_err_round", "logit error from rounding the result"),
                     ("prec_ce_gap", "cross-entropy lost to the matmul's rounding"))
UNITS = {"loss": "nats", "val_loss": "nats", "mu_norm": "‖μ‖", "logit_mean": "l̄",
         "logit_std": "σ_l", "logit_absmax": "max |l|", "h_mu_proj": "h̄·μ̂",
         "prec_err_cast": "÷ σ_l", "prec_err_round": "÷ σ_l", "prec_ce_gap": "nats"}
HEAD_WORDS = ("Heads: baseline = the plain head; soft_cap = logits c·tanh(l/c); z_loss = + "
              "λ·(log Z)²; mu_loss = + λ‖μ‖²; mu_center = μ subtracted from every output row.")
HEAD_COLORS = {"baseline": "tab:gray", "soft_cap": "tab:orange", "z_loss": "tab:red",
               "mu_loss": "tab:blue", "mu_center": "tab:green"}
SOLID = dict(ls="-", marker="o", ms=4)  # our runs
DASHED = dict(ls="--", marker="x", ms=4, alpha=0.6)  # the paper's, with a reference CSV


# ---- LRS: the runs of one size, tying and variant reduced over the learning rates ----------
def capped_loss(row):  # min(L(η), L₀), a diverged or non-finite run counting as L₀
    loss = row["test_loss"]
    return row["l0"] if row["diverged"] or not math.isfinite(loss) else min(loss, row["l0"])


def lr_sensitivity(losses, mean="published"):  # of capped losses, as above; one η: NaN (literal: 0)
    divisor = len(losses) - 1 if mean == "published" else len(losses)
    return sum(loss - min(losses) for loss in losses) / divisor if divisor else math.nan


@dataclass
class Cell:  # one size × variant of a table: its runs reduced over the learning rates
    tie: bool
    head: str
    lam: float | None
    cap: float | None
    size: str
    lrs: list
    losses: list  # min(L(η), L₀) in the order of lrs
    rows: list
    optimal_loss: float
    best_lr: float
    lrs_value: float
    train_time_s: float  # mean over the runs that did not diverge

    @property
    def variant(self):
        return (self.head, self.lam, self.cap)


def _times(rows):  # of the runs that did not diverge
    return [r["train_time_s"] for r in rows
            if not r["diverged"] and math.isfinite(r["train_time_s"])]


def reduce_runs(rows, mean="published"):  # rows grouped by (tie, head, λ, c, size): Cells
    groups = {}
    for row in rows:
        group = groups.setdefault(tuple(row[k] for k in ("tie", "head", "lam", "cap", "size")), {})
        if row["lr"] in group:
            raise ValueError(f"two results for {row['size']} {row['head']} lr={row['lr']:g} tie="
                             f"{row['tie']} λ={row['lam']} c={row['cap']}; keep one run per point")
        group[row["lr"]] = row
    cells = []
    for key, by_lr in groups.items():
        lrs = sorted(by_lr)
        runs = [by_lr[lr] for lr in lrs]
        losses, times = [capped_loss(row) for row in runs], _times(runs)
        cells.append(Cell(*key, lrs, losses, runs, min(losses), lrs[losses.index(min(losses))],
                          lr_sensitivity(losses, mean),
                          sum(times) / len(times) if times else math.nan))
    return sorted(cells, key=lambda c: (c.tie, variant_order(c.variant), size_order(c.size)))


def size_order(label):  # sizes by N, then a size's dtype/seed columns (label_settings) by name
    size, _, rest = label.partition(" ")
    return (SIZE_ORDER.index(size), rest) if size in SIZE_ORDER else (len(SIZE_ORDER), label)


def variant_order(variant):
    head, lam, cap = variant
    return (HEADS.index(head) if head in HEADS else len(HEADS), head, lam or 0.0, cap or 0.0)


def baseline_of(cell, cells):  # of the same size and tying, or None
    return next((c for c in cells if c.head == "baseline" and c.size == cell.size
                 and c.tie == cell.tie), None)


def extra_time(cell, cells):  # mean train time / the baseline's − 1
    if (base := baseline_of(cell, cells)) and base.train_time_s > 0:
        return cell.train_time_s / base.train_time_s - 1.0
    return math.nan


def swept_lambda_cells(cells, tie):  # {head run with several λ: its cells}: Table 3 and Fig. 4
    by_head = {head: [c for c in cells if c.tie == tie and c.head == head] for head in LAMBDA_HEADS}
    return {head: mine for head, mine in by_head.items() if len({c.lam for c in mine}) > 1}


def main_cells(cells, tie):  # Table 2 (untied) / 6 (tied): a head swept over λ at λ = 1e-4 only
    swept = swept_lambda_cells(cells, tie)
    return [c for c in cells if c.tie == tie and (c.head not in swept or c.lam == DEFAULT_LAM)]


def variant_label(variant, show_lam=False):
    head, lam, cap = variant
    if lam is not None and (show_lam or lam != DEFAULT_LAM):
        return f"{head} λ={lam:g}"
    return f"{head} c={cap:g}" if cap is not None and cap != DEFAULT_CAP else head


# ---- Reading a results CSV (sweep.py collect writes ours from the run folders) -------------
def regular_file(path, hint):  # path if a regular file (a pipe would block); hint ends the error
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; {hint}")
    if not path.is_file():
        raise ValueError(f"{path} is not a regular file (a device or a pipe); {hint}")
    return path


def read_results(path, l0=None, columns=TABLE_COLUMNS):
    """The rows of a results CSV (ours or the published one) with types and each run's L₀."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the results CSV in it ({path / 'results.csv'}"
                         f", made by `python sweep.py collect {path}`)")
    with open(regular_file(path, "make it with `python sweep.py collect DIR`"), newline="") as f:
        reader = csv.DictReader(f)
        if missing := [c for c in columns if c not in (reader.fieldnames or [])]:
            raise ValueError(f"{path} has no column {', '.join(missing)}; this needs "
                             f"{', '.join(columns)} (as `sweep.py collect` writes them)")
        rows = []
        for line, raw in enumerate(reader, start=2):
            try:
                rows.append(_typed_row(raw, l0))
            except ValueError as error:
                raise ValueError(f"{path} line {line}: {error}") from None
    if not rows:
        raise ValueError(f"{path} holds no results; run the sweep and collect it first")
    return label_settings(rows)


def _number(text, empty=math.nan):  # a CSV cell as a float; an empty or missing one: empty
    if text in ("", None):
        return empty
    try:
        return float(text)
    except ValueError:  # not Python's "could not convert string to float"
        raise ValueError(f"expected a number, got {text!r}") from None


def boolean(text):
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value in ("true", "1")


def _typed_row(raw, l0):
    """One CSV row typed and checked, with λ and c where its head uses them, and its L₀."""
    numbers = ("lr", "test_loss", "train_time_s", "init_loss",
               *(metric for metric, _ in METRICS + PRECISION_METRICS))
    row = dict(raw, tie=boolean(raw["tie"]), diverged=boolean(raw.get("diverged") or "false"),
               **{name: _number(raw.get(name)) for name in numbers})
    row["lam"] = _number(row.get("lam"), DEFAULT_LAM) if row["head"] in LAMBDA_HEADS else None
    row["cap"] = _number(row.get("cap"), DEFAULT_CAP) if row["head"] == "soft_cap" else None
    for name, (rule, valid) in RULES.items():
        if row.get(name) is not None and not valid(row[name]):
            raise ValueError(f"{name} is {raw.get(name) or 'empty'}, but it must be {rule}")
    own = row["init_loss"] if math.isfinite(row["init_loss"]) else L0_BY_SIZE.get(row["size"])
    if l0 is None and own is None:
        raise ValueError(f"no loss at initialisation for size {row['size']!r} (no init_loss "
                         f"value); pass --l0")
    row["l0"] = own if l0 is None else l0
    return row


def label_settings(rows):
    """Size labels name the matmul dtype where runs differ in it ("tiny bfloat16"), and every
    seed but the first ("tiny bfloat16 seed1"): each is a column of the tables and figures."""
    dtypes = {row.get("dtype") or "" for row in rows}
    seeds = sorted({int(row["seed"]) for row in rows if row.get("seed") not in (None, "")})
    for row in rows:
        row["size"] += f" {row.get('dtype') or 'default'}" if len(dtypes) > 1 else ""
        if row.get("seed") not in (None, "") and int(row["seed"]) != seeds[0]:
            row["size"] += f" seed{row['seed']}"
    return rows


# ---- Tables: Markdown (the paper's layout, the rows in words) + CSV (a row per cell) -------
LOSS, LRS = "(i) Optimal loss min_η L (↓)", "(ii) Learning rate sensitivity LRS (↓)"
TIME = "(iii) Additional training time (↓)"
TIME_SPREAD = 1.1  # the most max/min of one cell's run times that still measures the head
NOT_COMPARABLE = ("n/c: not comparable, the runs of this variant or of its baseline took times "
                  f"more than {TIME_SPREAD:g}× apart for the same work at other η, so the "
                  "machine's load, not the head, set them (a shared CPU does that).")
RESOLUTION = ("(iv) min(L, L₀) − the variant's best loss (a diverged run counts as L₀, as in "
              "LRS), and in brackets the bf16 spacing at the typical logit √(l̄² + σ_l²) over "
              "the logits' spread σ_l, per learning rate")
ALIGNMENT = ("(v) How the mean hidden state lines up with μ: h̄·μ̂ = l̄/‖μ‖ (Lemma 1, averaged "
             "over tokens), per learning rate; with centering ‖μ‖ ≈ 0 and the ratio means nothing")
TABLE_CSV_COLUMNS = ("tie", "size", "head", "lam", "cap", "n_lrs", "best_lr", "optimal_loss",
                     "lrs", "lrs_mean", "train_time_s", "extra_time")


def _markdown_grid(cells, header, rows):  # a Markdown table, rows of a size column then header
    first = "model size N" + (" (matmul dtype, seed)" if any(" " in c.size for c in cells) else "")
    lines = [f"| {first} | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _markdown_table(cells, value, fmt, show_lam=False, best=min):
    """Rows = sizes, columns = variants; the best value of each row in bold (best=None: none)."""
    variants = sorted({c.variant for c in cells}, key=variant_order)
    at = {(c.size, c.variant): value(c) for c in cells}
    rows = []
    for size in sorted({c.size for c in cells}, key=size_order):
        values = [at.get((size, v), math.nan) for v in variants]
        finite = [x for x in values if not isinstance(x, str) and math.isfinite(x)]
        top = fmt(best(finite)) if best and finite else None
        texts = [x if isinstance(x, str) else fmt(x) if math.isfinite(x) else "–" for x in values]
        rows.append([size, *(f"**{t}**" if t == top else t for t in texts)])  # ties as shown too
    return _markdown_grid(cells, [variant_label(v, show_lam) for v in variants], rows)


def time_text(cell, cells):  # (iii)'s entry: extra time in %, "n/c" where a figure means nothing
    for c in (cell, baseline_of(cell, cells)):
        times = _times(c.rows) if c else []
        if times and max(times) > TIME_SPREAD * min(times):
            return "n/c"
    return 100 * extra_time(cell, cells)


def bf16_resolution(row):
    """The bf16 spacing at the typical logit x = √(l̄² + σ_l²), 2^(⌊log₂ x⌋ − 7) (float64's ulp
    × 2⁴⁵), over σ_l: the softmax sees rounding of about this / √12 of the logits' spread; near 1
    and above, bf16 no longer resolves the prediction (the paper's baseline at large η)."""
    return math.ulp(math.hypot(row["logit_mean"], row["logit_std"])) * 2 ** 45 / row["logit_std"]


def per_lr_table(cells, text):
    """Rows = size and variant, columns = η, an entry text(cell, capped loss, row), "–": no run."""
    lrs, rows = sorted({lr for c in cells for lr in c.lrs}), []
    for c in sorted(cells, key=lambda c: (size_order(c.size), variant_order(c.variant))):
        by_lr = dict(zip(c.lrs, zip(c.losses, c.rows)))
        rows.append([c.size, variant_label(c.variant),
                     *(text(c, *by_lr[lr]) if lr in by_lr else "–" for lr in lrs)])
    return _markdown_grid(cells, ["head", *(f"η={lr:g}" for lr in lrs)], rows)


def markdown_report(cells, mean="published", l0=None):
    """Table 2 (untied) / Table 6 (tied) and, for heads run with several λ, Table 3."""
    divisor = {"published": "(n_η − 1), the published tables' rule",
               "literal": "n_η, Eq. 22 as written"}[mean]
    l0_text = (f"L₀ = {l0:g} for every run" if l0 is not None else
               "L₀ = each run's loss at initialisation (init_loss; 10.83, or 10.85 for 221M, "
               "where a CSV has none)")
    parts = [f"# Results\n\nLRS = Σ_η [min(L(η), L₀) − min_η L] / {divisor}; {l0_text}; a "
             f"diverged run counts as L₀. Additional training time = mean train time over the "
             f"runs that did not diverge / the baseline's − 1. Best loss and LRS per size in "
             f"bold. {HEAD_WORDS}"]
    def loss_and_lrs(cells, show_lam=False):  # (i) and (ii)
        return [LOSS, _markdown_table(cells, lambda c: c.optimal_loss, "{:.2f}".format, show_lam),
                LRS, _markdown_table(cells, lambda c: c.lrs_value, "{:.3f}".format, show_lam)]
    for tie in sorted({c.tie for c in cells}):
        tying = "with weight tying" if tie else "without weight tying"
        main = main_cells(cells, tie)
        n_lrs = "/".join(str(n) for n in sorted({len(c.lrs) for c in main}))
        parts += [f"## All variants, {tying} ({n_lrs} learning rates)", *loss_and_lrs(main),
                  TIME, _markdown_table(main, lambda c: time_text(c, cells), "{:.1f}%".format,
                                        best=None)]
        if any(time_text(c, cells) == "n/c" for c in main):
            parts.append(NOT_COMPARABLE)
        rows = [row for c in main for row in c.rows]
        if any(math.isfinite(row["logit_absmax"]) for row in rows):
            parts += [RESOLUTION, per_lr_table(main, lambda c, loss, row: (
                f"{loss - c.optimal_loss:.2f} "
                f"({bf16_resolution(row) if row['logit_std'] > 0 else math.nan:.2g})"))]
        if any(row["mu_norm"] > 0 for row in rows):  # NaN > 0 is False
            parts += [ALIGNMENT, per_lr_table(main, lambda c, loss, row: (
                f"{row['logit_mean'] / row['mu_norm']:.2f}" if row["mu_norm"] > 0 else "–"))]
        for head, swept in swept_lambda_cells(cells, tie).items():
            parts += [f"## {head} for several λ, {tying}", *loss_and_lrs(swept, show_lam=True)]
    return "\n\n".join(parts) + "\n"


def csv_text(header, rows):  # a cell empty for None, true/false, a float in full (repr)
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([header, *(
        ["" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in row]
        for row in rows)])
    return buffer.getvalue()


def table_csv(cells, mean="published"):
    return csv_text(TABLE_CSV_COLUMNS, [(c.tie, c.size, c.head, c.lam, c.cap, len(c.lrs), c.best_lr,
                                         c.optimal_loss, c.lrs_value, mean, c.train_time_s,
                                         extra_time(c, cells)) for c in cells])


# ---- Figures: Fig. 2/8 (loss and LRS vs η), 3 (logit statistics vs η), 4 (λ), curves over
# training; each has one legend, outside its panels
def _columns(cells):
    """{column: title} in order; a column lacking some variants (a second seed) says which ran."""
    titles, variants = {}, {c.variant for c in cells}
    for column in sorted({c.size for c in cells}, key=size_order):
        here = sorted({c.variant for c in cells if c.size == column}, key=variant_order)
        only = f"\n(only {' and '.join(map(variant_label, here))} run)"
        titles[column] = column + (only if len(here) < len(variants) else "")
    return titles


def _lines(cells, ref_cells, column):  # (cell, style, label suffix) of a column: ours solid
    return [(c, style, suffix) for source, style, suffix in ((cells, SOLID, ""), (ref_cells, DASHED,
            " (paper)")) for c in source if c.size == column]


def _finish(fig, title):
    """The figure's title, its one legend (each label once) below, grids; spare panels hidden."""
    handles = {}
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.set_visible(ax.has_data())
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=8,
               ncols=min(len(handles), 5))
    fig.suptitle(textwrap.fill(title, 110))
    return fig


def _log_scale(ax, scale, values):
    """A log or symlog (linear within ±1) y axis, labelled at 1, 2, 5 × 10ᵏ within two decades."""
    positive = [abs(v) for v in values if v != 0] or [1.0]
    low = max(min(positive), 1.0) if scale == "symlog" else min(positive)
    subs = (1, 2, 5) if max(positive) < 100 * low else (1,)  # within two decades
    ax.set_yscale(scale, **({"linthresh": 1.0} if scale == "symlog" else {}))
    ax.yaxis.set_major_locator(ticker.SymmetricalLogLocator(base=10, linthresh=1.0, subs=subs)
                               if scale == "symlog" else ticker.LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    if scale == "symlog" and 0 <= min(values, default=0.0) < 1:
        ax.set_ylim(bottom=-0.3)  # not down to −1, where no value lies


def figures(cells, ref_cells=()):  # (file stem, figure), ref_cells dashed
    for tie in sorted({c.tie for c in cells}):
        tying = "tied" if tie else "untied"
        ours, ref = main_cells(cells, tie), main_cells(ref_cells, tie)
        yield f"fig2_loss_lrs_{tying}", _loss_and_lrs(
            ours, ref, lambda c: HEAD_COLORS.get(c.head, "k"),
            lambda c: variant_label(c.variant), f"Loss vs learning rate, and LRS ({tying})")
        yield f"fig3_logits_{tying}", _metrics(ours, ref, (
            f"Logit statistics, ‖μ‖ and the head's rounding vs learning rate ({tying})"))
        for head, mine in swept_lambda_cells(cells, tie).items():  # Fig. 2's layout, a colour per λ
            theirs = [c for c in ref_cells if c.tie == tie and c.head == head]
            lams = sorted({c.lam for c in mine + theirs})
            yield f"fig4_lambda_{head}_{tying}", _loss_and_lrs(
                mine, theirs, lambda c: colormaps["viridis"](
                    0.9 * lams.index(c.lam) / max(len(lams) - 1, 1)),
                lambda c: f"λ={c.lam:g}", f"{head}: λ sensitivity ({tying})")


def _loss_and_lrs(cells, ref_cells, color_of, label_of, title):
    """Top: min(L(η), L₀) vs η per column, zoomed to 30% above the optimum, a point beyond
    marked on the edge with its value. Below (one column: beside): LRS, sizes as an axis (lines,
    as the paper's), settings of one size as categories (markers)."""
    columns = _columns(cells + ref_cells)
    one, by_size = len(columns) == 1, len(columns) > 1 and not any(" " in c for c in columns)
    fig = Figure(figsize=(3.2 * max(len(columns), 2) + 1, 3.9 if one else 6.9),
                 layout="constrained")
    grid = fig.add_gridspec(1 if one else 2, max(len(columns), 2))
    for i, (column, column_title) in enumerate(columns.items()):
        ax = fig.add_subplot(grid[0, i])
        losses = [x for c in cells + ref_cells if c.size == column or not by_size for x in c.losses]
        low, high = min(losses), min(max(losses), 1.3 * min(losses))  # settings share an axis
        pad = 0.05 * (high - low) or 0.05
        low, top = low - pad, high + pad
        for c, style, suffix in _lines(cells, ref_cells, column):
            ax.plot(c.lrs, c.losses, color=color_of(c), label=label_of(c) + suffix, **style)
            for lr, loss in ((lr, loss) for lr, loss in zip(c.lrs, c.losses) if loss > top):
                ax.plot(lr, top, marker="^", ms=7, color=color_of(c), clip_on=False)
                ax.annotate(f"{loss:.2f}", (lr, top), xytext=(-6, -2), textcoords="offset points",
                            ha="right", va="top", fontsize=7, color=color_of(c))
        ax.set(xscale="log", title=column_title, xlabel="learning rate η", ylim=(low, top),
               ylabel="loss min(L, L₀)")
    ax = fig.add_subplot(grid[0, 1] if one else grid[1, :min(len(columns), 3)])
    variants = sorted({c.variant for c in cells + ref_cells}, key=variant_order)
    for k, variant in enumerate(variants):
        for source, style, suffix in ((cells, SOLID, ""), (ref_cells, DASHED, " (paper)")):
            if line := [c for c in source if c.variant == variant]:  # by size, as reduce_runs
                dodge = 0 if by_size else 0.5 * (k + 0.5) / len(variants) - 0.25
                ax.plot([list(columns).index(c.size) + dodge for c in line],
                        [c.lrs_value for c in line], color=color_of(line[0]),
                        label=label_of(line[0]) + suffix,
                        **(style if by_size else {**style, "ls": "none", "ms": 6}))
    values = [c.lrs_value for c in cells + ref_cells if math.isfinite(c.lrs_value)]
    ax.set(xticks=range(len(columns)), xticklabels=list(columns), ylabel="LRS",
           xlim=(-0.5, len(columns) - 0.5),
           xlabel="model size N" if by_size else "runs (size, dtype, seed)")
    if values and min(values) > 0 and max(values) > 10 * min(values):  # else linear from 0
        _log_scale(ax, "log", values)
    else:
        ax.set_ylim(0, 1.1 * max(values, default=1.0))
    return _finish(fig, title)


def _metrics(cells, ref_cells, title):
    """Fig. 3: METRICS (and PRECISION_METRICS where logged) vs η, a row per metric, columns as in
    Fig. 2 (one column: a grid); a metric's panels share a y scale, symlog where it passes 50."""
    columns = _columns(cells + ref_cells)
    metrics = METRICS + tuple(m for m in PRECISION_METRICS
                              if any(math.isfinite(r[m[0]]) for c in cells for r in c.rows))
    one = len(columns) == 1
    shape = (2, math.ceil(len(metrics) / 2)) if one else (len(metrics), len(columns))
    fig = Figure(layout="constrained", figsize=(
        3.3 * shape[1], 6.6) if one else (3.2 * shape[1] + 1, 2.6 * shape[0]))
    grid = fig.subplots(*shape, squeeze=False)
    for i, (metric, label) in enumerate(metrics):
        values = [r[metric] for c in cells + ref_cells for r in c.rows if math.isfinite(r[metric])]
        label = textwrap.fill(label, 30)
        for j, (column, column_title) in enumerate(columns.items()):
            ax = grid.flat[i] if one else grid[i][j]
            for c, style, suffix in _lines(cells, ref_cells, column):
                ax.plot(c.lrs, [row[metric] for row in c.rows], color=HEAD_COLORS.get(c.head, "k"),
                        label=variant_label(c.variant) + suffix, **style)
            ax.set(xscale="log", ylabel=UNITS[metric],
                   title=label if one or i else f"{column_title}\n{label}",
                   xlabel="learning rate η" if one or i == len(metrics) - 1 else None)
            if max(map(abs, values), default=0.0) > 50:
                _log_scale(ax, "symlog", values)
            if all(r[metric] == 0 for c in cells + ref_cells if c.size == column for r in c.rows):
                ax.text(0.5, 0.6, "0 at every η", transform=ax.transAxes, ha="center")
    return _finish(fig, title + (f", {next(iter(columns))}" if one else ""))


CURVES = (("loss", "training loss"), ("val_loss", "validation loss"), METRICS[2], METRICS[0],
          ("h_mu_proj", "mean hidden state along μ: h̄·μ̂ = l̄/‖μ‖"), METRICS[3],
          *PRECISION_METRICS)
# the settings a curves figure names: in its title where the runs share them, else in labels
CURVE_SETTINGS = {"size": "{} model", "lr": "η = {}", "tie": "", "dtype": "{} matmuls",
                  "seed": "seed {}", "lam": "λ = {}", "cap": "c = {}", "steps": "{} steps",
                  "batch_size": "batches of {}", "seq_len": "{}-token sequences", "data": "on {}"}
LINE_STYLES = ("-", "--", ":", "-.")
FEW_POINTS = 12  # series with at most this many points get markers


def curves_figure(logs, configs):
    """CURVES vs step, a line per run ({run name: log records}, {run name: config.json}): a colour
    per head, a line style per run of it; the title names shared settings, a label what differs."""
    def words_of(key, value):
        return CURVE_SETTINGS[key].format(value) if key != "tie" else "tied" if value else "untied"
    heads = {name: str(config.get("head", Path(name).name)) for name, config in configs.items()}
    first = next(iter(configs.values()))
    seen = {key: {str(config.get(key)) for config in configs.values()} for key in CURVE_SETTINGS}
    shared = [words_of(key, first.get(key)) for key in CURVE_SETTINGS
              if seen[key] != {"None"} and len(seen[key]) == 1]
    differ = [key for key in CURVE_SETTINGS if len(seen[key]) > 1]
    title = " vs ".join(dict.fromkeys(heads.values())) + ": " * bool(shared) + ", ".join(shared)
    curves = [(key, text) for key, text in CURVES
              if any(r.get(key) is not None for records in logs.values() for r in records)]
    ncols = math.ceil(len(curves) / 2)
    fig = Figure(figsize=(4 * ncols, 7.5), layout="constrained")
    axes = fig.subplots(2, ncols, squeeze=False)
    for ax, (key, text) in zip(axes.flat, curves):
        runs_of_head, drawn = {}, []
        for i, (name, records) in enumerate(logs.items()):
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            head = configs[name].get("head")
            n = runs_of_head[head] = runs_of_head.get(head, -1) + 1
            if points:
                words = [words_of(key, configs[name].get(key)) for key in differ]
                ax.plot(*zip(*points), label=", ".join([heads[name], *words]), lw=1.2, ms=4,
                        marker="o" if len(points) <= FEW_POINTS else None,
                        color=HEAD_COLORS.get(head, f"C{i}"), ls=LINE_STYLES[n % len(LINE_STYLES)])
                drawn += [v for _, v in points if math.isfinite(v)]
        if max(map(abs, drawn), default=0.0) > 50:  # ‖μ‖ growing while μ-centering's stays at 0
            _log_scale(ax, "symlog", drawn)
        ax.set(title=textwrap.fill(text, 34), xlabel="step", ylabel=UNITS[key])
    return _finish(fig, title)

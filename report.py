"""
report.py — a sweep's results as the paper's tables and figures.

Learning-rate sensitivity (Wortsman et al. 2023; the paper's Eq. 22), for one size, tying and
head over the learning rates η of the sweep:

    LRS = Σ_η [min(L(η), L₀) − min_η L(η)] / (n_η − 1)

L(η) is the final test loss, L₀ the loss at initialisation (≈ ln V); a diverged run counts as
L₀. Eq. 22 writes a mean over all n_η learning rates, but the published tables divide by n_η − 1,
i.e. they average over the learning rates other than the best one; that is the default here so
our numbers compare with the paper's, and mean="literal" gives Eq. 22 as written, (n_η−1)/n_η
times as large. Additional training time = a variant's mean train time / the baseline's − 1.

The input is a results CSV, one row per run: results_csv() makes one from train.py's run folders
(their summary.json), and the paper's published runs are another. The output is Markdown and CSV
text (Tables 2, 3 and 6) and matplotlib figures (Figs. 2/8, 3 and 4, and curves over training).
Writing files is the caller's (sweep.py collect/table/plot/curves). report.py imports nothing
of this project.
"""
import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

# -----------------------------------------------------------------------------
# the paper's settings (Sec. 3–5) that a results CSV is read against

PAPER_SIZES = ("16M", "29M", "57M", "109M", "221M")
HEADS = ("baseline", "soft_cap", "z_loss", "mu_loss", "mu_center")
LAMBDA_HEADS = ("z_loss", "mu_loss")  # the heads with a regularisation weight λ
DEFAULT_LAM = 1e-4  # the paper's λ for z_loss and mu_loss outside Sec. 5
DEFAULT_CAP = 30.0  # the paper's soft-cap c
# The loss at initialisation where a CSV has no init_loss (the published runs): the reference
# README's values, ≈ ln 50304 = 10.83 (the 221M model starts slightly higher).
L0_BY_SIZE = {"16M": 10.83, "29M": 10.83, "57M": 10.83, "109M": 10.83, "221M": 10.85}
SIZE_ORDER = ("tiny", "small") + PAPER_SIZES  # presets first, then the paper's sizes by N
# What a number of a run may be, in words and as a test (NaN fails every test but the losses':
# a diverged run's loss may be NaN or empty). sweep.py checks its grid by the same rules.
RULES = {"lr": ("a finite number > 0", lambda v: math.isfinite(v) and v > 0),
         "lam": ("a finite number ≥ 0", lambda v: math.isfinite(v) and v >= 0),
         "cap": ("a finite number > 0", lambda v: math.isfinite(v) and v > 0),
         "test_loss": ("≥ 0 (a cross-entropy; NaN or empty if diverged)", lambda v: not v < 0),
         "init_loss": ("≥ 0 (a cross-entropy)", lambda v: not v < 0),
         "train_time_s": ("≥ 0", lambda v: not v < 0)}
TABLE_COLUMNS = ("size", "lr", "head", "lam", "tie", "test_loss", "train_time_s")
METRICS = (("logit_mean", "logit mean  l̄"), ("logit_std", "logit std  σ_l"),
           ("mu_norm", "‖μ‖"), ("logit_absmax", "max |l|"))  # Fig. 3, in the paper's order
# what the matmul's dtype costs the LM head (measure.precision_stat_sums); drawn where a CSV has it
PRECISION_METRICS = (("prec_err_cast", "input rounding / σ_l"),
                     ("prec_err_round", "result rounding / σ_l"), ("prec_ce_gap", "CE gap (nats)"))
HEAD_COLORS = {"baseline": "tab:gray", "soft_cap": "tab:orange", "z_loss": "tab:red",
               "mu_loss": "tab:blue", "mu_center": "tab:green"}
SOLID = dict(ls="-", marker="o", ms=4)  # our runs
DASHED = dict(ls="--", marker="x", ms=4, alpha=0.6)  # the paper's, with a reference CSV


def breaks_rule(name, value):
    """The rule (in words) that value breaks as setting `name`, or None if it is valid."""
    rule, test = RULES[name]
    return None if test(value) else rule


# -----------------------------------------------------------------------------
# LRS: the runs of one size, tying and variant reduced over the learning rates

def capped_loss(row):
    """min(L(η), L₀), with a diverged or non-finite run counted as L₀ (Eq. 22)."""
    loss = row["test_loss"]
    if row["diverged"] or not math.isfinite(loss):
        return row["l0"]
    return min(loss, row["l0"])


def lr_sensitivity(losses, mean="published"):
    """LRS = Σ_η [L̃(η) − min_η L̃] / (n_η − 1) ('published') or / n_η ('literal', Eq. 22),
    over the capped losses L̃(η) = min(L(η), L₀) of one size, tying and variant.
    """
    n = len(losses)
    divisor = {"published": n - 1, "literal": n}[mean]
    excess = sum(loss - min(losses) for loss in losses)
    return excess / divisor if divisor else math.nan


@dataclass
class Cell:
    """One size × variant of a table: its runs reduced over the learning rates."""
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


def reduce_runs(rows, mean="published"):
    """Group rows by (tie, head, λ, c, size) and reduce each group to a Cell."""
    groups = {}
    for row in rows:
        key = (row["tie"], row["head"], row["lam"], row["cap"], row["size"])
        group = groups.setdefault(key, {})
        if row["lr"] in group:
            raise ValueError(f"two results for {row['size']} {row['head']} lr={row['lr']:g} "
                             f"tie={row['tie']} λ={row['lam']} c={row['cap']}; keep one run "
                             f"per point")
        group[row["lr"]] = row
    cells = []
    for (tie, head, lam, cap, size), by_lr in groups.items():
        lrs = sorted(by_lr)
        runs = [by_lr[lr] for lr in lrs]
        losses = [capped_loss(row) for row in runs]
        best = min(range(len(lrs)), key=losses.__getitem__)
        times = [row["train_time_s"] for row in runs
                 if not row["diverged"] and math.isfinite(row["train_time_s"])]
        mean_time = sum(times) / len(times) if times else math.nan
        cells.append(Cell(tie, head, lam, cap, size, lrs, losses, runs, losses[best], lrs[best],
                          lr_sensitivity(losses, mean), mean_time))
    return sorted(cells, key=lambda c: (c.tie, variant_order(c.variant), size_order(c.size)))


def size_order(label):
    """Sizes by N, then a size's dtype/seed columns (label_settings) in name order."""
    size, _, rest = label.partition(" ")
    return (SIZE_ORDER.index(size), rest) if size in SIZE_ORDER else (len(SIZE_ORDER), label)


def variant_order(variant):
    head, lam, cap = variant
    return (HEADS.index(head) if head in HEADS else len(HEADS), head, lam or 0.0, cap or 0.0)


def extra_time(cell, cells):
    """Additional training time relative to the baseline of the same size and tying."""
    base = [c for c in cells if c.head == "baseline" and c.size == cell.size and c.tie == cell.tie]
    if not base or not base[0].train_time_s > 0:
        return math.nan
    return cell.train_time_s / base[0].train_time_s - 1.0


def swept_lambda_heads(cells, tie):
    """Heads run with more than one λ: they get their own Table 3 and Fig. 4."""
    lams = {}
    for cell in cells:
        if cell.tie == tie and cell.lam is not None:
            lams.setdefault(cell.head, set()).add(cell.lam)
    return [head for head in LAMBDA_HEADS if len(lams.get(head, ())) > 1]


def main_cells(cells, tie):
    """The cells of Table 2 (untied) / 6 (tied): heads swept over λ show only λ = 1e-4 there."""
    swept = swept_lambda_heads(cells, tie)
    return [c for c in cells if c.tie == tie and (c.head not in swept or c.lam == DEFAULT_LAM)]


def variant_label(variant, show_lam=False):
    head, lam, cap = variant
    if lam is not None and (show_lam or lam != DEFAULT_LAM):
        return f"{head} λ={lam:g}"
    if cap is not None and cap != DEFAULT_CAP:
        return f"{head} c={cap:g}"
    return head


# -----------------------------------------------------------------------------
# collecting: train.py's run folders -> one results CSV, and a run's log

RESULT_COLUMNS = ("size", "lr", "head", "lam", "cap", "tie", "dtype", "seed", "test_loss",
                  "init_loss", "diverged", "mu_norm", "logit_mean", "logit_std", "logit_absmax",
                  "mean_log2Z", "prec_ce_gap", "prec_err_cast", "prec_err_round", "h_mu_proj",
                  "h_mu_cos", "steps",
                  "tokens", "train_time_s", "run")


def csv_cell(value):
    """A value as a CSV cell: empty for None, true/false, floats in full (repr)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value!r}" if isinstance(value, float) else str(value)


def result_row(summary_path, root):
    """One results.csv row from a run's summary.json (train.py's names; settings it lacks are
    taken from the run's config.json)."""
    summary = json_object(summary_path)
    needed = ("size", "head", "lr", "tie", "val_loss", "init_loss", "diverged")
    missing = [key for key in needed if key not in summary]
    if missing:
        raise ValueError(f"{summary_path} lacks {', '.join(missing)}; it was not written by "
                         f"this project's train.py")
    config_path = Path(summary_path).with_name("config.json")
    config = json_object(config_path) if config_path.exists() else {}
    row = {column: summary.get(column, config.get(column)) for column in RESULT_COLUMNS}
    row["test_loss"] = summary["val_loss"]  # the paper's "test loss" is our validation split
    row["mean_log2Z"] = summary.get("log2Z")  # named as in the published table
    row["run"] = str(Path(summary_path).parent.relative_to(root))
    return {column: csv_cell(value) for column, value in row.items()}


def json_object(path):
    """The dict a JSON file holds; anything else is refused in one sentence."""
    try:  # a pipe or a device would block the read or read as nothing: not a regular file
        value = json.loads(Path(path).read_text()) if Path(path).is_file() else None
    except ValueError:  # not UTF-8, not JSON
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object; it was not written by this project's "
                         f"train.py")
    return value


def results_csv(run_root):
    """Every summary.json under run_root -> the text of a CSV with one row each."""
    run_root = Path(run_root)
    summaries = sorted(run_root.rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"no summary.json under {run_root}; run `python sweep.py run "
                                f"... --out {run_root}` first")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(result_row(path, run_root) for path in summaries)
    return buffer.getvalue()


def read_log(run_dir):
    """The records of a run's log.jsonl, in step order; a log that is empty, not JSON objects,
    or without a step's `step` and `loss`, is refused in one sentence."""
    path = Path(run_dir) / "log.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; give run folders written by train.py")
    if not path.is_file():  # /dev/null or a pipe: there, but not a log
        raise ValueError(f"{path} is not a regular file (a device or a pipe); give run folders "
                         f"written by train.py")
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError:
        raise ValueError(f"{path} is not a log of train.py (a line is not JSON)") from None
    if not records:
        raise ValueError(f"{path} is empty: the run has not logged a step yet; give it time, "
                         f"or leave it out")
    if not all(isinstance(r, dict) and "step" in r and "loss" in r for r in records):
        raise ValueError(f"{path} is not a log of train.py (a line is not a JSON object with "
                         f"'step' and 'loss')")
    return records


# -----------------------------------------------------------------------------
# reading a results CSV

def read_results(path, l0=None, columns=TABLE_COLUMNS):
    """The rows of a results CSV (ours or the published one) with types and each run's L₀.

    λ and c are filled in with the paper's defaults where a head uses them and the CSV leaves
    them empty, and dropped where a head ignores them, so equal runs compare equal.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the results CSV in it ({path / 'results.csv'}"
                         f", made by `python sweep.py collect {path}`)")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; make it with "
                                f"`python sweep.py collect DIR`")
    if not path.is_file():  # a pipe would block the read forever
        raise ValueError(f"{path} is not a regular file (a device or a pipe); give a results "
                         f"CSV made by `python sweep.py collect DIR`")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
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


def _number(text, empty=math.nan):
    """A CSV cell as a float; an empty cell (or a missing column) gives `empty`."""
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
    row = dict(raw)
    head = row["head"]
    row.update(lr=_number(row["lr"]), tie=boolean(row["tie"]), test_loss=_number(row["test_loss"]),
               train_time_s=_number(row["train_time_s"]), init_loss=_number(row.get("init_loss")),
               diverged=boolean(row.get("diverged") or "false"))
    lam, cap = _number(row.get("lam"), None), _number(row.get("cap"), None)
    row["lam"] = (DEFAULT_LAM if lam is None else lam) if head in LAMBDA_HEADS else None
    row["cap"] = (DEFAULT_CAP if cap is None else cap) if head == "soft_cap" else None
    if row.get("seed") not in (None, "") and not str(row["seed"]).isdigit():
        raise ValueError(f"seed is {row['seed']}, but it must be an integer >= 0")
    for name in RULES:
        rule = breaks_rule(name, row[name]) if row[name] is not None else None
        if rule:
            raise ValueError(f"{name} is {raw.get(name) or 'empty'}, but it must be {rule}")
    for name, _ in METRICS + PRECISION_METRICS:
        row[name] = _number(row.get(name))
    row["l0"] = _initial_loss(row, l0)
    return row


def label_settings(rows):
    """The tables' and figures' columns are the model sizes. Where the runs differ in matmul
    dtype or seed (the proxy grid), each dtype gets a column of its own ("tiny bfloat16"), and
    so does every seed but the first ("tiny bfloat16 seed1")."""
    dtypes = {row.get("dtype") or "" for row in rows}
    seeds = sorted({int(row["seed"]) for row in rows if row.get("seed") not in (None, "")})
    for row in rows:
        if len(dtypes) > 1:
            row["size"] += f" {row.get('dtype') or 'default'}"
        if row.get("seed") not in (None, "") and int(row["seed"]) != seeds[0]:
            row["size"] += f" seed{row['seed']}"
    return rows


def _initial_loss(row, l0):
    """L₀: l0 if given, else the run's own init_loss, else the paper's value for its size."""
    if l0 is not None:
        return l0
    if math.isfinite(row["init_loss"]):
        return row["init_loss"]
    if row["size"] in L0_BY_SIZE:  # the published runs: sizes only
        return L0_BY_SIZE[row["size"]]
    raise ValueError(f"no loss at initialisation for size {row['size']!r} (no init_loss value); "
                     f"pass --l0")


# -----------------------------------------------------------------------------
# tables: Markdown (the paper's layout) + CSV (one row per cell)

def _markdown_table(cells, value, fmt, best=min, show_lam=False):
    """Rows = sizes, columns = variants; the best value of each row in bold (best=None: none)."""
    variants = sorted({c.variant for c in cells}, key=variant_order)
    sizes = sorted({c.size for c in cells}, key=size_order)
    at = {(c.size, c.variant): value(c) for c in cells}
    labels = [variant_label(v, show_lam) for v in variants]
    lines = ["| N | " + " | ".join(labels) + " |", "|---" * (len(variants) + 1) + "|"]
    for size in sizes:
        values = [at.get((size, v), math.nan) for v in variants]
        finite = [x for x in values if not isinstance(x, str) and math.isfinite(x)]
        top = fmt(best(finite)) if best and finite else None
        texts = [x if isinstance(x, str) else fmt(x) if math.isfinite(x) else "–" for x in values]
        texts = [f"**{t}**" if t == top else t for t in texts]  # ties at the shown precision too
        lines.append(f"| {size} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


LOSS, LRS = "(i) Optimal loss min_η L (↓)", "(ii) Learning rate sensitivity LRS (↓)"
TIME = "(iii) Additional training time (↓)"
TIME_SPREAD = 1.1  # the most max/min of the times of one cell's runs that still measures the head
NOT_COMPARABLE = ("n/c: not comparable, the runs of this variant or of its baseline took times "
                  f"more than {TIME_SPREAD:g}× apart for the same work at other η, so the "
                  "machine's load, not the head, set them (a shared CPU does that).")


def time_text(cell, cells):
    """(iii)'s entry: the additional time in %, or "n/c" where a time figure means nothing."""
    base = [c for c in cells if c.head == "baseline" and c.size == cell.size and c.tie == cell.tie]
    if not all(_steady_times(c) for c in [cell, *base]):
        return "n/c"
    return 100 * extra_time(cell, cells)


def _steady_times(cell):
    times = [row["train_time_s"] for row in cell.rows
             if not row["diverged"] and math.isfinite(row["train_time_s"])]
    return not times or max(times) <= TIME_SPREAD * min(times)


def _caption(mean, l0):
    divisor = {"published": "(n_η − 1), the published tables' rule",
               "literal": "n_η, Eq. 22 as written"}[mean]
    l0_text = (f"L₀ = {l0:g} for every run" if l0 is not None else
               "L₀ = each run's loss at initialisation (init_loss; 10.83, or 10.85 for 221M, "
               "where a CSV has none)")
    return (f"LRS = Σ_η [min(L(η), L₀) − min_η L] / {divisor}; {l0_text}; a diverged run "
            f"counts as L₀. Additional training time = mean train time over the runs that did "
            f"not diverge / the baseline's − 1. Best loss and LRS per size in bold.")


def markdown_report(cells, mean="published", l0=None):
    """Table 2 (untied) / Table 6 (tied) and, for heads run with several λ, Table 3."""
    optimal, sensitivity = (lambda c: c.optimal_loss), (lambda c: c.lrs_value)
    loss_fmt, lrs_fmt = "{:.2f}".format, "{:.3f}".format
    parts = [f"# Results\n\n{_caption(mean, l0)}"]
    for tie in sorted({c.tie for c in cells}):
        tying = "with weight tying" if tie else "without weight tying"
        main = main_cells(cells, tie)
        n_lrs = "/".join(str(n) for n in sorted({len(c.lrs) for c in main}))
        parts += [f"## All variants, {tying} ({n_lrs} learning rates)",
                  LOSS, _markdown_table(main, optimal, loss_fmt),
                  LRS, _markdown_table(main, sensitivity, lrs_fmt),
                  TIME, _markdown_table(main, lambda c: time_text(c, cells), "{:.1f}%".format,
                                        best=None)]
        if any(time_text(c, cells) == "n/c" for c in main):
            parts.append(NOT_COMPARABLE)
        if any(math.isfinite(row["logit_absmax"]) for c in main for row in c.rows):
            parts += [RESOLUTION, resolution_table(main)]
        if any(math.isfinite(row["mu_norm"]) and row["mu_norm"] > 0 for c in main
               for row in c.rows):
            parts += [ALIGNMENT, alignment_table(main)]
        for head in swept_lambda_heads(cells, tie):
            swept = [c for c in cells if c.tie == tie and c.head == head]
            parts += [f"## {head} for several λ, {tying}",
                      LOSS, _markdown_table(swept, optimal, loss_fmt, show_lam=True),
                      LRS, _markdown_table(swept, sensitivity, lrs_fmt, show_lam=True)]
    return "\n\n".join(parts) + "\n"


RESOLUTION = ("(iv) min(L, L₀) − the variant's best loss (a diverged run counts as L₀, as in "
              "LRS), and in brackets the bf16 spacing at the typical logit √(l̄² + σ_l²) over "
              "the logits' spread σ_l, per learning rate")


def bf16_resolution(row):
    """The gap between neighbouring bf16 numbers at the run's typical logit magnitude
    √(l̄² + σ_l²) (bf16 keeps 8 significant bits: 2^(⌊log₂ x⌋ − 7), i.e. float64's ulp × 2⁴⁵),
    in units of its logit std σ_l. Each logit rounds at its own magnitude, and most sit within
    a few σ_l of l̄, so the rounding the softmax can see (its spread over the vocabulary,
    measure.precision_stat_sums) is about this over √12. Not the spacing at max|l|: that is
    where one outlying logit rounds (μ-centering's max|l| is larger than the baseline's on the
    CPU proxy while its rounding is 5× smaller). Near 1 and above, bf16 no longer resolves the
    spread that carries the prediction: the paper's baseline at large η (l̄ ≈ 10³, σ_l ≈ 5)."""
    typical = math.hypot(row["logit_mean"], row["logit_std"])
    return math.ulp(typical) * 2 ** 45 / row["logit_std"]


def per_lr_table(cells, text):
    """Rows = size and variant, columns = learning rates; a cell is text(cell, loss, row) for
    the run at that η (its loss as LRS counts it, its results row), "–" where none ran."""
    lrs = sorted({lr for c in cells for lr in c.lrs})
    lines = ["| N | variant | " + " | ".join(f"η={lr:g}" for lr in lrs) + " |",
             "|---" * (len(lrs) + 2) + "|"]
    for c in sorted(cells, key=lambda c: (size_order(c.size), variant_order(c.variant))):
        by_lr = dict(zip(c.lrs, zip(c.losses, c.rows)))
        texts = [text(c, *by_lr[lr]) if lr in by_lr else "–" for lr in lrs]
        lines.append(f"| {c.size} | {variant_label(c.variant)} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def resolution_table(cells):
    """Per η: loss − the variant's best (capped as in LRS), with the bf16 resolution of its
    logits in brackets."""
    def text(c, loss, row):
        resolution = bf16_resolution(row) if row["logit_std"] > 0 else math.nan
        return f"{loss - c.optimal_loss:.2f} ({resolution:.2g})"
    return per_lr_table(cells, text)


ALIGNMENT = ("(v) How the mean hidden state lines up with μ: h̄·μ̂ = l̄/‖μ‖ (Lemma 1, averaged "
             "over tokens), per learning rate; with centering ‖μ‖ ≈ 0 and the ratio means nothing")


def alignment_table(cells):
    """Per η: the run's l̄/‖μ‖, the component of the mean hidden state along μ, which turns a
    grown ‖μ‖ into a large mean logit ("–" where ‖μ‖ = 0)."""
    return per_lr_table(cells, lambda c, loss, row: f"{row['logit_mean'] / row['mu_norm']:.2f}"
                        if row["mu_norm"] > 0 else "–")


TABLE_CSV_COLUMNS = ("tie", "size", "head", "lam", "cap", "n_lrs", "best_lr", "optimal_loss",
                     "lrs", "lrs_mean", "train_time_s", "extra_time")


def table_csv(cells, mean="published"):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TABLE_CSV_COLUMNS)
    for c in cells:
        writer.writerow([csv_cell(v) for v in (c.tie, c.size, c.head, c.lam, c.cap, len(c.lrs),
                                               c.best_lr, c.optimal_loss, c.lrs_value, mean,
                                               c.train_time_s, extra_time(c, cells))])
    return buffer.getvalue()


# -----------------------------------------------------------------------------
# figures: Fig. 2/8 (loss vs η per size, LRS vs size), Fig. 3 (logit statistics vs η), Fig. 4 (λ)

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def figures(cells, ref_cells=()):
    """Yield (file stem, figure) for each figure of these cells, ref_cells (the paper's) dashed
    beside them; each figure is closed when the caller asks for the next one."""
    plt = _pyplot()
    for tie in sorted({c.tie for c in cells}):
        tying = "tied" if tie else "untied"
        ours, ref = main_cells(cells, tie), main_cells(ref_cells, tie)
        head_color = lambda c: HEAD_COLORS.get(c.head, "k")
        drawn = [(f"fig2_loss_lrs_{tying}", _plot_loss_and_lrs(
                     plt, ours, ref, head_color, lambda c: variant_label(c.variant),
                     f"Loss vs learning rate, and LRS ({tying})")),
                 (f"fig3_logits_{tying}", _plot_metrics(
                     plt, ours, ref, f"Logit statistics, ‖μ‖ and the head's rounding vs "
                                     f"learning rate ({tying})"))]
        for stem, fig in drawn:
            yield stem, fig
            plt.close(fig)
        for head in swept_lambda_heads(cells, tie):
            ours_lam = [c for c in cells if c.tie == tie and c.head == head]
            ref_lam = [c for c in ref_cells if c.tie == tie and c.head == head]
            lams = sorted({c.lam for c in ours_lam + ref_lam})
            lam_color = lambda c: plt.get_cmap("viridis")(
                0.9 * lams.index(c.lam) / max(len(lams) - 1, 1))
            fig = _plot_loss_and_lrs(plt, ours_lam, ref_lam, lam_color, lambda c: f"λ={c.lam:g}",
                                     f"{head}: λ sensitivity ({tying})")
            yield f"fig4_lambda_{head}_{tying}", fig
            plt.close(fig)


def _plot_loss_and_lrs(plt, cells, ref_cells, color_of, label_of, title):
    """Top row: min(L(η), L₀) vs η, one panel per column (size, or size and dtype/seed); below:
    LRS per column, joined by lines only where the columns are model sizes. Dashed = paper."""
    sizes = sorted({c.size for c in cells + ref_cells}, key=size_order)
    one = len(sizes) == 1  # then the LRS panel sits beside the loss panel
    fig = plt.figure(figsize=(3.2 * max(len(sizes), 2) + 1, 3.4 if one else 6.4),
                     layout="constrained")
    grid = fig.add_gridspec(1 if one else 2, max(len(sizes), 2))
    loss_axes = [fig.add_subplot(grid[0, i]) for i in range(len(sizes))]
    lrs_ax = fig.add_subplot(grid[0, 1] if one else grid[1, :min(len(sizes), 3)])
    for source, style in ((cells, SOLID), (ref_cells, DASHED)):
        suffix = " (paper)" if source is ref_cells else ""
        for c in source:
            loss_axes[sizes.index(c.size)].plot(c.lrs, c.losses, color=color_of(c),
                                                label=label_of(c) + suffix, **style)
    by_size = _columns_are_sizes(sizes)
    _plot_lrs(lrs_ax, sizes, by_size, cells, ref_cells, color_of, label_of)
    for ax, size in zip(loss_axes, sizes):  # columns of one size share their loss axis
        losses = [loss for c in cells + ref_cells if c.size == size or not by_size
                  for loss in c.losses]
        # zoom on the optimum: up to 30% above it, the region the paper's Fig. 2 shows
        low, high = min(losses), min(max(losses), 1.3 * min(losses))
        pad = 0.05 * (high - low) or 0.05
        ax.set(xscale="log", title=size, xlabel="learning rate η", ylim=(low - pad, high + pad))
        ax.grid(alpha=0.3)
    loss_axes[0].set_ylabel("loss min(L, L₀)")
    loss_axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return fig


def _columns_are_sizes(columns):
    """Whether the figure's columns are model sizes (an axis), not settings of one size."""
    return len(columns) > 1 and all(" " not in column for column in columns)


def _plot_lrs(ax, columns, by_size, cells, ref_cells, color_of, label_of):
    """LRS per column. Model sizes are an axis (lines, as the paper's Fig. 2); columns that are
    settings of one size (dtype, seed) are categories: markers only, side by side per variant.
    The axis is linear from 0 unless the values span more than a factor of 10 (then log)."""
    variants = sorted({c.variant for c in cells + ref_cells}, key=variant_order)
    for source, style in ((cells, SOLID), (ref_cells, DASHED)):
        suffix = " (paper)" if source is ref_cells else ""
        for k, variant in enumerate(variants):
            line = sorted((c for c in source if c.variant == variant),
                          key=lambda c: size_order(c.size))
            if not line:
                continue
            dodge = 0 if by_size else 0.5 * (k + 0.5) / len(variants) - 0.25
            ax.plot([columns.index(c.size) + dodge for c in line], [c.lrs_value for c in line],
                    color=color_of(line[0]), label=label_of(line[0]) + suffix,
                    **(style if by_size else {**style, "ls": "none", "ms": 6}))
    values = [c.lrs_value for c in cells + ref_cells if math.isfinite(c.lrs_value)]
    wide = bool(values) and min(values) > 0 and max(values) > 10 * min(values)
    ax.set(xticks=range(len(columns)), xticklabels=columns, ylabel="LRS", xlim=(-0.5,
           len(columns) - 0.5), xlabel="model size N" if by_size else "runs (size, dtype, seed)")
    if wide:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, 1.1 * max(values, default=1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _plot_metrics(plt, cells, ref_cells, title):
    """Fig. 3: logit mean, logit std, ‖μ‖ and max |l| vs η, and the precision metrics where the
    runs logged them; rows = metrics, columns = sizes (one size: the metrics side by side).
    A metric gets one y scale in all its panels: symlog (linear within ±1) where its values
    reach past 50, as the baseline's ‖μ‖ does while μ-centering's stays at 0."""
    sizes = sorted({c.size for c in cells + ref_cells}, key=size_order)
    metrics = METRICS + tuple(m for m in PRECISION_METRICS
                              if any(math.isfinite(r[m[0]]) for c in cells for r in c.rows))
    if len(sizes) == 1:  # a strip of one column would be 7 panels tall: wrap it
        ncols = math.ceil(len(metrics) / 2)
        fig, grid = plt.subplots(2, ncols, figsize=(3.3 * ncols, 6.2), squeeze=False,
                                 layout="constrained")
        panels = {(metric, sizes[0]): ax for (metric, _), ax in zip(metrics, grid.flat)}
        for ax in grid.flat[len(metrics):]:
            ax.set_visible(False)
    else:
        fig, grid = plt.subplots(len(metrics), len(sizes), figsize=(3.2 * len(sizes) + 1,
                                 2.5 * len(metrics)), squeeze=False, layout="constrained")
        panels = {(metric, size): grid[i][j] for i, (metric, _) in enumerate(metrics)
                  for j, size in enumerate(sizes)}
    for source, style in ((cells, SOLID), (ref_cells, DASHED)):
        suffix = " (paper)" if source is ref_cells else ""
        for c in source:
            for metric, _ in metrics:
                panels[metric, c.size].plot(c.lrs, [row[metric] for row in c.rows],
                                            color=HEAD_COLORS.get(c.head, "k"),
                                            label=variant_label(c.variant) + suffix, **style)
    for metric, label in metrics:
        values = [abs(r[metric]) for c in cells + ref_cells for r in c.rows]
        symlog = max(filter(math.isfinite, values), default=0.0) > 50
        for size in sizes:
            ax = panels[metric, size]
            if symlog:
                ax.set_yscale("symlog", linthresh=1.0)
            ax.set_xscale("log")
            if len(sizes) == 1 or metric == metrics[-1][0]:
                ax.set_xlabel("learning rate η")
            if all(r[metric] == 0 for c in cells + ref_cells if c.size == size for r in c.rows):
                ax.text(0.5, 0.6, "0 at every η", transform=ax.transAxes, ha="center")
            ax.grid(alpha=0.3)
            if len(sizes) == 1:
                ax.set_title(label, fontsize=10)
            elif metric == metrics[0][0]:
                ax.set_title(size)
            if len(sizes) > 1 and size == sizes[0]:
                ax.set_ylabel(label)
    if len(sizes) == 1:
        title += f", {sizes[0]}"
    panels[metrics[0][0], sizes[0]].legend(fontsize=7)
    fig.suptitle(title)
    return fig


CURVES = (("loss", "training loss"), ("val_loss", "validation loss"), ("mu_norm", "‖μ‖"),
          ("logit_mean", "logit mean  l̄"), ("h_mu_proj", "h̄·μ̂ = l̄/‖μ‖"),
          ("logit_absmax", "max |l|"),
          ("prec_err_cast", "input rounding / σ_l"), ("prec_err_round", "result rounding / σ_l"),
          ("prec_ce_gap", "CE gap (nats)"))
CURVE_SETTINGS = ("size", "lr", "tie", "dtype", "seed", "lam", "cap")  # told apart in labels
LINE_STYLES = ("-", "--", ":", "-.")
FEW_POINTS = 12  # series with at most this many points get markers


def curve_labels(configs):
    """A legend label per run: its head and the settings in which the runs differ,
    e.g. 'baseline, seed 1'; configs = {run name: its config.json (or {})}."""
    differ = [key for key in CURVE_SETTINGS
              if len({str(config.get(key)) for config in configs.values()}) > 1]
    return {name: ", ".join([str(config.get("head", Path(name).name))] +
                            [f"{key} {config.get(key)}" for key in differ])
            for name, config in configs.items()}


def curves_figure(logs, configs=None):
    """The quantities of CURVES vs step, one line per run: logs = {run name: log records},
    configs = {run name: its config.json}. A head has one colour (HEAD_COLORS) in every figure;
    runs of one head are told apart by line style, and named by what differs between them.
    A series of few points (validation losses) is drawn with markers; a panel no run logged
    is left out."""
    configs = configs or {name: {} for name in logs}
    labels = curve_labels(configs)
    styles, seen = {}, {}
    for name in logs:
        head = configs[name].get("head")
        styles[name] = dict(color=HEAD_COLORS.get(head, f"C{len(styles)}"),
                            ls=LINE_STYLES[seen.get(head, 0) % len(LINE_STYLES)])
        seen[head] = seen.get(head, 0) + 1
    curves = [(key, label) for key, label in CURVES
              if any(r.get(key) is not None for records in logs.values() for r in records)]
    plt = _pyplot()
    ncols = math.ceil(len(curves) / 2)
    fig, axes = plt.subplots(2, ncols, figsize=(4 * ncols, 7), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(curves):]:
        ax.set_visible(False)
    for ax, (key, label) in zip(axes.flat, curves):
        values = []
        for name, records in logs.items():
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), label=labels[name], lw=1.2,
                        marker="o" if len(points) <= FEW_POINTS else None, ms=4,
                        **styles[name])
                values += [abs(v) for _, v in points if math.isfinite(v)]
        if max(values, default=0.0) > 50:  # ‖μ‖ growing while μ-centering's stays at 0
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set(title=label, xlabel="step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return fig

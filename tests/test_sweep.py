"""sweep.py: the paper's tables from its published runs, the grids, SLURM, collect, plots, and a
tiny CPU sweep that is interrupted and resumed.

The published runs (tests/data/oec_untied_runs.csv, a copy of ../shared/reference) must give
back every number of the paper's Table 2 (i)/(ii) and Table 3 that they cover; the numbers below
are typed in from the paper, not from our output.
"""
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import report
import sweep

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(__file__).resolve().parent / "data" / "oec_untied_runs.csv"
TEXT = Path(__file__).resolve().parent / "assets" / "paradise_regained.txt"
SIZES = ("16M", "29M", "57M", "109M", "221M")


def paper_table(text):
    """A table as printed in the paper (rows: size, then one value per column) -> {size: values}."""
    return {line.split()[0]: tuple(line.split()[1:]) for line in text.strip().splitlines()}


# Table 2 (untied): columns baseline, z-loss, μ-loss, μ-centering (soft-cap is not in the CSV)
TABLE2_HEADS = ("baseline", "z_loss", "mu_loss", "mu_center")
TABLE2 = {"optimal_loss": paper_table("""
    16M  3.84 3.84 3.84 3.84
    29M  3.59 3.58 3.59 3.58
    57M  3.37 3.37 3.37 3.37
    109M 3.20 3.20 3.20 3.20
    221M 3.05 3.05 3.05 3.05"""), "lrs": paper_table("""
    16M  0.306 0.054 0.031 0.028
    29M  0.391 0.033 0.027 0.029
    57M  0.508 0.235 0.031 0.041
    109M 0.344 0.118 0.046 0.051
    221M 0.412 0.109 0.056 0.061""")}
# Table 3: columns λ = 1e-7, 1e-4, 1e-1, 1e2
TABLE3_LAMS = (1e-7, 1e-4, 1e-1, 1e2)
TABLE3 = {("mu_loss", "optimal_loss"): paper_table("""
    16M  3.84 3.84 3.84 3.81
    29M  3.59 3.59 3.58 3.56
    57M  3.37 3.37 3.37 3.36
    109M 3.20 3.20 3.20 3.20
    221M 3.05 3.05 3.05 3.05"""), ("mu_loss", "lrs"): paper_table("""
    16M  0.182 0.031 0.031 0.054
    29M  0.052 0.027 0.034 0.040
    57M  0.110 0.031 0.038 0.033
    109M 0.125 0.046 0.048 0.034
    221M 0.129 0.056 0.056 0.055"""), ("z_loss", "optimal_loss"): paper_table("""
    16M  3.84 3.84 3.83 4.19
    29M  3.59 3.58 3.57 3.94
    57M  3.37 3.37 3.35 3.79
    109M 3.20 3.20 3.18 3.64
    221M 3.05 3.05 3.03 3.49"""), ("z_loss", "lrs"): paper_table("""
    16M  0.037 0.054 0.032 1.156
    29M  0.044 0.033 0.043 1.780
    57M  0.107 0.235 0.047 1.392
    109M 0.076 0.118 0.059 2.150
    221M 0.131 0.109 0.101 2.166""")}
DIGITS = {"optimal_loss": 2, "lrs": 3}  # as printed


def table_rows(out_dir):
    """table.csv as {(size, head, lam or None): row}."""
    with open(out_dir / "table.csv", newline="") as f:
        return {(r["size"], r["head"], float(r["lam"]) if r["lam"] else None): r
                for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def reference_tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    for mean in ("published", "literal"):
        argv = ["table", str(REFERENCE), "--out", str(out / mean), "--lrs_mean", mean]
        assert sweep.main(argv) == 0
    return out


def test_reference_reproduces_table2(reference_tables):
    rows = table_rows(reference_tables / "published")
    for column, table in TABLE2.items():
        for size in SIZES:
            for head, expected in zip(TABLE2_HEADS, table[size]):
                row = rows[(size, head, 1e-4 if head in ("z_loss", "mu_loss") else None)]
                assert f"{float(row[column]):.{DIGITS[column]}f}" == expected, (column, size, head)
                assert row["tie"] == "false" and row["n_lrs"] == "7"


def test_published_baseline_loses_where_bf16_no_longer_resolves_its_logits(reference_tables):
    """Table (iv): 16M baseline at η = 0.3 ends 1.22 above its best, with l̄ = 1152 where
    bf16's spacing is 8 = 1.44 σ_l (σ_l = 5.5625); μ-centering's l̄ = 0 leaves its logits at
    σ_l = 3.40625, where the spacing is 2⁻⁶ = 0.0046 σ_l."""
    markdown = (reference_tables / "published" / "table.md").read_text()
    assert "| 16M | baseline | 0.12 (0.012) |" in markdown and "| 1.22 (1.4) |" in markdown
    assert "| 16M | mu_center | 0.12 (0.006) |" in markdown and "0.00 (0.0046) |" in markdown
    row = {"logit_mean": 1152.0, "logit_std": 5.5625}
    assert report.bf16_resolution(row) == 8 / 5.5625
    assert report.bf16_resolution({"logit_mean": 0.0, "logit_std": 1.0}) == 2 ** -7


@pytest.mark.parametrize("mean, std", [(0.0, 1.0), (-7.0, 1.0), (300.0, 5.0), (1152.0, 5.5)])
def test_bf16_resolution_predicts_the_rounding_the_softmax_sees(mean, std):
    """The spread over the vocabulary of the bf16 rounding error of logits N(l̄, σ²) is the
    resolution over √12 (a uniform error over one spacing) to within a factor 1.6."""
    logits = mean + std * torch.randn(50304, generator=torch.Generator().manual_seed(0),
                                      dtype=torch.float64)
    seen = (logits.bfloat16().double() - logits).std().item() / std
    predicted = report.bf16_resolution({"logit_mean": mean, "logit_std": std}) / math.sqrt(12)
    assert predicted / 1.6 < seen < predicted * 1.6


def test_reference_reproduces_table3(reference_tables):
    rows = table_rows(reference_tables / "published")
    for (head, column), values in TABLE3.items():
        for size in SIZES:
            for lam, expected in zip(TABLE3_LAMS, values[size]):
                got = float(rows[(size, head, lam)][column])
                assert f"{got:.{DIGITS[column]}f}" == expected, (head, column, size, lam)


def test_literal_mean_is_six_sevenths_and_caption_says_which(reference_tables):
    published = table_rows(reference_tables / "published")
    literal = table_rows(reference_tables / "literal")
    assert published.keys() == literal.keys() and len(published) == 5 * 10
    for key, row in published.items():
        assert float(literal[key]["lrs"]) == pytest.approx(float(row["lrs"]) * 6 / 7, rel=1e-12)
    markdown = (reference_tables / "published" / "table.md").read_text()
    assert "/ (n_η − 1), the published tables' rule" in markdown
    assert "/ n_η, Eq. 22 as written" in (reference_tables / "literal" / "table.md").read_text()
    assert "| 16M | 0.306 | 0.054 | 0.031 | **0.028** |" in markdown  # Table 2 (ii), best in bold


def test_lrs_counts_diverged_and_worse_runs_as_l0():
    rows = [dict(test_loss=loss, diverged=diverged, l0=10.0)
            for loss, diverged in ((3.0, False), (3.5, False), (12.0, False), (math.nan, True))]
    capped = [report.capped_loss(r) for r in rows]
    assert capped == [3.0, 3.5, 10.0, 10.0]
    assert report.lr_sensitivity(capped) == pytest.approx((0.5 + 7.0 + 7.0) / 3, rel=1e-15)
    assert report.lr_sensitivity(capped, "literal") == pytest.approx((0.5 + 7.0 + 7.0) / 4,
                                                                    rel=1e-15)
    assert math.isnan(report.lr_sensitivity([3.0]))  # one learning rate: no sensitivity to speak of


def test_grids_have_the_papers_sizes_and_folder_names():
    paper = sweep.expand_grid("paper")
    assert len(paper) == 7 * 5 * 2 * 5 and len(set(paper)) == len(paper)
    names = {run.name for run in paper}
    assert {"16M_baseline_lr0.0003_tie0", "221M_z_loss_lr0.3_tie1_lam0.0001",
            "57M_soft_cap_lr0.01_tie0_cap30", "29M_mu_center_lr0.1_tie1"} <= names
    lam = sweep.expand_grid("lambda")
    assert len(lam) == 4 * 2 * 7 * 5 and not any(run.tie for run in lam)
    assert {run.lam for run in lam} == {1e-7, 1e-4, 1e-1, 1e2}
    assert {run.head for run in lam} == {"z_loss", "mu_loss"}
    narrowed = sweep.expand_grid("paper", sizes=["16M"], lrs=[1e-3], ties=[False])
    assert sorted(run.name for run in narrowed) == sorted(
        ["16M_baseline_lr0.001_tie0", "16M_soft_cap_lr0.001_tie0_cap30",
         "16M_z_loss_lr0.001_tie0_lam0.0001", "16M_mu_loss_lr0.001_tie0_lam0.0001",
         "16M_mu_center_lr0.001_tie0"])
    assert narrowed[0].train_args() == ["--size", "16M", "--head", "baseline", "--lr", "0.001"]
    assert sweep.Run("tiny", "z_loss", 0.01, True, lam=0.1).train_args() == [
        "--size", "tiny", "--head", "z_loss", "--lr", "0.01", "--tie", "--lam", "0.1"]


def test_proxy_grid_has_every_head_both_dtypes_and_ties_only_baseline_and_mu_center():
    proxy = sweep.expand_grid("proxy")
    lrs = sweep.PROXY_LRS
    assert len(proxy) == len(lrs) * 2 * (5 + 2) and len({run.name for run in proxy}) == len(proxy)
    assert {run.head for run in proxy if run.tie} == {"baseline", "mu_center"}
    assert {run.dtype for run in proxy} == {"float32", "bfloat16"} and max(lrs) >= 1.0
    run = sweep.Run("tiny", "mu_center", 0.3, True, dtype="bfloat16", seed=1)
    assert run.name == "tiny_mu_center_lr0.3_tie1_bfloat16_seed1"
    assert run.train_args()[-4:] == ["--dtype", "bfloat16", "--seed", "1"]
    seeds = sweep.expand_grid("proxy", heads=["baseline"], lrs=[1.0], ties=[False],
                              dtypes=["bfloat16"], seeds=[0, 1])
    assert [r.name for r in seeds] == ["tiny_baseline_lr1_tie0_bfloat16_seed0",
                                       "tiny_baseline_lr1_tie0_bfloat16_seed1"]


def test_proxy_train_settings_come_first_so_the_command_line_wins(tmp_path, capsys):
    sweep.main(["run", "--grid", "proxy", "--heads", "baseline", "--lrs", "1", "--tie", "false",
                "--dtypes", "float32", "--out", str(tmp_path), "--dry_run", "--steps", "7"])
    command = capsys.readouterr().out.splitlines()[1].split()
    assert command.index("--steps") < len(command) - 2 and command[-2:] == ["--steps", "7"]
    assert command[command.index("--data") + 1] == "data/shakespeare"


def test_the_papers_grids_vary_the_data_order_with_the_seed_and_the_proxy_keeps_its_own(
        tmp_path, capsys):
    """The paper's code draws each batch from a random shard at random windows, seeded, so its
    seeds vary the data order too: its grids pass --data_order random. The proxy's committed
    runs read the text in order, so the proxy grid keeps that order; custom leaves train.py's."""
    def commands(*argv):
        assert sweep.main(["run", *argv, "--out", str(tmp_path), "--dry_run"]) == 0
        return [line.split() for line in capsys.readouterr().out.splitlines()
                if not line.startswith("sweep: ")]  # the count, a note on missing --data

    def order(command):
        return [command[i + 1] for i, arg in enumerate(command) if arg == "--data_order"]
    paper = commands("--grid", "paper", "--sizes", "16M", "--lrs", "1e-3", "--seeds", "0", "1")
    assert len(paper) == 2 * 2 * 5 and all(order(c) == ["random"] for c in paper)
    assert {c[c.index("--seed") + 1] for c in paper} == {"0", "1"}
    assert all(order(c) == ["random"] for c in commands("--grid", "lambda", "--lrs", "1e-3"))
    assert all(order(c) == ["sequential"] for c in commands("--grid", "proxy", "--lrs", "1"))
    [custom] = commands("--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "--heads",
                        "baseline")
    assert order(custom) == []
    [mine] = commands("--grid", "paper", "--sizes", "16M", "--lrs", "1e-3", "--heads", "baseline",
                      "--tie", "false", "--data_order", "sequential")
    assert order(mine) == ["random", "sequential"]  # the user's comes last: argparse keeps it


def test_dtype_and_seed_columns_label_the_table_columns():
    rows = [{"size": "tiny", "dtype": d, "seed": n} for d in ("float32", "bfloat16")
            for n in ("0", "1")] + [{"size": "16M", "dtype": "float32", "seed": "0"}]
    assert [r["size"] for r in report.label_settings(rows)] == [
        "tiny float32", "tiny float32 seed1", "tiny bfloat16", "tiny bfloat16 seed1",
        "16M float32"]
    same = [{"size": "tiny", "dtype": "float32", "seed": "0"}, {"size": "16M", "dtype": "float32"}]
    assert [r["size"] for r in report.label_settings(same)] == ["tiny", "16M"]  # one setting
    labels = ["tiny float32", "16M", "tiny bfloat16", "tiny"]
    assert sorted(labels, key=report.size_order) == ["tiny", "tiny bfloat16", "tiny float32", "16M"]


@pytest.mark.parametrize("argv, message", [
    (["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "--out", "x"],
     "--grid custom needs --heads"),
    (["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "--heads", "zloss",
      "--out", "x"],
     "unknown head 'zloss'; choose from baseline, soft_cap, z_loss, mu_loss, mu_center"),
    (["run", "--grid", "paper", "--out", "x", "--lr", "1e-3"], "--lr is set per run by the sweep"),
    (["run", "--grid", "paper", "--out", "x", "--gpus", "0,1,2", "--nproc_per_node", "2"],
     "must list a multiple of --nproc_per_node=2"),
    (["collect", "EMPTY"], "no summary.json under"),
    (["table", "MISSING.csv"], "does not exist; make it with `python sweep.py collect DIR`"),
])
def test_bad_input_gives_one_clear_sentence(argv, message, tmp_path):
    argv = [str(tmp_path / a) if a in ("EMPTY", "MISSING.csv", "x") else a for a in argv]
    with pytest.raises(SystemExit) as error:
        sweep.main(argv)
    assert message in str(error.value)


def test_unknown_grid_is_refused(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["run", "--grid", "huge", "--out", "x"])
    error = capsys.readouterr().err
    assert "invalid choice: 'huge' (choose from 'paper', 'lambda', 'proxy', 'custom')" in error
    with pytest.raises(ValueError, match="unknown grid 'huge'; choose one of paper, lambda, "):
        sweep.expand_grid("huge")


def test_table_refuses_csv_without_a_column_or_without_rows(tmp_path):
    with open(REFERENCE) as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    drop = header.index("test_loss")
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(",".join(c for i, c in enumerate(line.split(",")) if i != drop) + "\n"
                           for line in lines))
    with pytest.raises(SystemExit, match=r"cut.csv has no column test_loss; this needs size, lr, "):
        sweep.main(["table", str(cut)])
    with pytest.raises(SystemExit, match=r"cut.csv has no column test_loss; this needs .*, "
                                         r"logit_mean, logit_std, mu_norm, logit_absmax \(as"):
        sweep.main(["plot", str(cut)])
    empty = tmp_path / "empty.csv"
    empty.write_text(lines[0] + "\n")
    with pytest.raises(SystemExit, match="empty.csv holds no results; run the sweep and "):
        sweep.main(["table", str(empty)])
    assert not (tmp_path / "table.md").exists()


def test_grid_values_are_all_checked_before_anything_starts(tmp_path):
    """`--lrs 0 1e-3` used to launch both and lose the good run too; now every bad value of
    every axis is named at once and nothing is written."""
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as error:
        sweep.main(["run", "--grid", "custom", "--sizes", "tiny", "bogus", "--heads", "z_loss",
                    "soft_cap", "--lrs", "0", "1e-3", "nan", "-1", "--lams", "-0.0001", "1e-4",
                    "--caps", "0", "--seeds", "-1", "0", "--out", str(out)])
    assert str(error.value) == (
        "sweep run: nothing was started, as the grid has bad values: --sizes bogus (each must "
        "be one of tiny, small, 16M, 29M, 57M, 109M, 221M); --lrs 0 nan -1 (each must "
        "be a finite number > 0); --lams -0.0001 (each must be a finite number ≥ 0); --caps 0 "
        "(each must be a finite number > 0); --seeds -1 (each must be an integer from 0 to "
        "2^64 − 1)")
    assert not out.exists()


@pytest.mark.parametrize("option, value, rule", [
    ("--jobs", "0", "an integer > 0"), ("--nproc_per_node", "-2", "an integer > 0"),
    ("--nodes", "0", "an integer > 0"), ("--array_limit", "-1", "an integer >= 0")])
def test_launcher_counts_must_be_positive(option, value, rule, capsys):
    with pytest.raises(SystemExit):
        sweep.main(["run", "--grid", "paper", "--out", "x", option, value, "--dry_run"])
    assert f"argument {option}: {value} is invalid; give {rule}" in capsys.readouterr().err


def test_out_that_cannot_hold_run_folders_is_refused_in_one_sentence(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anyway: use a read-only mount if there is one
        read_only = Path("/proc/sys")
        if os.access(read_only, os.W_OK):
            pytest.skip("no folder here that this process cannot write to")
    for out, message in ((a_file, f"--out {a_file} is a file; give a folder"),
                         (a_file / "sub", f"--out {a_file / 'sub'} lies under the file {a_file}; "
                                          f"give a folder"),
                         (read_only / "sweep", f"--out {read_only / 'sweep'} cannot be written "
                                               f"({read_only} is read-only); give another --out")):
        for launcher in (["--dry_run"], ["--launcher", "slurm"], []):
            with pytest.raises(SystemExit) as error:
                sweep.main(["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3",
                            "--heads", "baseline", "--out", str(out), *launcher])
            assert str(error.value) == f"sweep run: {message}"
    assert a_file.read_text() == "not a folder"


def test_table_and_plot_refuse_nonsense_in_a_csv_or_l0(tmp_path, capsys):
    header, *lines = REFERENCE.read_text().splitlines()
    first = lines[0].split(",")  # 16M,3e-04,baseline,,false,3.961,...
    columns = header.split(",")
    for column, value, rule in (("lr", "0", "a finite number > 0"),
                                ("lr", "nan", "a finite number > 0"),
                                ("lr", "-3e-4", "a finite number > 0"),
                                ("test_loss", "-0.5", "≥ 0 (a cross-entropy; NaN or empty if "
                                                      "diverged)"),
                                ("train_time_s", "-1", "≥ 0")):
        row = list(first)
        row[columns.index(column)] = value
        bad = tmp_path / "bad.csv"
        bad.write_text("\n".join([header, *lines[1:5], ",".join(row)]) + "\n")
        for command in ("table", "plot"):
            with pytest.raises(SystemExit) as error:
                sweep.main([command, str(bad)])
            assert str(error.value) == (f"sweep {command}: {bad} line 6: {column} is {value}, "
                                        f"but it must be {rule}")
    # Python's own words used to leak: "could not convert string to float", "invalid literal
    # for int() with base 10"
    for column, value, message in (("lr", "fast", "expected a number, got 'fast'"),
                                   ("seed", "1.5", "seed is 1.5, but it must be an integer >= 0")):
        with_seed = [f"{header},seed", *(f"{line},0" for line in lines[1:5])]
        row = first + ["0"]
        row[(columns + ["seed"]).index(column)] = value
        bad.write_text("\n".join([*with_seed, ",".join(row)]) + "\n")
        with pytest.raises(SystemExit) as error:
            sweep.main(["table", str(bad)])
        assert str(error.value) == f"sweep table: {bad} line 6: {message}"
    for l0 in ("-1", "nan", "0"):
        with pytest.raises(SystemExit):
            sweep.main(["table", str(REFERENCE), "--l0", l0, "--out", str(tmp_path)])
        assert f"argument --l0: {l0} is invalid; give a finite number > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        sweep.main(["table", str(tmp_path)])
    assert str(error.value) == (f"sweep table: {tmp_path} is a folder; give the results CSV in it "
                                f"({tmp_path / 'results.csv'}, made by `python sweep.py collect "
                                f"{tmp_path}`)")
    assert not list(tmp_path.glob("table.*")) and not list(tmp_path.glob("*.png"))


def test_a_pipe_or_device_is_refused_not_read(tmp_path):
    """A FIFO used to block `sweep.py table` (or a run folder's config.json `sweep.py run`)
    forever; /dev/null was read as a CSV."""
    with pytest.raises(SystemExit, match="^sweep table: /dev/null is not a regular file"):
        sweep.main(["table", "/dev/null"])
    os.mkfifo(tmp_path / "fifo")
    done = subprocess.run([sys.executable, str(ROOT / "sweep.py"), "table", "fifo"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("sweep table: fifo is not a regular "
                                                           "file (a device or a pipe)")
    run = tmp_path / "sweep" / "tiny_baseline_lr0.001_tie0"  # a run whose config.json is a pipe
    run.mkdir(parents=True)
    os.mkfifo(run / "config.json")
    done = subprocess.run([sys.executable, str(ROOT / "sweep.py"), "run", "--grid", "custom",
                           "--sizes", "tiny", "--heads", "baseline", "--lrs", "1e-3", "--out",
                           str(run.parent), "--dry_run"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "tie0: a config.json that is not a JSON object)" in done.stderr
    os.symlink("/dev/null", run / "log.jsonl")  # was "… log.jsonl does not exist"
    with pytest.raises(SystemExit, match=f"^sweep curves: {run / 'log.jsonl'} is not a regular "
                                         f"file \\(a device or a pipe\\)"):
        sweep.main(["curves", str(run), "--out", str(tmp_path / "fig")])


def test_dry_run_into_a_closed_pipe_ends_quietly(tmp_path):
    """`sweep.py run --dry_run | head` used to end in a BrokenPipeError traceback."""
    command = [sys.executable, str(ROOT / "sweep.py"), "run", "--grid", "paper", "--seeds", "0",
               "1", "2", "--out", str(tmp_path), "--dry_run"]  # 1050 lines: more than a pipe holds
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"sweep: 1050 runs in the grid, 0 finished")
    proc.stdout.close()  # what head does after its lines
    assert proc.stderr.read() == b"" and proc.wait() == 128 + signal.SIGPIPE


def test_an_interrupt_outside_the_runs_ends_in_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the table is being made
    monkeypatch.setattr(report, "read_results", interrupted)
    assert sweep.main(["table", str(REFERENCE)]) == 130
    assert capsys.readouterr().err == "sweep table: interrupted\n"


# ---- run folders made by hand -----------------------------------------------------------------

def write_run(root, size, head, lr, val_loss, init_loss=10.8, diverged=False, lam=None,
              time_s=100.0, **settings):
    """A finished run folder as train.py leaves it: config.json (its settings, `settings` the
    options passed on to it) and summary.json."""
    folder = root / sweep.Run(size, head, lr, False, lam).name
    folder.mkdir(parents=True)
    config = {"size": size, "head": head, "lr": lr, "tie": False, "lam": lam, "cap": None,
              "steps": 50, "device": "cpu", **settings}
    (folder / "config.json").write_text(json.dumps(config))
    logits = dict(logit_mean=-150 * lr, logit_std=2.0, logit_absmax=9.0 + lr, log2Z=40.0)
    summary = {"head": head, "size": size, "lr": lr, "tie": False, "lam": lam, "cap": None,
               "steps": 50, "tokens": 6400, "val_loss": None if diverged else val_loss,
               "diverged": diverged, "init_loss": init_loss,
               **{k: None if diverged else v for k, v in logits.items()},
               "mu_norm": 0.0 if head == "mu_center" else 300 * lr, "train_time_s": time_s}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.fixture
def hand_made_runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "tiny", "baseline", 1e-3, 6.0, init_loss=10.9)
    write_run(root, "tiny", "baseline", 1e-2, 5.5, init_loss=10.7)
    write_run(root, "tiny", "baseline", 1e-1, None, init_loss=10.8, diverged=True, time_s=20.0)
    write_run(root, "tiny", "mu_center", 1e-3, 6.1, time_s=103.0)
    write_run(root, "tiny", "mu_center", 1e-2, 5.6, time_s=105.0)
    write_run(root, "tiny", "mu_center", 1e-1, 5.9, time_s=104.0)
    (root / "tiny_mu_center_lr1_tie0").mkdir()  # a run that never finished: no summary.json
    return root


def test_collect_writes_one_row_per_finished_run(hand_made_runs):
    assert sweep.main(["collect", str(hand_made_runs)]) == 0
    with open(hand_made_runs / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == sweep.RESULT_COLUMNS
    by_run = {r["run"]: r for r in rows}
    assert len(rows) == 6 and "tiny_mu_center_lr1_tie0" not in by_run
    diverged = by_run["tiny_baseline_lr0.1_tie0"]
    assert (diverged["diverged"], diverged["test_loss"], diverged["logit_std"]) == ("true", "", "")
    best = by_run["tiny_baseline_lr0.01_tie0"]
    assert [float(best[k]) for k in ("lr", "test_loss", "init_loss")] == [1e-2, 5.5, 10.7]
    assert [best[k] for k in ("size", "head", "tie", "lam", "diverged")] == [
        "tiny", "baseline", "false", "", "false"]
    assert float(best["mean_log2Z"]) == 40.0 and float(best["mu_norm"]) == 300 * 1e-2
    assert not list(hand_made_runs.glob(".*tmp*"))  # the temp file was renamed, not left behind


def test_collect_refuses_a_summary_that_is_not_train_pys(hand_made_runs):
    (hand_made_runs / "tiny_mu_center_lr1_tie0" / "summary.json").write_text("{\"val_loss\": ")
    with pytest.raises(SystemExit) as error:
        sweep.main(["collect", str(hand_made_runs)])
    assert str(error.value) == (f"sweep collect: {hand_made_runs}/tiny_mu_center_lr1_tie0/summary"
                                f".json is not a JSON object; it was not written by this "
                                f"project's train.py")
    assert not (hand_made_runs / "results.csv").exists()


def test_table_of_hand_made_runs(hand_made_runs):
    sweep.main(["collect", str(hand_made_runs)])
    assert sweep.main(["table", str(hand_made_runs / "results.csv"), "--out",
                       str(hand_made_runs)]) == 0
    rows = table_rows(hand_made_runs)
    base, centred = rows[("tiny", "baseline", None)], rows[("tiny", "mu_center", None)]
    # baseline: capped losses 6.0, 5.5, L₀ = 10.8 (its own init_loss, diverged) -> best 5.5
    assert float(base["optimal_loss"]) == 5.5 and float(base["best_lr"]) == 1e-2
    assert float(base["lrs"]) == pytest.approx((0.5 + 0.0 + 5.3) / 2, rel=1e-12)
    assert float(centred["lrs"]) == pytest.approx((0.5 + 0.0 + 0.3) / 2, rel=1e-12)
    # time: mean over runs that did not diverge, 104 s vs the baseline's 100 s
    assert float(centred["extra_time"]) == pytest.approx(0.04, rel=1e-12)
    assert float(base["extra_time"]) == 0.0
    markdown = (hand_made_runs / "table.md").read_text()
    assert "| tiny | 2.900 | **0.400** |" in markdown and "| tiny | 0.0% | 4.0% |" in markdown


def test_plot_writes_png_and_pdf_beside_the_paper(hand_made_runs, tmp_path):
    sweep.main(["collect", str(hand_made_runs)])
    reference = tmp_path / "paper_16M.csv"  # one size of the paper keeps the figure quick to draw
    lines = REFERENCE.read_text().splitlines(True)
    reference.write_text(lines[0] + "".join(line for line in lines if line.startswith("16M,")))
    out = tmp_path / "figures"
    assert sweep.main(["plot", str(hand_made_runs / "results.csv"), "--reference", str(reference),
                       "--out", str(out)]) == 0
    for stem in ("fig2_loss_lrs_untied", "fig3_logits_untied"):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
    assert not list(out.glob(".*"))


PROXY = ROOT / "experiments" / "proxy" / "results" / "results.csv"


def legend_clear_of_panels(fig):
    """Whether the figure has one legend, no panel has its own, and it overlaps no panel."""
    fig.canvas.draw()
    boxes = [ax.get_window_extent() for ax in fig.axes if ax.get_visible()]
    [legend] = fig.legends
    return (not any(ax.get_legend() for ax in fig.axes)
            and not any(legend.get_window_extent().overlaps(box) for box in boxes))


def tick_labels(ax):
    """The y tick labels inside the panel's view."""
    low, high = ax.get_ylim()
    return [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high
            and t.get_text()]


def drawn_figures(csv_path, draw=False):
    """{stem: what its panels hold} for report.figures of a results CSV, read as they are drawn
    (each figure is closed when the next is asked for); draw: check the legend too."""
    columns = report.TABLE_COLUMNS + tuple(name for name, _ in report.METRICS)
    cells = report.reduce_runs(report.read_results(csv_path, columns=columns))
    drawn = {}
    for stem, fig in report.figures(cells):
        drawn[stem] = {"size": tuple(fig.get_size_inches()), "title": fig.get_suptitle(),
                       "legend_clear": legend_clear_of_panels(fig) if draw else None, "axes": [
            {"title": ax.get_title(), "yscale": ax.get_yscale(), "xlabel": ax.get_xlabel(),
             "ylabel": ax.get_ylabel(), "ylim": ax.get_ylim(),
             "marks": [(t.get_text(), t.xy) for t in ax.texts if hasattr(t, "xy")],
             "styles": {line.get_linestyle() for line in ax.get_lines()}}
            for ax in fig.axes if ax.get_visible()]}
    return drawn, cells


def test_lrs_joins_model_sizes_by_lines_and_shows_settings_columns_as_markers():
    proxy = drawn_figures(PROXY)[0]["fig2_loss_lrs_untied"]["axes"][-1]  # tiny bf16/seed1/float32
    assert proxy["xlabel"] == "runs (size, dtype, seed)" and proxy["styles"] == {"None"}
    paper = drawn_figures(REFERENCE)[0]["fig2_loss_lrs_untied"]["axes"][-1]  # 16M … 221M
    assert paper["xlabel"] == "model size N" and paper["styles"] == {"-"}


def test_logit_figures_give_a_metric_one_scale_and_one_column_a_grid_not_a_strip():
    drawn = drawn_figures(PROXY)[0]
    untied = drawn["fig3_logits_untied"]["axes"]   # rows = metrics, 3 columns
    mu_row = untied[6:9]                           # ‖μ‖: the seed-1 column too stays symlog
    assert [ax["yscale"] for ax in mu_row] == ["symlog"] * 3
    width, height = drawn["fig3_logits_tied"]["size"]  # one column: 7 metrics in 2 rows
    assert width > height and len(drawn["fig3_logits_tied"]["axes"]) == 7
    assert all(ax["ylabel"] for ax in untied) and "CE gap" not in str(untied)
    assert untied[1]["title"].startswith("tiny bfloat16 seed1\n(only baseline and mu_center run)")


def test_loss_figure_marks_the_points_beyond_its_axis_and_says_why_a_column_is_short():
    """Soft-cap at η = 1 ends at L₀, far above the zoom on the optimum: it used to leave the
    panel unmarked; the seed-1 panel showed two heads without a word."""
    drawn, cells = drawn_figures(PROXY, draw=True)
    figure = drawn["fig2_loss_lrs_untied"]
    assert figure["legend_clear"] and drawn["fig3_logits_untied"]["legend_clear"]
    bf16, seed1, float32 = figure["axes"][:3]
    assert seed1["title"] == "tiny bfloat16 seed1\n(only baseline and mu_center run)"
    assert bf16["title"] == "tiny bfloat16" and bf16["ylabel"] and seed1["ylabel"]
    for ax, column in ((bf16, "tiny bfloat16"), (float32, "tiny float32")):
        [soft_cap] = [c for c in cells if c.size == column and c.head == "soft_cap" and not c.tie]
        beyond = [(f"{loss:.2f}", (lr, ax["ylim"][1])) for lr, loss in zip(soft_cap.lrs,
                  soft_cap.losses) if loss > ax["ylim"][1]]
        assert beyond and ax["marks"] == beyond and beyond[0][1][0] == 1.0
    assert seed1["marks"] == []


def write_curve_run(folder, head, seed, val_steps=(30,)):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"head": head, "seed": seed, "lr": 1.0,
                                                    "size": "tiny", "tie": False}))
    records = [{"step": step, "loss": 7 - step / 10, "mu_norm": 0.0 if head == "mu_center"
                else step * 2.0, "logit_absmax": 60 - step * 1.8,  # 6 … 58: within one decade
                **({"val_loss": 6.5} if step in val_steps else {})} for step in range(1, 31)]
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_curves_colour_by_head_name_what_differs_and_mark_a_single_point(tmp_path):
    runs = {(head, seed): write_curve_run(tmp_path / f"{head}{seed}", head, seed)
            for head in ("baseline", "mu_center") for seed in (0, 1)}
    logs = {str(run): sweep.read_log(run) for run in runs.values()}
    configs = {str(run): sweep.json_object(run / "config.json") for run in runs.values()}
    fig = report.curves_figure(logs, configs)
    loss, val, mu, absmax = (ax for ax in fig.axes if ax.get_visible())
    titles = dict(report.CURVES)  # panels no run logged: gone
    assert [ax.get_title() for ax in (loss, val, mu, absmax)] == [
        titles[key] for key in ("loss", "val_loss", "mu_norm", "logit_absmax")]
    labels = {line.get_label(): line for line in loss.get_lines()}
    assert sorted(labels) == ["baseline, seed 0", "baseline, seed 1", "mu_center, seed 0",
                              "mu_center, seed 1"]
    assert labels["baseline, seed 0"].get_color() == labels["baseline, seed 1"].get_color() \
        == report.HEAD_COLORS["baseline"]
    assert labels["baseline, seed 0"].get_linestyle() != labels["baseline, seed 1"].get_linestyle()
    assert {line.get_marker() for line in val.get_lines()} == {"o"}   # one point each: visible
    assert {line.get_marker() for line in loss.get_lines()} == {"None"}
    assert mu.get_yscale() == absmax.get_yscale() == "symlog"
    out = tmp_path / "figures"
    assert sweep.main(["curves", *map(str, runs.values()), "--out", str(out), "--name", "c"]) == 0
    assert (out / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_curves_say_what_they_show(tmp_path):
    """curves_*.png had no title, no y labels, the legend inside one panel, "CE gap", and a log
    axis within one decade (max |l| from 6 to 58) showed the single label 10."""
    runs = [write_curve_run(tmp_path / head, head, 0) for head in ("baseline", "mu_center")]
    logs = {str(run): sweep.read_log(run) for run in runs}
    configs = {str(run): sweep.json_object(run / "config.json") for run in runs}
    fig = report.curves_figure(logs, configs)
    assert fig.get_suptitle() == "baseline vs mu_center: tiny model, η = 1.0, untied, seed 0"
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert all(ax.get_ylabel() for ax in panels) and legend_clear_of_panels(fig)
    assert [label.get_text() for label in fig.legends[0].get_texts()] == ["baseline",
                                                                        "mu_center"]
    absmax = panels[-1]
    assert absmax.get_title() == "largest |logit|" and tick_labels(absmax) == ["10", "20", "50"]
    assert all(len(tick_labels(ax)) > 1 for ax in panels if ax.get_yscale() != "linear")
    assert "CE gap" not in str(report.CURVES) + str(report.PRECISION_METRICS)


@pytest.mark.parametrize("log, problem", [
    ("", "is empty: the run has not logged a step yet"),
    ('{"step": 1, "lr": 0.1}\n', "is not a log of train.py (a line is not a JSON object with "
                                  "'step' and 'loss')"),
    ("[1, 2]\n", "is not a log of train.py (a line is not a JSON object with 'step' and 'loss')"),
    ("{oops\n", "is not a log of train.py (a line is not JSON)")])
def test_curves_refuse_a_log_that_is_not_one_in_one_sentence(tmp_path, log, problem):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text(log)
    with pytest.raises(SystemExit) as error:
        sweep.main(["curves", str(run), "--out", str(tmp_path / "figures")])
    assert str(error.value).startswith(f"sweep curves: {run / 'log.jsonl'} {problem}")
    assert not (tmp_path / "figures").exists()


def test_table_prints_and_writes_files_only_where_out_says(tmp_path, capsys):
    csv_copy = tmp_path / "runs.csv"
    csv_copy.write_bytes(REFERENCE.read_bytes())
    assert sweep.main(["table", str(csv_copy)]) == 0
    printed = capsys.readouterr().out
    assert "(i) Optimal loss" in printed
    assert printed.endswith("sweep: pass --out DIR to write table.md and table.csv\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]


def test_a_dry_run_says_when_its_data_does_not_exist_yet(tmp_path, capsys):
    dry_run(tmp_path / "runs", "--data", str(tmp_path / "text.txt"), str(tmp_path / "no"))
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"sweep: note: --data {tmp_path / 'text.txt'} {tmp_path / 'no'} does not exist yet; the "
        f"runs fail until it does (make it with prepare.py)")
    (tmp_path / "shards").mkdir()
    dry_run(tmp_path / "runs", "--data", str(tmp_path / "shards"))
    assert "note" not in capsys.readouterr().out


# ---- finished runs count only with the settings asked ----------------------------------------

def dry_run(out, *train_args, lrs=("1e-3",)):
    """The first line of a dry run of one tiny baseline run per learning rate, in out."""
    argv = ["run", "--grid", "custom", "--sizes", "tiny", "--heads", "baseline", "--lrs", *lrs,
            "--out", str(out), "--dry_run", *train_args]
    return sweep.main(argv)


def test_a_finished_run_of_other_settings_is_refused_not_reused(tmp_path, capsys):
    """Rerunning a finished sweep with other --steps/--seq_len used to report '1 finished, 0 to
    do' and keep the old result."""
    write_run(tmp_path, "tiny", "baseline", 1e-3, 6.0, steps=50, seq_len=32, data="shards",
              compile=False)
    assert dry_run(tmp_path, "--steps", "50", "--seq_len", "32", "--data", "./shards/") == 0
    assert "1 runs in the grid, 1 finished, 0 to do" in capsys.readouterr().out
    # when it logs, saves or stops does not change the result; "auto" is what train.py resolves
    assert dry_run(tmp_path, "--steps=50", "--log_every", "7", "--save_every", "9",
                   "--device", "auto") == 0
    assert "1 finished, 0 to do" in capsys.readouterr().out
    with pytest.raises(SystemExit) as error:
        dry_run(tmp_path, "--steps", "60", "--seq_len", "32", "--steps", "70", "--seq_len", "64")
    assert str(error.value) == (
        f"sweep run: 1 run folder(s) in {tmp_path} hold runs of other settings than asked (e.g. "
        f"tiny_baseline_lr0.001_tie0: steps 50 there, 70 asked; seq_len 32 there, 64 asked), so "
        f"they cannot count as finished; give another --out for these settings, or move those "
        f"folders away to redo them")
    for other in (["--device", "cuda"], ["--data", "other"], ["--compile"]):
        with pytest.raises(SystemExit, match="1 run folder"):
            dry_run(tmp_path, *other)
    (tmp_path / "tiny_baseline_lr0.001_tie0" / "config.json").unlink()  # not train.py's folder
    with pytest.raises(SystemExit, match="tie0: no config.json beside its summary.json\\)"):
        dry_run(tmp_path)


def test_the_proxy_sweeps_finished_runs_stay_finished(tmp_path, capsys):
    """tests/data/proxy_config.json is the config.json train.py wrote for a run of the proxy
    grid (numbers as JSON numbers, --dtype and --data as given): the same grid finds it."""
    folder = tmp_path / "tiny_baseline_lr0.03_tie0_float32_seed0"
    folder.mkdir()
    (folder / "config.json").write_bytes((REFERENCE.parent / "proxy_config.json").read_bytes())
    (folder / "summary.json").write_text("{}")
    argv = ["run", "--grid", "proxy", "--heads", "baseline", "--tie", "false", "--lrs", "0.03",
            "--dtypes", "float32", "--out", str(tmp_path), "--dry_run"]
    assert sweep.main(argv) == 0
    assert capsys.readouterr().out == "sweep: 1 runs in the grid, 1 finished, 0 to do\n"
    with pytest.raises(SystemExit, match=r"float32_seed0: eval_tokens 8192 there, 4096 asked\)"):
        sweep.main(argv + ["--eval_tokens", "4096"])


def test_a_sweep_on_text_files_counts_its_finished_runs(tmp_path, capsys):
    """train.py records text files given as --data under "text" and its tokenized cache folder
    under "data"; the same command used to refuse every finished run ("data data/text/… there,
    tests/assets/… asked"), so a sweep cut off by a time limit could not be continued."""
    other = tmp_path / "other.txt"
    other.write_text("other text")
    write_run(tmp_path, "tiny", "baseline", 1e-3, 6.0, data="data/text/paradise_regained-76141c",
              text=[str(TEXT)])
    assert dry_run(tmp_path, "--data", str(TEXT)) == 0
    assert "1 runs in the grid, 1 finished, 0 to do" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="1 run folder.*tie0: data .*paradise_regained.txt.* "
                                         "there, .*other.txt.* asked\\)"):
        dry_run(tmp_path, "--data", str(TEXT), str(other))
    with pytest.raises(SystemExit, match="1 run folder"):
        dry_run(tmp_path, "--data", str(tmp_path))  # a folder of shards is another dataset


def test_every_distinct_value_gets_its_own_folder(tmp_path, capsys):
    """--lrs 1e-3 1.0000001e-3 used to map both runs to lr0.001 and train only one."""
    runs = sweep.expand_grid("custom", sizes=["tiny"], lrs=[1e-3, 1.0000001e-3, 1 / 3],
                             heads=["z_loss"], lams=[1e-4, 1.00000001e-4])
    assert sorted(run.name for run in runs) == sorted(
        f"tiny_z_loss_lr{lr}_tie0_lam{lam}" for lr in ("0.001", "0.0010000001", "0.3333333333333333") for lam in ("0.0001", "0.000100000001"))
    assert all(float(sweep.short(x)) == x for x in (1 / 3, 0.1 + 0.2, 3e-4, 1e2, 5e-324))
    assert [sweep.short(x) for x in (3e-4, 1e-7, 1e2, 1.0, 30.0)] == [
        f"{x:g}" for x in (3e-4, 1e-7, 1e2, 1.0, 30.0)]  # where :g is exact, names stay as they were
    write_run(tmp_path, "tiny", "baseline", 1e-3, 6.0)
    assert dry_run(tmp_path, lrs=("1e-3", "1.0000001e-3")) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "sweep: 2 runs in the grid, 1 finished, 1 to do"
    assert printed[1].endswith(f"--out_dir {tmp_path / 'tiny_baseline_lr0.0010000001_tie0'}")


# ---- SLURM ------------------------------------------------------------------------------------

def fake_slurm_bin(folder, sinfo="cpu* (null)"):
    """Stand-ins: srun writes its arguments, one per line; sinfo lists partitions and their GRES;
    sbatch checks (--test-only) and queues job 42, or refuses a partition named nosuch."""
    folder.mkdir()
    scripts = {"srun": '#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n',
               # a long node list: `| head -n 1` would exit first and scontrol die of SIGPIPE
               "scontrol": "#!/bin/sh\necho node-a\nprintf 'node-%s\\n' $(seq 100000)\n",
               "sinfo": f"#!/bin/sh\necho '{sinfo}'\n",
               "sbatch": "#!/bin/sh\nif grep -q partition=nosuch \"$2\"; then echo 'sbatch: error: "
                         "Batch job submission failed: Invalid partition name specified' >&2; "
                         "exit 1; fi\n[ \"$1\" = --test-only ] || echo '42;cluster'\n"}
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def test_slurm_script_is_an_array_of_one_launcher_per_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    write_run(out, "16M", "baseline", 1e-3, 3.9, steps=2000, data="my data")  # finished
    argv = ["run", "--grid", "custom", "--sizes", "16M", "29M", "--lrs", "1e-3", "1e-2",
            "--heads", "baseline", "mu_loss", "--lams", "0.1", "--out", str(out),
            "--launcher", "slurm", "--nproc_per_node", "4",
            "--sbatch", "partition=gpu", "time=1-00:00:00", "--steps", "2000", "--data", "my data"]
    bin_dir = fake_slurm_bin(tmp_path / "bin", sinfo="cpu* (null)\ngpu gpu:4(S:0)")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert sweep.main(argv) == 0
    [script] = (out / "slurm").glob("sweep_*.sbatch")
    [run_list] = (out / "slurm").glob("runs_*.txt")
    text = script.read_text()
    lines = run_list.read_text().splitlines()
    assert len(lines) == 7  # 2 sizes × 2 heads × 2 lrs, less the finished one
    assert "#SBATCH --array=0-6\n" in text and "#SBATCH --gpus-per-node=4\n" in text
    assert "#SBATCH --partition=gpu\n" in text and "#SBATCH --time=1-00:00:00\n" in text
    assert f"RUN_LIST={run_list}" in text and "--nproc_per_node=4" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert not any("16M_baseline_lr0.001_tie0" in line for line in lines)
    # run array task 1 on one node, then on two: it must launch line 1, resuming its ckpt.pt
    task_dir = Path(lines[1].split()[0])
    task_dir.mkdir()
    (task_dir / "ckpt.pt").write_bytes(b"")
    train_args = [str(sweep.TRAIN_PY), "--size", "16M", "--head", "mu_loss", "--lr", "0.001",
                  "--lam", "0.1", "--steps", "2000", "--data", "my data", "--out_dir",
                  str(task_dir), "--resume"]
    launcher = ["--ntasks-per-node=1", sys.executable, "-m", "torch.distributed.run"]
    for nodes in ("1", "2"):
        env = dict(os.environ, SLURM_ARRAY_TASK_ID="1", SLURM_JOB_ID="9", SLURM_JOB_NUM_NODES=nodes,
                   SLURM_JOB_NODELIST="node-[a-b]", SRUN_ARGS=str(tmp_path / "args"))
        subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)
        args = (tmp_path / "args").read_text().splitlines()
        rendezvous = args[len(launcher):-len(train_args) - 1]  # before --nproc_per_node
        assert args[:len(launcher)] == launcher and args[-len(train_args) - 1:] == [
            "--nproc_per_node=4", *train_args]
        if nodes == "1":  # a rendezvous of its own: no port another job could share
            assert rendezvous == ["--standalone"]
        else:  # c10d on the first node, on a port free there when the task began
            assert rendezvous[:3] == ["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_id=9"]
            assert re.fullmatch(r"--rdzv_endpoint=node-a:\d+", rendezvous[3])
    # no GPUs where the partition has none, or where --sbatch names them itself; a bare KEY
    for partition, gpus in (("cpu", []), ("gpu", ["gres=gpu:a100:4"])):
        assert sweep.main(argv[:-7] + ["--sbatch", f"partition={partition}", *gpus,
                                       "exclusive", "comment=a b"]) == 0
        newest = max((out / "slurm").glob("sweep_*.sbatch"))  # STAMP: the time it was written
        assert "#SBATCH --exclusive\n#SBATCH --comment='a b'\n" in newest.read_text()
        asked = {line for line in newest.read_text().splitlines() if "gpu" in line}
        assert asked == {f"#SBATCH --{option}" for option in gpus} | (
            {"#SBATCH --partition=gpu"} if partition == "gpu" else set())
    capsys.readouterr()
    # --submit: sbatch's job id, or its refusal in one sentence
    assert sweep.main(argv + ["--submit"]) == 0
    assert "sweep: submitted job 42; its tasks write to " in capsys.readouterr().out
    with pytest.raises(SystemExit) as error:
        sweep.main(argv[:-7] + ["--sbatch", "partition=nosuch", "--submit"])
    assert str(error.value) == ("sweep run: sbatch refused the job (Batch job submission failed: "
                                "Invalid partition name specified), so nothing was submitted; "
                                "change --sbatch, --nodes or --nproc_per_node to what the cluster "
                                "offers (sinfo lists its partitions)")
    # --submit needs sbatch; without it the message says what to run instead
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="sbatch was not found on PATH, so nothing was "
                                         "submitted; on a SLURM login node run: sbatch "
                                         ".*sweep_.*\\.sbatch"):
        sweep.main(argv + ["--submit"])


def test_local_commands_resume_and_pin_gpus(tmp_path, capsys):
    out = tmp_path / "sweep"
    write_run(out, "tiny", "baseline", 1e-3, 6.0)
    interrupted = out / "tiny_baseline_lr0.01_tie0"
    interrupted.mkdir()
    (interrupted / "ckpt.pt").write_bytes(b"")
    argv = ["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "1e-2", "1e-1",
            "--heads", "baseline", "--out", str(out), "--dry_run", "--device", "cpu"]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "sweep: 3 runs in the grid, 1 finished, 2 to do"
    assert printed[1].endswith(f"--out_dir {interrupted} --device cpu --resume")
    assert printed[2].endswith(f"--out_dir {out / 'tiny_baseline_lr0.1_tie0'} --device cpu")
    killed_early = out / "tiny_baseline_lr0.1_tie0"  # killed before its first checkpoint
    killed_early.mkdir()
    (killed_early / "config.json").write_text("{}")
    assert sweep.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("--device cpu --resume")
    assert sweep.main(argv + ["--nproc_per_node", "2"]) == 0
    assert " -m torch.distributed.run --standalone --nproc_per_node=2 " in capsys.readouterr().out
    assert sweep.gpu_slots("0,1,2,3", 2) == ["0,1", "2,3"] and sweep.gpu_slots(None, 1) == [None]
    assert sweep.gpu_slots("4,5,6", 1) == ["4", "5", "6"]


FAKE_TRAIN = """import json, pathlib, sys
args = sys.argv[1:]
if "--bogus" in args:  # what argparse does with an unknown option
    print("train.py: error: unrecognized arguments: --bogus", file=sys.stderr)
    sys.exit(2)
if float(args[args.index("--lr") + 1]) > 0.05:
    sys.exit(1)  # a crash: no summary.json
out = pathlib.Path(args[args.index("--out_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
options = [i for i, arg in enumerate(args) if arg.startswith("--")]
config = {args[i][2:]: True if i + 1 in options + [len(args)] else args[i + 1] for i in options}
(out / "config.json").write_text(json.dumps(config))  # values as text, flags true
(out / "summary.json").write_text(json.dumps(args))
"""


def test_local_launcher_reports_failures_and_stops_on_bad_options(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "train.py"  # stands in for train.py: quick, and fails on demand
    fake.write_text(FAKE_TRAIN)
    monkeypatch.setattr(sweep, "TRAIN_PY", fake)
    out = tmp_path / "sweep"
    argv = ["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "1e-1", "--heads",
            "baseline", "mu_center", "--out", str(out), "--gpus", "0,1"]
    assert sweep.main(argv) == 1
    printed = capsys.readouterr().out
    assert printed.count("sweep: done ") == 2 and printed.count("sweep: FAILED (exit 1) ") == 2
    assert ("2 runs failed (tiny_baseline_lr0.1_tie0, tiny_mu_center_lr0.1_tie0); run the same "
            "command again to retry them") in printed
    assert sorted(p.parent.name for p in out.glob("*/summary.json")) == [
        "tiny_baseline_lr0.001_tie0", "tiny_mu_center_lr0.001_tie0"]
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        f"{name}.log" for name in ("tiny_baseline_lr0.001_tie0", "tiny_baseline_lr0.1_tie0",
                                   "tiny_mu_center_lr0.001_tie0", "tiny_mu_center_lr0.1_tie0"))
    assert sweep.main(argv[:-2] + ["--bogus"]) == 1  # one slot: the first refusal stops the sweep
    printed = capsys.readouterr().out
    assert printed.count("sweep: start ") == 1
    assert "train.py refused its command line (see above); the other 1 runs were not started" in printed


# ---- a tiny sweep on CPU, end to end ----------------------------------------------------------

def started(output):
    """{run name: resumed?} for the runs a sweep started."""
    runs = {}
    for line in output.splitlines():
        if line.startswith("sweep: start "):
            words = line.split()
            runs[words[2]] = "(resume)" in words
    return runs


def test_tiny_sweep_is_interrupted_resumed_and_tabled(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two runs at once on two cores
    shards = tmp_path / "shards"
    subprocess.run([sys.executable, str(ROOT / "prepare.py"), "text", str(TEXT), "--out",
                    str(shards)], check=True, capture_output=True, env=env)
    out = tmp_path / "sweep"
    # --gpus 0,1: two runs at once, each with its own log file (CUDA_VISIBLE_DEVICES is moot on CPU)
    command = [sys.executable, str(ROOT / "sweep.py"), "run", "--grid", "custom",
               "--sizes", "tiny", "--lrs", "1e-3", "1e-2", "--heads", "baseline", "mu_center",
               "--out", str(out), "--gpus", "0,1",
               "--device", "cpu", "--data", str(shards), "--steps", "60", "--warmup", "2",
               "--batch_size", "2", "--micro_batch", "2", "--seq_len", "32",
               "--eval_tokens", "256", "--stat_tokens", "256", "--log_every", "1",
               "--save_every", "5"]  # early checkpoints: something to resume
    # A run holds its first checkpoint for 55 of its 60 steps, so Ctrl-C reaches the sweep long
    # before that run ends, however loaded the machine (with 10 steps a busy machine let the
    # last runs finish between the check below and the signal: exit 0, not 130).
    grid = sweep.expand_grid("custom", sizes=["tiny"], lrs=[1e-3, 1e-2],
                             heads=["baseline", "mu_center"])
    names = [run.name for run in grid]

    def state():
        finished = [n for n in names if (out / n / "summary.json").exists()]
        midway = [n for n in names if (out / n / "ckpt.pt").exists() and n not in finished]
        return finished, midway

    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
    while first.poll() is None and not (state()[0] and state()[1]):
        time.sleep(0.02)
    assert first.poll() is None, "the sweep ended too soon:\n" + first.stdout.read()
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the sweep and its train.py runs
    output = first.communicate(timeout=60)[0]
    assert first.returncode == 130
    assert "sweep: interrupted; run the same command again to resume" in output
    finished, midway = state()
    summaries = {n: (out / n / "summary.json").read_bytes() for n in finished}
    mtimes = {n: (out / n / "summary.json").stat().st_mtime_ns for n in finished}

    second = subprocess.run(command, capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    done = len(finished)
    assert f"sweep: 4 runs in the grid, {done} finished, {4 - done} to do" in second.stdout
    restarted = started(second.stdout)
    assert set(restarted) == set(names) - set(finished)  # finished runs are not repeated
    assert all(restarted[n] for n in midway)  # runs with a checkpoint resume from it
    for n in finished:
        assert (out / n / "summary.json").read_bytes() == summaries[n]
        assert (out / n / "summary.json").stat().st_mtime_ns == mtimes[n]
    assert all((out / "logs" / f"{n}.log").exists() for n in restarted)
    third = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    assert "4 finished, 0 to do" in third.stdout and not started(third.stdout)
    with pytest.raises(SystemExit, match="4 run folder.* steps 60 there, 62 asked\\)"):
        sweep.main(command[2:] + ["--steps", "62", "--dry_run"])  # train.py's own config.json

    results_csv = str(out / "results.csv")
    for argv in (["collect", str(out)], ["table", results_csv, "--out", str(out)],
                 ["plot", results_csv]):
        assert sweep.main(argv) == 0
    with open(out / "results.csv", newline="") as f:
        results = list(csv.DictReader(f))
    assert sorted(r["run"] for r in results) == sorted(names)
    assert all(r["diverged"] == "false" for r in results)
    assert all(float(r["test_loss"]) < float(r["init_loss"]) for r in results)
    assert all(abs(float(r["init_loss"]) - math.log(50304)) < 0.5 for r in results)
    mu_center = [r for r in results if r["head"] == "mu_center"]
    assert all(float(r["mu_norm"]) < 1e-4 for r in mu_center)
    rows = table_rows(out)
    for head in ("baseline", "mu_center"):
        losses = [float(r["test_loss"]) for r in results if r["head"] == head]
        assert float(rows[("tiny", head, None)]["optimal_loss"]) == min(losses)
        assert float(rows[("tiny", head, None)]["lrs"]) == pytest.approx(max(losses) - min(losses),
                                                                         rel=1e-12)
    assert "| model size N | baseline | mu_center |" in (out / "table.md").read_text()
    for stem in ("fig2_loss_lrs_untied", "fig3_logits_untied"):
        assert (out / f"{stem}.png").stat().st_size > 10_000 and (out / f"{stem}.pdf").exists()


def test_time_is_not_published_where_the_same_work_took_unequal_times(tmp_path):
    """Table (iii): the runs of one cell do the same work at every η, so times further apart
    than TIME_SPREAD measure the machine (a shared CPU), not the head: 'n/c', said below."""
    path = tmp_path / "results.csv"
    path.write_text("size,lr,head,lam,tie,test_loss,train_time_s\n"
                    "tiny,0.01,baseline,,false,6.0,100\ntiny,0.1,baseline,,false,5.9,104\n"
                    "tiny,0.01,z_loss,0.0001,false,6.0,105\ntiny,0.1,z_loss,0.0001,false,5.9,107\n"
                    "tiny,0.01,mu_center,,false,6.0,60\ntiny,0.1,mu_center,,false,5.9,150\n")
    markdown = report.markdown_report(report.reduce_runs(report.read_results(path, l0=10.8)))
    assert "| tiny | 0.0% | 3.9% | n/c |" in markdown and report.NOT_COMPARABLE in markdown

"""sweep.py: the paper's tables from its published runs, the grids, the launchers (local and a
SLURM script, with stand-ins for train.py and sbatch), collect, the figures, and one small real
sweep on the CPU.

The published runs (tests/data/oec_untied_runs.csv, a copy of ../shared/reference) must give
back every number of the paper's Table 2 (i)/(ii) and Table 3 that they cover; the numbers below
are typed in from the paper, not from our output.
"""
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sweep

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "data" / "oec_untied_runs.csv"
PROXY = ROOT / "experiments" / "proxy" / "results" / "results.csv"
TEXT = ROOT / "tests" / "assets" / "paradise_regained.txt"
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
        assert sweep.main(["table", str(REFERENCE), "--out", str(out / mean), "--lrs_mean",
                           mean]) == 0
    return out


def test_reference_reproduces_table2(reference_tables):
    rows = table_rows(reference_tables / "published")
    for column, table in TABLE2.items():
        for size in SIZES:
            for head, expected in zip(TABLE2_HEADS, table[size]):
                row = rows[(size, head, 1e-4 if head in ("z_loss", "mu_loss") else None)]
                assert f"{float(row[column]):.{DIGITS[column]}f}" == expected, (column, size, head)
                assert row["tie"] == "false" and row["n_lrs"] == "7"


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
    assert "## z_loss for several λ, without weight tying" in markdown  # Table 3
    assert "| model size N | mu_loss λ=1e-07 | mu_loss λ=0.0001 | mu_loss λ=0.1 | mu_loss λ=100 |" \
        in markdown


def test_lrs_counts_diverged_and_worse_runs_as_l0():
    rows = [dict(tie=False, head="baseline", lam=None, cap=None, size="tiny", lr=lr, l0=10.0,
                 test_loss=loss, diverged=diverged, train_time_s=1.0)
            for lr, loss, diverged in ((1e-3, 3.0, False), (1e-2, 3.5, False),
                                       (1e-1, 12.0, False), (1.0, math.nan, True))]
    [cell] = sweep.reduce_runs(rows)
    assert cell["losses"] == [3.0, 3.5, 10.0, 10.0] and cell["best_lr"] == 1e-3
    assert cell["lrs"] == pytest.approx((0.5 + 7.0 + 7.0) / 3, rel=1e-15)
    assert sweep.reduce_runs(rows, "literal")[0]["lrs"] == pytest.approx(14.5 / 4, rel=1e-15)
    assert math.isnan(sweep.lr_sensitivity([3.0]))  # one learning rate: no sensitivity


def test_grids_have_the_papers_sizes_and_folder_names():
    paper = sweep.expand_grid("paper")
    assert len(paper) == 7 * 5 * 2 * 5
    assert {"16M_baseline_lr0.0003_tie0", "221M_z_loss_lr0.3_tie1_lam0.0001",
            "57M_soft_cap_lr0.01_tie0_cap30", "29M_mu_center_lr0.1_tie1"} <= set(paper)
    lam = sweep.expand_grid("lambda")
    assert len(lam) == 4 * 2 * 7 * 5 and not any(run["tie"] for run in lam.values())
    assert {run["lam"] for run in lam.values()} == {1e-7, 1e-4, 1e-1, 1e2}
    proxy = sweep.expand_grid("proxy")
    assert len(proxy) == 5 * 2 * (5 + 2)
    assert {run["head"] for run in proxy.values() if run["tie"]} == {"baseline", "mu_center"}
    narrowed = sweep.expand_grid("paper", sizes=["16M"], lrs=[1e-3], ties=[False])
    assert sorted(narrowed) == sorted(
        ["16M_baseline_lr0.001_tie0", "16M_soft_cap_lr0.001_tie0_cap30",
         "16M_z_loss_lr0.001_tie0_lam0.0001", "16M_mu_loss_lr0.001_tie0_lam0.0001",
         "16M_mu_center_lr0.001_tie0"])
    assert sweep.run_args(narrowed["16M_baseline_lr0.001_tie0"]) == [
        "--size", "16M", "--head", "baseline", "--lr", "0.001"]
    seeds = sweep.expand_grid("proxy", heads=["mu_center"], lrs=[0.3], ties=[True],
                              dtypes=["bfloat16"], seeds=[0, 1])
    assert list(seeds) == ["tiny_mu_center_lr0.3_tie1_bfloat16_seed0",
                           "tiny_mu_center_lr0.3_tie1_bfloat16_seed1"]
    assert sweep.run_args(seeds["tiny_mu_center_lr0.3_tie1_bfloat16_seed1"])[-5:] == [
        "--tie", "--dtype", "bfloat16", "--seed", "1"]


def test_every_distinct_value_gets_its_own_folder():
    """--lrs 1e-3 1.0000001e-3 must not map both runs to lr0.001 and train only one."""
    runs = sweep.expand_grid("custom", sizes=["tiny"], lrs=[1e-3, 1.0000001e-3, 1 / 3],
                             heads=["z_loss"], lams=[1e-4, 1.00000001e-4])
    assert sorted(runs) == sorted(f"tiny_z_loss_lr{lr}_tie0_lam{lam}"
                                  for lr in ("0.001", "0.0010000001", "0.3333333333333333")
                                  for lam in ("0.0001", "0.000100000001"))
    assert all(float(sweep.short(x)) == x for x in (1 / 3, 0.1 + 0.2, 3e-4, 1e2, 5e-324))


def dry_run(capsys, *argv):
    """The lines of a dry run: the count, then a command each."""
    assert sweep.main(["run", *argv, "--dry_run"]) == 0
    return capsys.readouterr().out.splitlines()


def test_dry_runs_give_train_py_the_grids_settings_then_the_users(tmp_path, capsys):
    """The paper's code draws each batch at random windows, by seed, so its grids pass
    --data_order random; the proxy keeps its committed runs' order; the user's options win."""
    def order(command):
        return [command[i + 1] for i, arg in enumerate(command) if arg == "--data_order"]
    out = ["--out", str(tmp_path)]
    paper = dry_run(capsys, "--grid", "paper", "--sizes", "16M", "--lrs", "1e-3", *out)
    assert paper[0] == "sweep: 10 runs in the grid, 0 finished, 10 to do"
    assert all(order(line.split()) == ["random"] for line in paper[1:])
    [proxy] = dry_run(capsys, "--grid", "proxy", "--heads", "baseline", "--lrs", "1", "--tie",
                      "false", "--dtypes", "float32", "--steps", "7", *out)[1:]
    command = proxy.split()
    assert order(command) == ["sequential"] and command[-2:] == ["--steps", "7"]
    assert command[command.index("--data") + 1] == "data/shakespeare"
    assert command[command.index("--steps") + 1] == "300"  # the grid's, overruled by the last
    [custom] = dry_run(capsys, "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "--heads",
                       "baseline", "--nproc_per_node", "2", *out)[1:]
    assert order(custom.split()) == [] and " -m torch.distributed.run --standalone " \
        "--nproc_per_node=2 " in custom


def test_finished_runs_are_skipped_and_started_ones_resumed(tmp_path, capsys):
    write_run(tmp_path, "tiny", "baseline", 1e-3, 6.0)  # finished
    (tmp_path / "tiny_baseline_lr0.01_tie0").mkdir()
    (tmp_path / "tiny_baseline_lr0.01_tie0" / "config.json").write_text("{}")  # killed early
    (tmp_path / "tiny_baseline_lr0.1_tie0").mkdir()  # empty: a fresh start
    printed = dry_run(capsys, "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "1e-2",
                      "1e-1", "--heads", "baseline", "--out", str(tmp_path))
    assert printed[0] == "sweep: 3 runs in the grid, 1 finished, 2 to do"
    assert printed[1].endswith(f"--out_dir {tmp_path / 'tiny_baseline_lr0.01_tie0'} --resume")
    assert printed[2].endswith(f"--out_dir {tmp_path / 'tiny_baseline_lr0.1_tie0'}")


def test_a_rerun_with_other_settings_refuses_the_finished_runs(tmp_path, capsys):
    """A finished run counts as done only if its config.json holds what the sweep passes it."""
    config = json.loads((ROOT / "tests" / "data" / "proxy_config.json").read_text())
    folder = tmp_path / "tiny_baseline_lr0.03_tie0_float32_seed0"  # a proxy run, as trained
    folder.mkdir()
    (folder / "summary.json").write_text("{}")
    (folder / "config.json").write_text(json.dumps(config))
    argv = ["--grid", "proxy", "--heads", "baseline", "--lrs", "0.03", "--tie", "false",
            "--dtypes", "float32", "--out", str(tmp_path)]
    assert dry_run(capsys, *argv) == ["sweep: 1 runs in the grid, 1 finished, 0 to do"]
    (folder / "config.json").write_text(json.dumps(config | dict(text=["a.txt"])))
    assert dry_run(capsys, *argv, "--data", "a.txt")[0].endswith("1 finished, 0 to do")
    for extra, message in ((["--steps=100"], "--steps 300, not 100"),
                           (["--data", "b.txt"], "--data ['a.txt'], not b.txt")):
        with pytest.raises(SystemExit) as error:
            sweep.main(["run", *argv, *extra, "--dry_run"])
        assert str(error.value) == (f"sweep run: {folder} holds a run of {message}; give another "
                                    f"--out or move it away")


@pytest.mark.parametrize("argv, message", [
    (["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "--out", "x"],
     "sweep run: --grid custom needs --heads"),
    (["run", "--grid", "paper", "--out", "x", "--lr", "1e-3"],
     "sweep run: --lr is set per run by the sweep; give the grid's axes instead"),
    (["collect", "x"], "sweep collect: no summary.json under"),
    (["table", "x"], "sweep table: [Errno 2] No such file or directory"),
])
def test_a_mistake_is_said_in_one_sentence(argv, message, tmp_path):
    with pytest.raises(SystemExit) as error:
        sweep.main([str(tmp_path / "x") if arg == "x" else arg for arg in argv])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("argv, words", [
    (["run", "--grid", "custom", "--out", "x", "--heads", "zloss"], "invalid choice: 'zloss'"),
    (["run", "--grid", "custom", "--out", "x", "--sizes", "huge"], "invalid choice: 'huge'"),
    (["table", "x.csv", "--lrs_m", "literal"], "unrecognized arguments: --lrs_m literal")])
def test_argparse_refuses_unknown_heads_sizes_and_abbreviations(argv, words, capsys):
    with pytest.raises(SystemExit):
        sweep.main(argv)
    assert words in capsys.readouterr().err


# ---- run folders made by hand -----------------------------------------------------------------

def write_run(root, size, head, lr, val_loss, init_loss=10.8, diverged=False, time_s=100.0,
              **config):
    """A finished run folder as train.py leaves it: config.json and summary.json."""
    folder = root / sweep.run_name(dict(size=size, head=head, lr=lr, tie=False, lam=None,
                                        cap=None, dtype=None, seed=None))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(
        {"size": size, "head": head, "lr": lr, "tie": False, "lam": None, "cap": None,
         "dtype": "float32", "seed": 0, **config}))
    logits = dict(logit_mean=-150 * lr, logit_std=2.0, logit_absmax=9.0 + lr, log2Z=40.0)
    (folder / "summary.json").write_text(json.dumps(
        {"head": head, "size": size, "lr": lr, "tie": False, "lam": None, "cap": None,
         "steps": 50, "tokens": 6400, "val_loss": None if diverged else val_loss,
         "diverged": diverged, "init_loss": init_loss,
         **{k: None if diverged else v for k, v in logits.items()},
         "mu_norm": 0.0 if head == "mu_center" else 300 * lr, "train_time_s": time_s}))
    return folder


@pytest.fixture
def collected(tmp_path):
    """Six hand-made runs, one diverged and one unfinished, collected into results.csv."""
    root = tmp_path / "runs"
    write_run(root, "tiny", "baseline", 1e-3, 6.0, init_loss=10.9)
    write_run(root, "tiny", "baseline", 1e-2, 5.5, init_loss=10.7)
    write_run(root, "tiny", "baseline", 1e-1, None, diverged=True, time_s=20.0)
    write_run(root, "tiny", "mu_center", 1e-3, 6.1, time_s=103.0)
    write_run(root, "tiny", "mu_center", 1e-2, 5.6, time_s=105.0)
    write_run(root, "tiny", "mu_center", 1e-1, 5.9, time_s=104.0)
    (root / "tiny_mu_center_lr1_tie0").mkdir()  # a run that never finished: no summary.json
    assert sweep.main(["collect", str(root)]) == 0
    return root


def test_collect_writes_one_row_per_finished_run(collected):
    with open(collected / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == sweep.RESULT_COLUMNS
    by_run = {r["run"]: r for r in rows}
    assert len(rows) == 6 and "tiny_mu_center_lr1_tie0" not in by_run
    diverged = by_run["tiny_baseline_lr0.1_tie0"]
    assert (diverged["diverged"], diverged["test_loss"], diverged["logit_std"]) == ("true", "", "")
    best = by_run["tiny_baseline_lr0.01_tie0"]
    assert [float(best[k]) for k in ("lr", "test_loss", "init_loss", "mean_log2Z")] == [
        1e-2, 5.5, 10.7, 40.0]
    assert [best[k] for k in ("size", "head", "tie", "lam", "dtype", "seed", "diverged")] == [
        "tiny", "baseline", "false", "", "float32", "0", "false"]  # dtype, seed: config.json's
    assert not list(collected.glob("*.tmp"))


def test_table_of_hand_made_runs(collected):
    assert sweep.main(["table", str(collected / "results.csv"), "--out", str(collected)]) == 0
    rows = table_rows(collected)
    base, centred = rows[("tiny", "baseline", None)], rows[("tiny", "mu_center", None)]
    # baseline: capped losses 6.0, 5.5, L₀ = 10.8 (its own init_loss, diverged) -> best 5.5
    assert float(base["optimal_loss"]) == 5.5 and float(base["best_lr"]) == 1e-2
    assert float(base["lrs"]) == pytest.approx((0.5 + 0.0 + 5.3) / 2, rel=1e-12)
    assert float(centred["lrs"]) == pytest.approx((0.5 + 0.0 + 0.3) / 2, rel=1e-12)
    # time: the mean over the runs that did not diverge, 104 s against the baseline's 100 s
    assert float(centred["extra_time"]) == pytest.approx(0.04, rel=1e-12)
    markdown = (collected / "table.md").read_text()
    assert "| tiny | 2.900 | **0.400** |" in markdown and "| tiny | 0.0% | 4.0% |" in markdown


def test_dtype_and_seed_name_the_columns_where_runs_differ(tmp_path):
    path = tmp_path / "results.csv"
    rows = [("tiny", d, s) for d in ("float32", "bfloat16") for s in ("0", "1")] + [
        ("16M", "float32", "0")]
    path.write_text("size,lr,head,tie,test_loss,init_loss,dtype,seed\n" + "".join(
        f"{size},0.01,baseline,false,6,10.8,{dtype},{seed}\n" for size, dtype, seed in rows))
    cells = sweep.reduce_runs(sweep.read_results(path))
    assert [c["size"] for c in cells] == ["tiny bfloat16", "tiny bfloat16 seed1", "tiny float32",
                                          "tiny float32 seed1", "16M float32"]
    path.write_text("size,lr,head,tie,test_loss,init_loss,dtype,seed\n"
                    "tiny,0.01,baseline,false,6,10.8,float32,0\n")
    assert sweep.read_results(path)[0]["size"] == "tiny"  # one setting: no label


# ---- figures ----------------------------------------------------------------------------------

def lrs_panel(fig):
    return next(ax for ax in fig.axes if ax.get_ylabel() == "LRS (↓)")


def test_fig2_labels_its_eta_ticks_and_lrs_panel_in_plain_words(collected):
    """A new user's Fig. 2: η tick labels overlapped (minor 2×10⁻³ …), and the LRS panel read
    'runs (size, dtype, seed)' over a single tick. Now a tick and a label per η swept; with one
    column, a tick per head."""
    assert sweep.main(["plot", str(collected / "results.csv")]) == 0
    assert (collected / "fig2_loss_lrs_untied.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (collected / "fig3_logits_untied.pdf").read_bytes()[:5] == b"%PDF-"
    cells = sweep.reduce_runs(sweep.read_results(collected / "results.csv"))
    fig = dict(sweep.figures(cells))["fig2_loss_lrs_untied"]
    fig.canvas.draw()
    loss = fig.axes[0]
    assert [t.get_text() for t in loss.get_xticklabels()] == ["0.001", "0.01", "0.1"]
    assert [t.get_text() for t in loss.get_xticklabels(minor=True)] == []
    boxes = [t.get_window_extent() for t in loss.get_xticklabels()]
    assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
    lrs = lrs_panel(fig)
    assert [t.get_text() for t in lrs.get_xticklabels()] == ["baseline", "mu_center"]
    assert lrs.get_title() == "LRS of each variant, tiny" and lrs.get_xlabel() == ""
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["baseline", "mu_center"]
    assert not any(ax.get_legend() for ax in fig.axes)


def test_fig2_keeps_a_line_under_another_visible():
    """Four heads of the published runs lie on each other at small η: each variant is drawn
    thinner than the one before, with its own hollow marker; model sizes are an axis."""
    cells = sweep.reduce_runs(sweep.read_results(REFERENCE))
    fig = dict(sweep.figures([c for c in cells if c["size"] in ("16M", "29M")]))[
        "fig2_loss_lrs_untied"]
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["baseline", "z_loss", "mu_loss", "mu_center"]
    widths = [line.get_linewidth() for line in lines]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 4
    assert len({line.get_marker() for line in lines}) == 4
    assert {line.get_markerfacecolor() for line in lines} == {"none"}
    lrs = lrs_panel(fig)
    assert lrs.get_xlabel() == "model size N"
    assert [t.get_text() for t in lrs.get_xticklabels()] == ["16M", "29M"]


def test_figures_of_the_proxy_settings_and_the_paper_dashed():
    """The proxy's columns are settings (dtype, seed): their LRS points stand apart, not joined;
    ‖μ‖'s panels share a symlog scale; --reference draws the paper's runs dashed."""
    cells = sweep.reduce_runs(sweep.read_results(PROXY))
    figures = dict(sweep.figures(cells))
    assert set(figures) == {f"fig{n}_{tying}" for n in ("2_loss_lrs", "3_logits")
                            for tying in ("tied", "untied")}
    lrs = lrs_panel(figures["fig2_loss_lrs_untied"])
    assert [t.get_text() for t in lrs.get_xticklabels()] == [
        "tiny bfloat16", "tiny bfloat16 seed1", "tiny float32"]
    assert {line.get_linestyle() for line in lrs.get_lines()} == {"None"}
    fig3 = figures["fig3_logits_untied"]
    assert [ax.get_yscale() for ax in fig3.axes if ax.get_ylabel() == "‖μ‖"] == ["symlog"] * 3
    paper = [dict(c, paper=True) for c in sweep.reduce_runs(sweep.read_results(REFERENCE))
             if c["size"] == "16M"]
    fig2 = next(sweep.figures(cells + paper))[1]
    dashed = [line for ax in fig2.axes for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed and all(line.get_label().endswith(" (paper)") for line in dashed)


def test_fig4_draws_a_colour_per_lambda():
    cells = [c for c in sweep.reduce_runs(sweep.read_results(REFERENCE)) if c["size"] == "16M"]
    figures = dict(sweep.figures(cells))
    assert set(figures) >= {"fig4_lambda_z_loss_untied", "fig4_lambda_mu_loss_untied"}
    lines = figures["fig4_lambda_z_loss_untied"].axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["λ=1e-07", "λ=0.0001", "λ=0.1", "λ=100"]
    assert len({line.get_color() for line in lines}) == 4


def write_curve_run(folder, head, seed):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"head": head, "seed": seed}))
    records = [{"step": step, "loss": 7 - step / 10, "mu_norm": 0.0 if head == "mu_center"
                else step * 3.0, **({"val_loss": 6.5} if step == 30 else {})}
               for step in range(1, 31)]
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_curves_colour_by_head_and_mark_a_single_point(tmp_path):
    runs = [write_curve_run(tmp_path / f"{head}{seed}", head, seed)
            for head in ("baseline", "mu_center") for seed in (0, 1)]
    assert sweep.main(["curves", *map(str, runs), "--out", str(tmp_path), "--name", "c"]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = sweep.curves_figure({str(run): [json.loads(line) for line in (
        run / "log.jsonl").read_text().splitlines()] for run in runs},
        {str(run): json.loads((run / "config.json").read_text())["head"] for run in runs})
    loss, val, mu = (ax for ax in fig.axes if ax.get_visible())
    assert [ax.get_title() for ax in (loss, val, mu)] == [
        "training loss", "validation loss", "‖μ‖, the output rows' mean"]
    lines = {line.get_label(): line for line in loss.get_lines()}
    assert sorted(lines) == ["baseline0", "baseline1", "mu_center0", "mu_center1"]
    assert lines["baseline0"].get_color() == lines["baseline1"].get_color() == "tab:gray"
    assert lines["baseline0"].get_linestyle() != lines["baseline1"].get_linestyle()
    assert {line.get_marker() for line in val.get_lines()} == {"o"}  # one point each: visible
    assert mu.get_yscale() == "symlog" and fig.get_suptitle() == "baseline vs mu_center, over " \
        "training"


# ---- launching: SLURM, and locally with a stand-in for train.py -------------------------------

def fake_bin(folder, **scripts):
    folder.mkdir()
    for name, text in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + text)
        (folder / name).chmod(0o755)
    return folder


def test_slurm_script_is_an_array_of_one_node_tasks(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    write_run(out, "16M", "baseline", 1e-3, 3.9, data="my data")  # finished
    argv = ["run", "--grid", "custom", "--sizes", "16M", "--lrs", "1e-3", "1e-2", "--heads",
            "baseline", "mu_loss", "--lams", "0.1", "--out", str(out), "--launcher", "slurm",
            "--nproc_per_node", "4", "--sbatch", "partition=gpu", "gpus-per-node=4", "exclusive",
            "comment=a b", "--data", "my data"]
    python = fake_bin(tmp_path / "py", python='printf "%s\\n" "$@" > "$ARGS"\n') / "python"
    monkeypatch.setattr(sys, "executable", str(python))
    assert sweep.main(argv) == 0
    [script] = (out / "slurm").glob("sweep_*.sbatch")
    [run_list] = (out / "slurm").glob("runs_*.txt")
    text, lines = script.read_text(), run_list.read_text().splitlines()
    assert len(lines) == 3 and not any("16M_baseline_lr0.001_tie0" in line for line in lines)
    for option in ("array=0-2", "nodes=1", "partition=gpu", "gpus-per-node=4", "exclusive",
                   "comment='a b'", f"chdir={Path.cwd()}"):
        assert f"\n#SBATCH --{option}\n" in text
    assert "sweep: submitted" not in capsys.readouterr().out  # written, not submitted
    task_dir = Path(lines[1].split()[0])  # task 1: 16M_mu_loss_lr0.001_tie0_lam0.1, resumed
    task_dir.mkdir()
    (task_dir / "ckpt.pt").write_bytes(b"")
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="1", ARGS=str(tmp_path / "args"))
    subprocess.run(["bash", str(script)], env=env, check=True)
    assert (tmp_path / "args").read_text().splitlines() == [
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", str(sweep.TRAIN_PY),
        "--size", "16M", "--head", "mu_loss", "--lr", "0.001", "--lam", "0.1", "--data",
        "my data", "--out_dir", str(task_dir), "--resume"]
    bin_dir = fake_bin(tmp_path / "bin", sbatch=(
        "if grep -q partition=nosuch \"$2\"; then echo 'sbatch: error: Batch job submission "
        "failed: Invalid partition name specified' >&2; exit 1; fi\necho '42;cluster'\n"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert sweep.main(argv + ["--submit"]) == 0
    assert "sweep: submitted job 42; its tasks write to " in capsys.readouterr().out
    with pytest.raises(SystemExit) as error:
        sweep.main(argv + ["--sbatch", "partition=nosuch", "--submit"])
    assert str(error.value) == ("sweep run: sbatch refused the job (Batch job submission failed: "
                                "Invalid partition name specified), so nothing was submitted; "
                                "change --sbatch to what the cluster offers (sinfo lists its "
                                "partitions)")


FAKE_TRAIN = """import json, pathlib, sys, time
args = sys.argv[1:]
lr = float(args[args.index("--lr") + 1])
out = pathlib.Path(args[args.index("--out_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{}")
if lr > 0.05:
    sys.exit(1)  # a crash: no summary.json
print("trained", " ".join(args))
(out / "summary.json").write_text(json.dumps(args))
"""


def test_local_runs_share_slots_and_report_failures(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "train.py"  # stands in for train.py: quick, and fails on demand
    fake.write_text(FAKE_TRAIN)
    monkeypatch.setattr(sweep, "TRAIN_PY", fake)
    out = tmp_path / "sweep"
    argv = ["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3", "1e-1", "--heads",
            "baseline", "mu_center", "--out", str(out), "--gpus", "0,1"]
    assert sweep.main(argv) == 1
    printed = capsys.readouterr().out
    assert printed.count("sweep: done ") == 2 and printed.count("sweep: FAILED (exit 1) ") == 2
    assert "on GPU 0" in printed and "on GPU 1" in printed
    assert (f"2 runs failed (tiny_baseline_lr0.1_tie0, tiny_mu_center_lr0.1_tie0; logs in "
            f"{out / 'logs'}); run the same command again to retry them") in printed
    assert "trained" in (out / "logs" / "tiny_baseline_lr0.001_tie0.log").read_text()
    assert sweep.main(argv) == 1  # again: the finished skipped, the failed resumed
    printed = capsys.readouterr().out
    assert "sweep: 4 runs in the grid, 2 finished, 2 to do" in printed
    assert printed.count(" (resume) on GPU ") == 2


def test_a_tiny_sweep_on_the_cpu_runs_collects_and_tables(tmp_path):
    """The one real run of train.py here: two tiny runs at once on the CPU."""
    out = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "sweep.py"), "run", "--grid", "custom", "--sizes",
               "tiny", "--lrs", "1e-2", "--heads", "baseline", "mu_center", "--out", str(out),
               "--jobs", "2", "--device", "cpu", "--data", str(TEXT), "--steps", "8",
               "--warmup", "2", "--batch_size", "2", "--micro_batch", "2", "--seq_len", "32",
               "--eval_tokens", "256", "--stat_tokens", "256", "--log_every", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    logs = "".join(path.read_text() for path in (out / "logs").glob("*.log"))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    assert "sweep: all 2 runs finished" in done.stdout
    assert sweep.main(["collect", str(out)]) == 0
    assert sweep.main(["table", str(out / "results.csv"), "--out", str(out)]) == 0
    results = {r["head"]: r for r in csv.DictReader(open(out / "results.csv", newline=""))}
    assert all(float(r["test_loss"]) < float(r["init_loss"]) for r in results.values())
    assert all(r["diverged"] == "false" and r["size"] == "tiny" for r in results.values())
    assert float(results["mu_center"]["mu_norm"]) < 1e-4 < float(results["baseline"]["mu_norm"])
    rows = table_rows(out)
    assert float(rows[("tiny", "baseline", None)]["optimal_loss"]) == float(
        results["baseline"]["test_loss"])

"""sweep.py --launcher slurm against a real SLURM (slurmctld, slurmd and munge on this machine, as
`bash scripts/slurm.sh start` brings them up; .ci/run does): scripts/README.md's SLURM lines run
as written (with fewer, smaller steps), a job cancelled mid-run and the same command again, every
run equal to a local run of the same settings; a job the scheduler refuses, in one sentence with
its reason. Skipped, with the reason, where that one-node cluster does not answer."""
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import sweep

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # no venv, no torchrun: only the system's commands
# fewer steps than README's line, and small: train.py takes the last of a repeated option
FEWER = ("--steps 40 --warmup 2 --batch_size 2 --micro_batch 2 --seq_len 32 --eval_tokens 256 "
         "--stat_tokens 256 --log_every 5 --save_every 10".split())
TIMES = ("train_time_s", "measure_time_s", "tok_per_s", "mfu")  # what may differ between runs


def slurm_unavailable():
    """Why there is no SLURM here to test against, or None where scripts/slurm.sh's answers."""
    if not shutil.which("sbatch"):
        cannot = ("this is not root" if os.geteuid() else
                  None if shutil.which("apt-get") else "there is no apt-get")
        return "SLURM is not installed (no sbatch)" + (
            f" and scripts/slurm.sh cannot install it: {cannot}" if cannot else
            "; `bash scripts/slurm.sh start` installs and starts one")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if " is UP" not in ping.stdout:
        return ("no SLURM controller answers `scontrol ping`; `bash scripts/slurm.sh start` "
                "starts one")
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    if not re.search(r"^ClusterName\s*=\s*oec$", config, flags=re.M):
        return ("the SLURM that answers is not scripts/slurm.sh's one-node cluster (ClusterName "
                "oec), and these tests queue jobs")
    return None


UNAVAILABLE = slurm_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


def readme_commands():
    """The command lines of scripts/README.md's `## Sweeps on SLURM`, split as a shell would."""
    text = README.split("\n## Sweeps on SLURM\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", text, flags=re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def sh(argv, cwd=ROOT, check=True):
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 or not check, f"{shlex.join(map(str, argv))}: {done.stderr}"
    return done


def sweep_py(line, capsys):
    """`python sweep.py ARGS` (line) run here: the same interpreter, PATH and folder."""
    assert line[:2] == ["python", "sweep.py"] and sweep.main(line[2:]) == 0
    return capsys.readouterr().out


def job_id(output):
    return re.search(r"^sweep: submitted job (\d+);", output, flags=re.M).group(1)


def job_states(job):
    """{array task: JobState} while slurmctld remembers the job (MinJobAge, 300 s)."""
    shown = sh(["scontrol", "-o", "show", "job", job]).stdout
    return dict(re.findall(r"ArrayTaskId=(\S+) .*?JobState=(\w+)", shown))


def wait_for(job, until=lambda: False, timeout=120):
    """Until the job has left the queue, or until() holds."""
    deadline = time.time() + timeout
    while sh(["squeue", "-h", "-j", job], check=False).stdout.strip() and not until():
        assert time.time() < deadline, f"job {job} still queued after {timeout} s"
        time.sleep(0.2)


def run_record(folder):
    """A run's summary and log without its timings: what must equal a local run's."""
    def timeless(record):
        return {key: value for key, value in record.items() if key not in TIMES}
    summary = json.loads((folder / "summary.json").read_text())
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return timeless(summary), [timeless(record) for record in log]


def test_the_readme_lines_run_on_slurm_resume_after_scancel_and_equal_local_runs(
        tmp_path, monkeypatch, capsys):
    """Two jobs at once whose tasks share array index 0 (each its own rendezvous, so cancelling
    one leaves the other running), one cancelled after its first checkpoint; README's line
    again resumes it. Without the venv on PATH (and no torchrun there), in a folder with a space."""
    start, run_line, squeue, collect_line = readme_commands()
    assert sh(start).returncode == 0  # the controller answers: nothing to do, or started
    cwd = tmp_path / "a folder"
    cwd.mkdir()
    (cwd / "tests").symlink_to(ROOT / "tests")  # README's paths, from a folder of its own
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PATH", BARE_PATH)  # what sbatch passes on to the job
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    line = run_line + FEWER
    out = cwd / line[line.index("--out") + 1]
    local = [a for a in line if a not in ("--launcher", "slurm", "--submit")]
    local = local[:local.index("--sbatch")] + local[local.index("--device"):]
    sweep_py(local + ["--out", "local", "--jobs", "2"], capsys)

    names = list(sweep.expand_grid("custom", sizes=["tiny"], lrs=[1e-2],
                                   heads=["baseline", "mu_center"]))
    cancelled = out / names[0]
    jobs = [job_id(sweep_py(line + ["--heads", head], capsys))
            for head in ("baseline", "mu_center")]
    assert all(job in sh(squeue).stdout for job in jobs)
    script = next((out / "slurm").glob("sweep_*.sbatch")).read_text()
    assert "#SBATCH --partition=cpu\n" in script and "gpus" not in script  # none asked
    wait_for(jobs[0], until=lambda: (cancelled / "ckpt.pt").exists())
    sh(["scancel", jobs[0]])
    wait_for(jobs[0])
    assert not (cancelled / "summary.json").exists(), "the run ended before scancel reached it"
    wait_for(jobs[1])
    assert job_states(jobs[0]) == {"0": "CANCELLED"} and job_states(jobs[1]) == {"0": "COMPLETED"}

    again = sweep_py(line, capsys)
    assert "sweep: 2 runs in the grid, 1 finished, 1 to do" in again
    wait_for(job := job_id(again))
    assert job_states(job) == {"0": "COMPLETED"}
    assert "resuming after step" in (out / "slurm" / "logs" / f"{job}_0.out").read_text()
    for name in names:
        assert run_record(out / name) == run_record(cwd / "local" / name), name
    collect, table = " ".join(collect_line).split(" && ")
    sweep_py(shlex.split(collect), capsys)
    assert "| model size N | baseline | mu_center |" in sweep_py(shlex.split(table), capsys)


@pytest.mark.parametrize("option, reason", [
    ("partition=nosuch", "invalid partition specified: nosuch"),
    ("time=1h", "Invalid --time specification"),
    ("gpus-per-node=1", "Invalid generic resource (gres) specification"),
])
def test_what_the_scheduler_refuses_is_said_in_one_sentence_and_nothing_is_queued(
        option, reason, tmp_path):
    queued = sh(["squeue", "-h", "-o", "%i"]).stdout
    with pytest.raises(SystemExit) as error:
        sweep.main(["run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-2", "--heads",
                    "baseline", "--out", str(tmp_path), "--launcher", "slurm", "--submit",
                    "--sbatch", option])
    message = str(error.value)
    assert message.startswith("sweep run: sbatch refused the job (") and reason in message
    assert message.endswith(", so nothing was submitted; change --sbatch to what the cluster "
                            "offers (sinfo lists its partitions)") and "\n" not in message
    assert sh(["squeue", "-h", "-o", "%i"]).stdout == queued

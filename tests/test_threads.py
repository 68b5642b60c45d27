"""The thread rule (groklens/threads.py): --threads, GROKLENS_THREADS, OMP_NUM_THREADS, the
automatic share of the cores, and the one busy-machine line of `train`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from groklens.errors import BadInput
from groklens.threads import apply_threads, choose_threads, is_computing, other_groklens_processes


def test_explicit_then_env_then_omp_then_automatic():
    assert choose_threads(3, env={"GROKLENS_THREADS": "2"}, cores=8, load=0.0, others=0).threads == 3
    c = choose_threads(None, env={"GROKLENS_THREADS": "2", "OMP_NUM_THREADS": "5"}, cores=8, load=0.0, others=0)
    assert (c.threads, c.why) == (2, "GROKLENS_THREADS")
    c = choose_threads(None, env={"OMP_NUM_THREADS": "5"}, cores=8, load=0.0, others=0)
    assert (c.threads, c.why) == (None, "OMP_NUM_THREADS")  # left to torch, which reads it
    # automatic: the cores shared with the other groklens processes, one on a busy machine
    assert choose_threads(None, env={}, cores=8, load=0.5, others=0).threads == 8
    assert choose_threads(None, env={}, cores=8, load=2.0, others=1).threads == 4
    assert choose_threads(None, env={}, cores=8, load=2.0, others=3).threads == 2
    assert choose_threads(None, env={}, cores=2, load=14.5, others=0).threads == 1
    assert choose_threads(None, env={}, cores=2, load=None, others=5).threads == 1


def test_the_busy_note_names_load_and_others_and_is_empty_on_an_idle_machine():
    assert choose_threads(None, env={}, cores=4, load=1.0, others=0).note == ""
    note = choose_threads(None, env={}, cores=2, load=14.5, others=3).note
    assert "load average 14.5 on 2 cores" in note and "3 other groklens processes" in note
    assert "torch uses 1 thread (automatic)" in note and "--threads N" in note
    note = choose_threads(None, env={"OMP_NUM_THREADS": "1"}, cores=2, load=3.0, others=0).note
    assert "OMP_NUM_THREADS=1" in note and "\n" not in note


@pytest.mark.parametrize("bad", ["0", "-2", "many", "1.5"])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(BadInput, match="GROKLENS_THREADS must be a whole number"):
        choose_threads(None, env={"GROKLENS_THREADS": bad}, cores=2, load=0.0, others=0)


def test_which_processes_count_as_computing(tmp_path):
    assert is_computing(["/x/.venv/bin/python", "/x/.venv/bin/groklens", "train", "--out", "a.h5"])
    assert is_computing(["python", "-m", "groklens", "report", "a.h5", "-o", "r"])
    assert is_computing(["python", "-c",
                         "from multiprocessing.forkserver import main; main(['groklens.trainers.train'])"])
    assert not is_computing(["/x/bin/groklens", "info", "a.h5"])
    assert not is_computing(["vim", "train.py"])
    # a /proc of three processes: one trainer, one `info`, one unrelated
    for pid, argv in (("101", ["python", "-m", "groklens", "train", "-o", "a.h5"]),
                      ("102", ["groklens", "info", "a.h5"]), ("103", ["bash"])):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (tmp_path / "self").mkdir()
    assert other_groklens_processes(tmp_path) == 1


def test_a_count_reaches_torch_in_a_fresh_process():
    """GROKLENS_THREADS set before torch is imported (the CLI's order) is what torch uses."""
    code = ("from groklens.threads import apply_threads; apply_threads(None, quiet=True); "
            "import torch; print(torch.get_num_threads())")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "GROKLENS_THREADS": "2"}, check=True)
    assert out.stdout.strip() == "2"


def test_apply_threads_tells_a_loaded_torch(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("GROKLENS_THREADS", raising=False)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(var, "1")  # restored by monkeypatch after apply_threads rewrites them
    try:
        assert apply_threads(3, quiet=True).threads == 3 and torch.get_num_threads() == 3
    finally:
        from threadpoolctl import threadpool_limits

        torch.set_num_threads(before)
        threadpool_limits(1)  # the suite's one BLAS thread (OMP_NUM_THREADS=1 in conftest)

"""The demo (torch_vtpu.demo) and the command line (python -m torch_vtpu)."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import torch_vtpu
from torch_vtpu import __main__ as cli
from torch_vtpu import demo


@pytest.fixture(scope="module")
def trained():
    """A few steps of demo training on vtpu in strict mode (shared by the tests below). The
    budget allows for the first step compiling the kernels the ahead-of-time library does
    not hold (about 40 for this model, ~15 s on 2 cores with a cold cache)."""
    return demo.train("vtpu", "strict", max_seconds=60, max_steps=12, progress=False)


def test_corpus_ships_with_the_package():
    text = demo.load_corpus()
    assert 30_000 <= len(text.encode("utf-8")) <= 60_000
    tokenizer = demo.ByteTokenizer()
    assert tokenizer.decode(tokenizer.encode(text[:500])) == text[:500]


def test_training_reduces_the_loss(trained):
    assert trained.steps >= 5, f"only {trained.steps} steps in the budget"
    assert len(trained.losses) == trained.steps
    assert trained.tokens == trained.steps * demo.BATCH_SIZE * demo.SEQ_LEN
    assert trained.tokens_per_s > 0
    first, last = trained.losses[:3], trained.losses[-3:]
    assert sum(last) / 3 < 0.9 * sum(first) / 3, trained.losses
    assert next(trained.model.parameters()).device.type == "vtpu"


def test_time_budget_is_respected():
    result = demo.train("vtpu", "debug", max_seconds=1.0, progress=False)
    assert result.steps >= 1
    assert result.seconds < 1.0 + 5.0  # the step in flight when time runs out may finish


def test_sample_is_text_and_matches_cpu(trained):
    text = demo.sample(trained.model, "The river ", n=24)
    assert isinstance(text, str)
    assert text.startswith("The river ")
    assert len(text.encode("utf-8", errors="replace")) > len("The river ")
    # Greedy KV-cached decoding on the device picks the same bytes as on the CPU.
    cpu_model = copy.deepcopy(trained.model).to("cpu")
    assert demo.sample(cpu_model, "The river ", n=24) == text


def test_demo_main_runs_end_to_end(capsys):
    assert demo.main(["--seconds", "6", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for expected in ("vtpu  strict", "vtpu  debug", "cpu   eager", "tokens/s", "final loss", "greedy sample"):
        assert expected in out, f"{expected!r} missing from demo output:\n{out}"


def test_cli_info_in_process(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert torch_vtpu.__version__ in out and torch.__version__ in out
    assert f"mode         {torch_vtpu.get_mode()}" in out
    assert "host_fallback_ops" in out
    # The engine's targets: the host always, cuda with its state and reason.
    assert "target host  available: the host CPU" in out
    cuda = [line for line in out.splitlines() if line.startswith("target cuda ")]
    assert len(cuda) == 1 and (" available: " in cuda[0] or " unavailable: " in cuda[0]), out
    if " unavailable: " in cuda[0]:
        assert len(cuda[0].split("unavailable: ", 1)[1]) > 10  # says why


def test_cli_info_subprocess():
    """`python -m torch_vtpu info` as a user runs it: torch's backend autoload enabled."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, "-m", "torch_vtpu", "info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch_vtpu" in proc.stdout and "memory" in proc.stdout


def test_cli_cache_stats_and_clear(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "vtpu-cache"
    monkeypatch.setenv("VTPU_CACHE_DIR", str(cache))
    assert cli.main(["cache", "stats"]) == 0
    assert "entries      0" in capsys.readouterr().out  # absent directory: zero, no error

    # The disk tier's layout: <key>.entry files, plus lock files that are not entries.
    cache.mkdir(parents=True)
    (cache / ("a" * 32 + ".entry")).write_bytes(b"x" * 100)
    (cache / ("b" * 32 + ".entry")).write_bytes(b"y" * 20)
    (cache / ("a" * 32 + ".lock")).write_bytes(b"")
    assert cli.main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "entries      2" in out and "bytes        120" in out

    assert cli.main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert cache.is_dir() and not any(cache.iterdir())


def test_cli_cache_clear_refuses_home(monkeypatch, capsys):
    monkeypatch.setenv("VTPU_CACHE_DIR", os.path.expanduser("~"))
    assert cli.main(["cache", "clear"]) == 2
    assert "refusing" in capsys.readouterr().err


def test_cli_cache_clear_refuses_a_directory_that_is_not_a_cache(tmp_path, monkeypatch, capsys):
    # A mistyped VTPU_CACHE_DIR emptied whatever directory it named (found by a review).
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "README.txt").write_text("keep me")
    (project / ("c" * 32 + ".entry")).write_bytes(b"z")
    monkeypatch.setenv("VTPU_CACHE_DIR", str(project))
    assert cli.main(["cache", "clear"]) == 2
    err = capsys.readouterr().err
    assert "refusing" in err and "README.txt" in err and "src" in err
    assert (project / "README.txt").read_text() == "keep me" and (project / "src").is_dir()
    assert (project / ("c" * 32 + ".entry")).exists()
    # A link under an entry's name is not the cache's either.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ("d" * 32 + ".entry")).symlink_to(project / "README.txt")
    monkeypatch.setenv("VTPU_CACHE_DIR", str(cache))
    assert cli.main(["cache", "clear"]) == 2
    assert (project / "README.txt").exists()


def test_cli_info_masks_a_password_with_an_at_sign():
    env = dict(os.environ, VTPU_SHARED_CACHE="redis://u:s3cr3t@pw@127.0.0.1:1/0", VTPU_CACHE_KEY="k" * 20,
               VTPU_SHARED_CACHE_TIMEOUT="0.2")
    proc = subprocess.run([sys.executable, "-m", "torch_vtpu", "info"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "s3cr3t" not in proc.stdout + proc.stderr and "redis://u:***@127.0.0.1:1/0" in proc.stdout, proc.stdout


def test_cli_requires_a_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("argv", [["demo", "--seconds", "nan"], ["demo", "--seconds", "0"], ["demo", "--seconds", "-1"],
                                  ["bench", "--ops", "0"], ["bench", "--ops", "-5"], ["bench", "--repeats", "0"],
                                  ["bench", "--numel", "-1"], ["bench", "--ops", "x"]])
def test_cli_tools_refuse_bad_values_as_usage_errors(argv, capsys):
    # `--seconds nan` trained forever, `--seconds 0` ended in an IndexError, `--ops 0`
    # in a ZeroDivisionError and `--ops -5` printed negative timings (found by a review).
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert argv[1] in capsys.readouterr().err

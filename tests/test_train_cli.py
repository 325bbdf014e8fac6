"""The training command line as a user meets it: one-line errors with exit code 2 for bad input
(checked before training, --json included), the --json file written atomically, the entry points
(python -m hiertail_fast.train, python -m hiertail_fast, the hiertail-train function) and their
OpenMP wait policy and thread defaults; HierTailConfig's own checks and loss_dtype."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hiertail_fast.nn.hiertail as hiertail_module
from hiertail_fast._threads import SMALL_GRAPH_NODES
from hiertail_fast._train_cli import main, parse_seeds
from hiertail_fast.data.synthetic import make_synthetic_graph
from hiertail_fast.nn.hiertail import HierTail, HierTailConfig, prepare_graph
from tests.conftest import ctrl_c_line

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--synthetic", "--nodes", "120", "--classes", "5", "--features", "8", "--hidden", "8",
        "--epochs", "2", "--seeds", "1", "--no-progress"]
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _python(args: list[str], env_drop=("OMP_WAIT_POLICY",), timeout=300, **env):
    """Run `python args...` from the repository root with this checkout importable."""
    environ = {k: v for k, v in os.environ.items() if k not in env_drop}
    environ.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")])),
                   **env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                          env=environ, timeout=timeout)


# ----------------------------------------------------------------------------- user errors
@pytest.mark.parametrize("extra, message", [
    (["--lr", "nan"], "--lr: must be a finite number > 0, got nan"),
    (["--lr", "inf"], "--lr: must be a finite number > 0, got inf"),
    (["--weight-decay", "nan"], "--weight-decay: must be a finite number >= 0"),
    (["--gamma=inf"], "--gamma: must be a finite number >= 0"),
    (["--lr", "abc"], "'abc' is not a number"),
    (["--seeds", "99999999999999999999,1"], "seed 99999999999999999999 is out of range"),
    (["--seeds", "1,1"], "--seeds lists 1 more than once"),
    (["--seeds", "3", "5", "3"], "--seeds lists 3 more than once"),
    (["--seeds", "10000000000"], "--seeds count must lie in [1, 100000]"),
    (["--device", "foo"], "--device 'foo' is not a device"),
    (["--device", "meta"], "--device meta: only cpu and cuda devices can train"),
    # Path("") is the current folder: --root "" read the working directory's files
    (["--json", ""], "argument --json: an empty path (a file name is needed)"),
    (["--split", ""], "argument --split: an empty path"),
    (["--root", ""], "argument --root: an empty path (use '.' for the current folder)"),
])
def test_bad_values_exit_2_with_one_line(extra, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(TINY + extra)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(capsys):
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--device", "cuda"])
    err = capsys.readouterr().err   # (check_device's words, the option as typed)
    assert exc.value.code == 2 and "--device cuda: CUDA is not available (torch " in err


def test_data_or_split_directory_is_named_as_such(tmp_path, capsys):
    for argv in (["--data", str(tmp_path)], TINY + ["--split", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert f"{tmp_path} is a directory, not an .npz file" in capsys.readouterr().err


def _no_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started although --json cannot be written")
    monkeypatch.setattr("hiertail_fast._train_cli.run_seeds", fail)


def test_json_target_checked_before_training(tmp_path, capsys, monkeypatch):
    _no_training(monkeypatch)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = [(tmp_path, "is a directory"),
             (a_file / "out.json", f"{a_file} is not a directory"),
             (a_file / "sub" / "out.json", f"{a_file} (a parent of {a_file / 'sub'}) is not a")]
    for target, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(TINY + ["--json", str(target)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"--json {target} cannot be written: " in err and message in err, err


def test_json_in_unwritable_directory(tmp_path, capsys, monkeypatch):
    """A directory this process cannot create files in (mkstemp refused; a chmod'ed directory
    does not stop root, so the refusal is simulated here and tested for real below)."""
    _no_training(monkeypatch)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("hiertail_fast._files.tempfile.mkstemp", refuse)
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--json", str(tmp_path / "new" / "out.json")])
    assert exc.value.code == 2
    assert f"cannot create files in {tmp_path} (Permission denied)" in capsys.readouterr().err


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only directories")
def test_json_in_read_only_directory(tmp_path, capsys, monkeypatch):
    _no_training(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "old.json").write_text("{}")
    locked.chmod(0o555)
    try:
        for name in ("out.json", "old.json"):
            with pytest.raises(SystemExit) as exc:
                main(TINY + ["--json", str(locked / name)])
            assert exc.value.code == 2 and "cannot be written" in capsys.readouterr().err
    finally:
        locked.chmod(0o755)


def test_parse_seeds_distinct_and_in_range():
    assert parse_seeds(["2"], base=2**64 - 2) == [2**64 - 2, 2**64 - 1]
    with pytest.raises(ValueError, match="out of range"):
        parse_seeds(["3"], base=2**64 - 2)
    with pytest.raises(ValueError, match="more than once"):
        parse_seeds(["4", "4"])


def test_a_large_seed_count_is_said_before_anything_trains(tmp_path, capsys):
    """`--seeds 125` is a count (125 seeds from --seed-base), not the seed 125: above the
    protocol's 10 seeds both command lines say so on stderr, with the way to give one seed
    (`125,`), before loading data; a list or a small count says nothing."""
    from hiertail_fast._train_cli import seed_count_notice
    from hiertail_fast.experiments.cli import budget_from_args, build_parser

    assert parse_seeds(["125,"]) == [125]
    notice = seed_count_notice(["125"], parse_seeds(["125"]))
    assert notice is not None and "125 seeds, 123..247" in notice and "--seeds 125," in notice
    # (lists of more than 10 seeds too: a mutation pass, session 73, found the notice said for
    # them, "--seeds 1 is a count: 11 seeds", without a test failing)
    eleven = [str(seed) for seed in range(1, 12)]
    for values in (["3"], ["10"], ["125,"], ["1,2,5"], ["1", "2"], [",".join(eleven)], eleven):
        assert seed_count_notice(values, parse_seeds(values)) is None
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(tmp_path / "missing.npz"), "--seeds", "11", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--seeds 11 is a count: 11 seeds, 123..133" in err
    assert err.index("--seeds 11 is a count") < err.index("missing.npz")
    budget = budget_from_args(build_parser().parse_args(["main", "--seeds", "12",
                                                         "--seed-base", "5"]))
    assert budget.seeds == tuple(range(5, 17))
    assert "--seeds 12 is a count: 12 seeds, 5..16" in capsys.readouterr().err
    assert budget_from_args(build_parser().parse_args(["main", "--seeds", "125,"])).seeds == (125,)
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- the JSON file
def test_json_replaced_atomically_the_old_one_kept_as_prev(tmp_path, capsys):
    out = tmp_path / "res.json"
    out.write_text("old")
    main(TINY + ["--json", str(out)])
    assert json.loads(out.read_text())["seeds"] == [123]
    prev = tmp_path / "res.prev.json"
    assert prev.read_text() == "old"            # one generation kept, as scale.py / experiments
    assert f"wrote {out}; the file it replaced is kept as {prev}" in capsys.readouterr().err
    main(TINY + ["--json", str(out)])
    assert json.loads(prev.read_text())["seeds"] == [123]
    # no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.json", "res.prev.json"]


def test_json_never_overwrites_the_dataset_it_reads(tmp_path, capsys, data_dir):
    # --dataset NAME --root DIR reads DIR/NAME.npz: --json naming it was written over the data
    # (a CLI audit's find: only --data and --split were compared)
    shutil.copy(data_dir / "email.npz", tmp_path / "email.npz")
    before = (tmp_path / "email.npz").read_bytes()
    for target in (tmp_path / "email.npz", tmp_path / "." / "email.npz"):
        with pytest.raises(SystemExit) as exc:
            main(["--dataset", "email", "--root", str(tmp_path), "--seeds", "1", "--epochs", "1",
                  "--no-progress", "--json", str(target)])
        assert exc.value.code == 2
        assert "is an input of --dataset email" in capsys.readouterr().err
    # a PyG dataset's folder (raw files, processed cache) is an input too
    with pytest.raises(SystemExit) as exc:
        main(["--dataset", "wiki", "--root", str(tmp_path), "--no-progress", "--json",
              str(tmp_path / "wiki" / "raw" / "res.json")])
    assert exc.value.code == 2 and "is an input of --dataset wiki" in capsys.readouterr().err
    assert (tmp_path / "email.npz").read_bytes() == before


def test_threads_beyond_the_cpus_refused(capsys):
    # 2,048 threads segfaulted inside torch.unique on the 2-CPU machine (exit 139, no message)
    from hiertail_fast._validation import available_cpus
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--threads", str(available_cpus() + 1)])
    assert exc.value.code == 2
    assert f"must lie in [1, {available_cpus()}]" in capsys.readouterr().err


def test_full_disk_keeps_the_old_json_and_prints_the_results(tmp_path):
    """A write that fails part-way (here: the file-size limit, as a full disk would) must leave
    the previous file intact and no temporary file, and still hand the results to the user."""
    out = tmp_path / "res.json"
    out.write_text('{"old": true}')
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
            "from hiertail_fast.__main__ import main\n"
            f"sys.exit(main({TINY + ['--json', str(out)]!r}))\n")
    proc = _python(["-c", code])
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "could not write --json" in proc.stderr and "existing file is unchanged" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(out.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.json"]
    assert '"config_name": "paper"' in proc.stdout  # the results are not lost


# ----------------------------------------------------------------------------- entry points
SPIN = "GOMP_SPINCOUNT = '{}'"  # libgomp's OMP_DISPLAY_ENV=VERBOSE: 0 <=> passive waiting


@pytest.mark.parametrize("entry", [["-m", "hiertail_fast.train"], ["-m", "hiertail_fast"],
                                   ["-c", "import sys; from hiertail_fast.__main__ import main; "
                                          "sys.exit(main())"]],
                         ids=["m-train", "m-package", "console-script"])
def test_entry_points_wait_passively_unless_told(entry):
    proc = _python(entry + ["--help"], OMP_DISPLAY_ENV="VERBOSE")
    assert proc.returncode == 0 and "--json" in proc.stdout, proc.stderr[-2000:]
    assert SPIN.format(0) in proc.stderr          # OpenMP saw PASSIVE when torch loaded it
    proc = _python(entry + ["--help"], OMP_DISPLAY_ENV="VERBOSE", OMP_WAIT_POLICY="ACTIVE")
    assert SPIN.format(30000000000) in proc.stderr  # the user's own choice is kept


def test_the_wait_policy_is_left_alone_once_torch_is_loaded(monkeypatch):
    """An embedding program that loaded torch before calling main: OpenMP has read its policy
    already, so the entry sets none (set, it would be recorded as the run's policy without
    being in effect, and passed on to child processes; a mutation pass, session 73)."""
    import sys

    from hiertail_fast.__main__ import prefer_passive_wait

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert "torch" in sys.modules
    assert prefer_passive_wait() is False
    assert "OMP_WAIT_POLICY" not in os.environ


def test_console_script_trains_and_exits_0(tmp_path):
    """setup.py's hiertail-train calls sys.exit(main()): main must return 0, not the results."""
    out = tmp_path / "res.json"
    proc = _python(["-c", "import sys; from hiertail_fast.__main__ import main; "
                          f"sys.exit(main({TINY + ['--json', str(out)]!r}))"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    training = json.loads(out.read_text())["training"]
    assert training["omp_wait_policy"] == "PASSIVE" and training["threads"] == 1


def test_import_has_no_side_effects_and_the_loop_does_not_import_the_cli():
    code = ("import os, sys, torch\n"
            "torch.set_num_threads(2); before = dict(os.environ)\n"
            "import hiertail_fast, hiertail_fast.train, hiertail_fast.__main__\n"
            "assert dict(os.environ) == before and torch.get_num_threads() == 2\n"
            "assert 'hiertail_fast._train_cli' not in sys.modules\n"
            "assert not hasattr(hiertail_fast.train, 'main')\n"
            "import hiertail_fast._train_cli\n"
            "assert dict(os.environ) == before and torch.get_num_threads() == 2\n"
            "print('clean')\n")
    proc = _python(["-c", code])
    assert proc.returncode == 0 and "clean" in proc.stdout, proc.stderr[-2000:]


def test_threads_default_one_on_small_graphs_unless_given(monkeypatch):
    torch.set_num_threads(2)
    assert main(TINY)["training"]["threads"] == 1   # 120 nodes < SMALL_GRAPH_NODES
    assert torch.get_num_threads() == 2             # restored: main() in a Python process
    assert main(TINY + ["--threads", "1"])["training"]["threads"] == 1
    assert torch.get_num_threads() == 2
    def interrupted(*args, **kwargs):
        assert torch.get_num_threads() == 1
        raise KeyboardInterrupt
    monkeypatch.setattr("hiertail_fast._train_cli.run_seeds", interrupted)
    with pytest.raises(SystemExit):                 # also when it stops halfway (Ctrl-C)
        main(TINY)
    assert torch.get_num_threads() == 2
    assert SMALL_GRAPH_NODES > 1005                 # Email trains on one thread by default


# ----------------------------------------------------------------------------- the config
@pytest.mark.parametrize("change, error", [
    (dict(lr=float("nan")), ValueError), (dict(lr=float("inf")), ValueError),
    (dict(weight_decay=float("nan")), ValueError), (dict(weight_decay=float("inf")), ValueError),
    (dict(hidden=2.5), TypeError), (dict(hidden="64"), TypeError), (dict(hidden=True), TypeError),
    (dict(loss_dtype="float64"), ValueError), (dict(loss_dtype=torch.int8), ValueError),
])
def test_config_rejects_at_construction(change, error):
    with pytest.raises(error):
        HierTailConfig.paper(**change)


def test_config_loss_dtype_casts_the_contrastive_inputs(monkeypatch):
    assert HierTailConfig.paper(loss_dtype=torch.bfloat16).loss_dtype == "bfloat16"  # JSON-able
    g = make_synthetic_graph(150, num_classes=5, avg_degree=6, num_features=8, seed=0)
    graph, idx = prepare_graph(g.edge_index, g.num_nodes), torch.arange(0, 150, 3)
    seen = []
    original = hiertail_module.balanced_contrastive_loss

    def spy(z, labels, prototypes=None, **kw):
        seen.append((z.dtype, None if prototypes is None else prototypes.dtype))
        return original(z, labels, prototypes=prototypes, **kw)

    monkeypatch.setattr(hiertail_module, "balanced_contrastive_loss", spy)
    totals = {}
    # the official preset too: its pooled prototypes were left uncast unnoticed (a mutation
    # audit; the loss then refused fp32 prototypes for fp16 rows)
    for preset, dtype in (("paper", None), ("paper", "float16"), ("paper", "bfloat16"),
                          ("official", "float16")):
        torch.manual_seed(0)
        model = HierTail(8, g.num_classes, HierTailConfig.named(preset, hidden=8,
                                                                loss_dtype=dtype))
        seen.clear()
        loss = model.loss(model(g.x, graph), g.y, idx)
        loss.total.backward()
        want = torch.float32 if dtype is None else getattr(torch, dtype)
        assert seen and all(d == want and p in (None, want) for d, p in seen), seen
        assert loss.total.dtype == torch.float32
        grads = [p.grad for p in model.parameters()]   # through the cast back to fp32
        assert all(gr is not None and gr.dtype == torch.float32 and torch.isfinite(gr).all()
                   for gr in grads)
        if preset == "paper":
            totals[dtype] = loss.total.item()
    assert totals["float16"] == pytest.approx(totals[None], rel=1e-2)
    assert totals["bfloat16"] == pytest.approx(totals[None], rel=5e-2)


def test_feature_norm_row_normalises_the_features_and_is_recorded(tmp_path):
    """--feature-norm row divides every feature row by its sum before training (the official
    --is_normalize) and says so in the result; the default leaves the features as loaded."""
    from hiertail_fast._train_cli import _load_data, build_parser

    args = build_parser().parse_args(TINY + ["--feature-norm", "row"])
    data, info = _load_data(args)
    raw, raw_info = _load_data(build_parser().parse_args(TINY))
    sums = data.x.sum(1)
    nonzero = raw.x.sum(1) != 0
    torch.testing.assert_close(sums[nonzero], torch.ones_like(sums[nonzero]))
    want = raw.x[nonzero] / raw.x.sum(1, keepdim=True)[nonzero]
    torch.testing.assert_close(data.x[nonzero], want)
    assert info["feature_norm"] == "row" and "feature_norm" not in raw_info
    result = main(TINY + ["--feature-norm", "row", "--json", str(tmp_path / "r.json")])
    assert result["data"]["feature_norm"] == "row"
    assert json.loads((tmp_path / "r.json").read_text())["data"]["feature_norm"] == "row"


# ----------------------------------------------------------------- fuzz finds (s21 cli_fuzz)
def _save_graph(path, y=None, x=None):
    """A 12-node .npz (classes of sizes 2, 6, 4 with labels 0, 5, 9 unless `y` is given)."""
    import numpy as np

    from hiertail_fast.data.io import save_npz
    y = np.array([0, 0] + [5] * 6 + [9] * 4) if y is None else np.asarray(y)
    n = y.shape[0]
    x = np.random.default_rng(0).random((n, 4)) if x is None else x
    ring = np.arange(n)
    save_npz(path, np.stack([ring, (ring + 1) % n]), x, y)
    return path


def _save_split(path, **parts):
    import numpy as np
    with open(path, "wb") as fh:
        np.savez(fh, **parts)
    return path


def _exit_2(argv, capsys, monkeypatch=None) -> str:
    if monkeypatch is not None:
        _no_training(monkeypatch)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    last = err.strip().splitlines()[-1]                  # argparse: usage, then one line
    assert "Traceback" not in err and last.startswith("python -m hiertail_fast.train: error: ")
    return last


@pytest.mark.parametrize("extra, message", [
    (["--tau", "1e-7"], "--tau: must be a finite number >= 1e-06, got 1e-7"),
    (["--seed-base", "-5"], "--seed-base: must be an integer >= 0, got -5"),
    (["--seeds=-3,-2"], "--seeds: seed -3 is out of range [0, "),
    # without "=": argparse (3.11) took "-1,2" for an option, "expected at least one argument"
    # (a fresh-user audit); a value that starts like a negative number is a value now
    (["--seeds", "-1,2"], "--seeds: seed -1 is out of range [0, "),
    (["--seeds", "-3,"], "--seeds: seed -3 is out of range [0, "),
    (["--seeds", "-5e3"], "--seeds takes integers (a count or a list), got ['-5e3']"),
    (["--epochs", "-2e1"], "--epochs: must be an integer > 0, got -2e1"),
    (["--data-seed", "-1"], "--data-seed: must be an integer >= 0, got -1"),
    (["--seed-base", str(2**64)], f"--seed-base: '{2**64}' is too large (at most {2**64 - 1})"),
    (["--epochs", "1e19"], f"--epochs: '1e19' is too large (at most {2**63 - 1})"),
    (["--epochs", "1.5"], "--epochs: '1.5' is not an integer"),
    (["--method", "smote", "--im-class-num", "100"],
     "--im-class-num 100: --method smote takes the last N classes as the tail, N in [1, 5]"),
    # dropout 1 leaves no unit: refused up front, naming the option as typed
    (["--dropout", "1"], "--dropout must lie in [0, 1), got 1.0"),
    (["--method", "origin", "--dropout", "1"], "--dropout must lie in [0, 1), got 1.0"),
    (["--method", "graphmixup", "--pretrain-epochs", "2"],
     "--pretrain-epochs 2 must be < --epochs 2"),
])
def test_values_refused_before_training(extra, message, capsys):
    """These passed the parser and failed at training start with a traceback and exit 1."""
    assert message in _exit_2(TINY + extra, capsys)


def test_the_tail_size_may_be_every_class():
    """--im-class-num N takes the last N classes as the tail, N in [1, classes]: both ends
    are accepted by the up-front check, one class more refused (below 1: BaselineConfig)."""
    from hiertail_fast._train_cli import _check_method_run
    from hiertail_fast.baselines import BaselineConfig

    for n in (1, 5):
        _check_method_run(BaselineConfig(method="smote", im_class_num=n), 5, 2)
    with pytest.raises(ValueError, match=r"--im-class-num 6: .* N in \[1, 5\]"):
        _check_method_run(BaselineConfig(method="smote", im_class_num=6), 5, 2)
    # a method without tail classes never reads --im-class-num: its default 3 runs on 2 classes
    for method in ("origin", "graphens", "lte4g"):
        _check_method_run(BaselineConfig(method=method), 2, 2)


def test_counts_and_seeds_in_scientific_notation_are_read_exactly():
    """bench/scale.py took "--sizes 1e3" while the trainer refused "--nodes 1e3" as "not an
    integer": every single-integer option, the baselines' too, now reads an integer however
    written, exactly (not through a float), and seeds up to torch.manual_seed's 2**64 - 1
    (mutant: int() back)."""
    from hiertail_fast._train_cli import build_parser

    args = build_parser("t").parse_args(["--synthetic", "--nodes", "1.2e3", "--epochs", "2e1",
                                         "--seed-base", str(2**64 - 1), "--data-seed", "7e0"])
    assert (args.nodes, args.epochs, args.seed_base, args.data_seed) == (1200, 20, 2**64 - 1, 7)
    assert all(type(v) is int for v in (args.nodes, args.epochs, args.seed_base, args.data_seed))
    baseline = build_parser("t").parse_args(["--synthetic", "--method", "imgagn",
                                             "--disc-steps", "1e2"])
    assert baseline.disc_steps == 100 and type(baseline.disc_steps) is int


def test_graphmixup_pretraining_below_epochs_runs():
    res = main(TINY + ["--method", "graphmixup", "--pretrain-epochs", "1"])
    assert res["method"] == "graphmixup"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_triton_loss_backend_without_cuda(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")     # conftest enables the CPU interpreter
    err = _exit_2(TINY + ["--loss-backend", "triton"], capsys, monkeypatch)
    assert "--loss-backend triton cannot run on --device cpu" in err


def test_attention_loss_backend_is_a_choice(capsys, monkeypatch):
    """--loss-backend attention (the loss's fourth backend) trains; where torch has no fused
    attention kernels for the device, a one-line refusal before training."""
    res = main(TINY + ["--loss-backend", "attention"])
    assert res["config"]["loss_backend"] == "attention"
    import hiertail_fast._train_cli as cli

    monkeypatch.setattr(cli, "_attention_available", lambda device: False)
    err = _exit_2(TINY + ["--loss-backend", "attention"], capsys, monkeypatch)
    assert "--loss-backend attention cannot run on --device cpu" in err


def test_bad_data_and_split_files_refused_before_training(tmp_path, capsys, monkeypatch):
    import numpy as np

    good = _save_graph(tmp_path / "g.npz")
    tr, va, te = np.arange(0, 12, 3), np.arange(1, 12, 3), np.arange(2, 12, 3)
    big = np.zeros((12, 4))
    big[3, 2] = 1e300
    bad_x = tmp_path / "big.npz"
    with open(bad_x, "wb") as fh:     # save_npz refuses it: written by hand
        np.savez(fh, edge_index=np.array([[0], [1]]), x=big, y=np.arange(12) % 2)
    npy = tmp_path / "npy.npz"
    with open(npy, "wb") as fh:
        np.save(fh, np.zeros((3, 2)))
    nofeat = tmp_path / "nofeat.npz"
    with open(nofeat, "wb") as fh:
        np.savez(fh, edge_index=np.array([[0], [1]]), x=np.zeros((12, 0), np.float32),
                 y=np.arange(12) % 2)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    cases = [
        (["--split", _save_split(tmp_path / "v.npz", train=tr, val=va[:0], test=te)],
         "the 'val' set is empty"),
        (["--split", _save_split(tmp_path / "t.npz", train=tr, val=va, test=te[:0])],
         "the 'test' set is empty"),
        (["--split", npy], f"{npy}: holds a single .npy array"),
        (["--split", garbage], f"{garbage}: not a readable .npz file"),
    ]
    for extra, message in cases:
        err = _exit_2(["--data", str(good), "--epochs", "2", "--seeds", "1", "--no-progress",
                       *map(str, extra)], capsys, monkeypatch)
        assert message in err and "allow_pickle" not in err, err
    for path, message in [(bad_x, "'x' has values beyond float32's range"),
                          (nofeat, "'x' has no feature columns"),
                          (npy, "holds a single .npy array"),
                          (_save_graph(tmp_path / "one.npz", y=np.zeros(12, np.int64)),
                           "all have one class (label 0): node classification needs at least "
                           "2 classes")]:
        err = _exit_2(["--data", str(path), "--epochs", "2", "--no-progress"], capsys,
                      monkeypatch)
        assert f"{path}: " * (path.name != "one.npz") + message in err, err


def test_split_file_takes_masks_refuses_two_names_and_notes_overlaps(tmp_path, capsys,
                                                                        monkeypatch):
    """A split file may hold PyG's ``train_mask`` / ``val_mask`` / ``test_mask`` (booleans):
    the same runs as the node ids. Two arrays for one part (``train`` and ``train_mask``)
    are refused, not one of them picked unsaid. Parts that share nodes are allowed (the
    natural split does it for tiny classes) but said on stderr (they ran unsaid)."""
    import numpy as np

    data = _save_graph(tmp_path / "g.npz")
    tr, va, te = np.arange(0, 12, 3), np.arange(1, 12, 3), np.arange(2, 12, 3)
    mask = lambda idx: np.isin(np.arange(12), idx)
    results = []
    for name, parts in [("ids", dict(train=tr, val_idx=va, test=te)),
                        ("masks", dict(train_mask=mask(tr), val_mask=mask(va),
                                       test_mask=mask(te)))]:
        out = tmp_path / f"{name}.json"
        main(["--data", str(data), "--split", str(_save_split(tmp_path / f"{name}.npz", **parts)),
              "--epochs", "2", "--seeds", "1", "--hidden", "4", "--no-progress", "--json",
              str(out)])
        assert "share" not in capsys.readouterr().err
        results.append(json.loads(out.read_text())["runs"][0]["test"])
    assert results[0] == results[1]
    overlap = _save_split(tmp_path / "overlap.npz", train=tr, val=np.r_[va, tr[:2]],
                          test=np.r_[te, tr[:1], va[:1]])
    main(["--data", str(data), "--split", str(overlap), "--epochs", "2", "--seeds", "1",
          "--hidden", "4", "--no-progress"])
    err = capsys.readouterr().err
    assert (f"note: --split {overlap}: train and val share 2 node(s); train and test share 1 "
            "node(s); val and test share 2 node(s)") in err, err   # tr[0], va[0]
    both = _save_split(tmp_path / "both.npz", train=tr, train_mask=mask(tr), val=va, test=te)
    err = _exit_2(["--data", str(data), "--split", str(both), "--epochs", "2", "--no-progress"],
                  capsys, monkeypatch)   # (stops training: last)
    assert "holds 'train' and 'train_mask': one array per part" in err, err


def test_json_never_overwrites_an_input(tmp_path, capsys, monkeypatch):
    import numpy as np

    data = _save_graph(tmp_path / "g.npz")
    split = _save_split(tmp_path / "s.npz", train=np.arange(0, 12, 3),
                        val=np.arange(1, 12, 3), test=np.arange(2, 12, 3))
    before = {p: p.read_bytes() for p in (data, split)}
    link = tmp_path / "link.npz"
    link.symlink_to(data)
    base = ["--data", str(data), "--split", str(split), "--epochs", "2", "--no-progress"]
    for target, option in [(data, "--data"), (split, "--split"), (link, "--data"),
                           (tmp_path / "." / "s.npz", "--split")]:
        err = _exit_2(base + ["--json", str(target)], capsys, monkeypatch)
        assert f"--json {target} is the same file as {option}" in err, err
    assert all(p.read_bytes() == b for p, b in before.items())


def test_json_never_replaces_a_fifo_or_moves_onto_an_input(tmp_path, capsys, monkeypatch):
    """Three ways --json destroyed what it should not (a CLI audit): a FIFO (or device: run as
    root, --json /dev/null replaced /dev/null) became a JSON file with the FIFO kept as .prev;
    an existing --json moved onto its .prev path when that was the --data file; a .prev path
    that is a directory was found only after training. All refused before training now."""
    import numpy as np

    data = _save_graph(tmp_path / "g.prev.npz")
    before = data.read_bytes()
    base = ["--data", str(data), "--epochs", "2", "--no-progress"]
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    err = _exit_2(base + ["--json", str(fifo)], capsys, monkeypatch)
    assert f"--json {fifo} cannot be written: {fifo} is not a regular file" in err, err
    assert fifo.is_fifo() and not (tmp_path / "fifo.prev.json").exists()
    old = tmp_path / "g.npz"                    # its .prev path is the --data file
    old.write_text("old results")
    err = _exit_2(base + ["--json", str(old)], capsys, monkeypatch)
    assert f"{data} (where the existing --json file is kept) is the same file as --data" in err
    assert data.read_bytes() == before and old.read_text() == "old results"
    res = tmp_path / "r.json"
    res.write_text("old results")
    (tmp_path / "r.prev.json").mkdir()
    err = _exit_2(TINY + ["--json", str(res)], capsys, monkeypatch)
    assert (f"--json {res} cannot be written: the file it replaces is kept as "
            f"{tmp_path / 'r.prev.json'}, but {tmp_path / 'r.prev.json'} is a directory") in err
    assert res.read_text() == "old results"
    assert np.load(data)["y"].size                 # the input still loads


def test_result_writers_never_rename_over_a_fifo(tmp_path):
    """The mechanism under every result file (``_files``): a FIFO (or device, directory) at the
    target or at the .prev path an existing target moves to is refused before anything is
    written or moved, for callers that did not check first."""
    from hiertail_fast._files import atomic_write_text, replace_keeping_prev

    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    for write in (atomic_write_text, replace_keeping_prev):
        with pytest.raises(FileExistsError, match=f"{fifo} is not a regular file"):
            write(fifo, "new")
        assert fifo.is_fifo()
    res = tmp_path / "r.json"
    res.write_text("old")
    os.mkfifo(tmp_path / "r.prev.json")
    with pytest.raises(FileExistsError, match="r.prev.json is not a regular file"):
        replace_keeping_prev(res, "new")
    assert res.read_text() == "old" and (tmp_path / "r.prev.json").is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.prev.json", "x.json"]


def test_divergence_exits_1_with_one_line_and_no_json(tmp_path, capsys):
    """lr 1e30: HierTail ended in a traceback from gcn_propagate; Origin exited 0 with the
    metrics of constant predictions and "final_loss": NaN in --json."""
    for method in ("hiertail", "origin"):
        out = tmp_path / f"{method}.json"
        with pytest.raises(SystemExit) as exc:
            main(TINY + ["--lr", "1e30", "--method", method, "--json", str(out)])
        err = capsys.readouterr().err
        assert exc.value.code == 1 and "Traceback" not in err
        last = err.strip().splitlines()[-1]
        assert "training diverged at epoch" in last and "lower the learning rate" in last
        assert not out.exists()


def test_json_is_strict_non_finite_floats_as_null(tmp_path, monkeypatch):
    import hiertail_fast._train_cli as cli

    real = cli.run_seeds

    def with_nan(*args, **kwargs):
        res = real(*args, **kwargs)
        res["runs"][0]["final_loss"]["total"] = float("nan")
        res["runs"][0]["extra"] = [float("inf"), torch.tensor(float("-inf"))]
        return res

    monkeypatch.setattr(cli, "run_seeds", with_nan)
    out = tmp_path / "r.json"
    main(TINY + ["--json", str(out)])

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    run = json.loads(out.read_text(), parse_constant=refuse)["runs"][0]
    assert run["final_loss"]["total"] is None and run["extra"] == [None, None]


def test_json_maps_relabelled_classes_back_and_help_says_so(tmp_path, capsys):
    data = _save_graph(tmp_path / "g.npz")         # sizes: label 0: 2, 5: 6, 9: 4
    out = tmp_path / "r.json"
    main(["--data", str(data), "--epochs", "2", "--seeds", "1", "--hidden", "4",
          "--no-progress", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["data"]["original_labels"] == [5, 9, 0]    # class i of test_per_class
    assert len(res["runs"][0]["test_per_class"]) == 3
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "relabelled by size" in help_text and "original_labels" in help_text


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--bogus"], ["--data", "a.npz",
                                                                     "--synthetic"]])
def test_errors_are_one_line(argv, capsys):
    # argparse printed the whole usage first: ~60 lines with the message last (a CLI audit)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("python -m hiertail_fast.train: error: ")
    assert err[0].endswith("(python -m hiertail_fast.train --help lists the options)")


def test_split_errors_name_the_file_and_spot_integer_masks(tmp_path, capsys):
    # a 0/1 integer mask was reported as "train has duplicate node ids", naming no file
    import numpy as np
    mask = np.zeros(120, dtype=np.int64)
    mask[:30] = 1
    path = tmp_path / "masks.npz"
    np.savez(path, train=mask, val=mask, test=mask)
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--split", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"--split {path}: train has duplicate node ids (it looks like a 0/1 mask" in err


def test_ctrl_c_is_one_line_and_keeps_the_json(tmp_path, capsys, monkeypatch):
    # a torch-internal traceback before (a CLI audit)
    import hiertail_fast._train_cli as cli

    out = tmp_path / "res.json"
    out.write_text("old")
    err = ctrl_c_line(monkeypatch, capsys, cli, "run_seeds",
                      lambda: main(TINY + ["--json", str(out)]))
    assert f"interrupted (the seeds finished before are on the lines above); --json {out} not " \
           "written (the existing file is unchanged)" in err
    assert out.read_text() == "old"


@pytest.mark.parametrize("json_arg", [False, True])
def test_ctrl_c_claims_no_json_that_is_not_there(tmp_path, capsys, monkeypatch, json_arg):
    """The Ctrl-C line speaks of an existing --json file "unchanged" only when there is one,
    and of --json only when it was given (a mutation audit, s43: "--json None not written",
    or an "existing file" that never existed, passed the suite)."""
    import hiertail_fast._train_cli as cli

    out = tmp_path / "new.json"
    err = ctrl_c_line(monkeypatch, capsys, cli, "run_seeds",
                      lambda: main(TINY + (["--json", str(out)] if json_arg else [])))
    last = err.strip().splitlines()[-1]
    head = "interrupted (the seeds finished before are on the lines above)"
    assert not out.exists()
    assert last.endswith(head + (f"; --json {out} not written" if json_arg else "")), last


@pytest.mark.parametrize("written", [False, True])
def test_ctrl_c_while_the_json_is_written_is_one_line(tmp_path, capsys, monkeypatch, written):
    """Ctrl-C in the final --json write printed a traceback. It is one line and exit 130 now,
    saying whether the file holds the results: the rotation holds a Ctrl-C until its moves
    are done, so it arrives either before it (the file as it was) or after, as a
    DeferredInterrupt (written: the stand-in writes the file, then raises that)."""
    import hiertail_fast._train_cli as cli

    out = tmp_path / "res.json"
    out.write_text("old")
    err = ctrl_c_line(monkeypatch, capsys, cli, "replace_keeping_prev",
                      lambda: main(TINY + ["--json", str(out)]), held=written)
    last = err.strip().splitlines()[-1]
    if written:
        assert last.endswith(f"interrupted after --json {out} was written")
        assert json.loads(out.read_text())["method"] == "hiertail"
    else:
        assert last.endswith(f"interrupted while writing --json {out}; the existing file is "
                             "unchanged")
        assert out.read_text() == "old"


@pytest.mark.parametrize("stage, target, error, words", [
    ("data", "_load_data", MemoryError("Unable to allocate 146. TiB for an array with shape "
                                       "(20, 1000000000000) and data type float64"),
     "out of memory while the data was built or loaded (Unable to allocate 146. TiB"),
    ("training", "run_seeds", RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                           "DefaultCPUAllocator: can't allocate memory: you "
                                           "tried to allocate 7680000000 bytes."),
     "out of memory while training ([enforce fail at alloc_cpu.cpp:127]"),
    ("training", "run_seeds", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                     "20.00 GiB"),
     "out of memory while training (CUDA out of memory. Tried to allocate 20.00 GiB)"),
    # Python's own MemoryError ([0] * 10**13) has no message: named by its type (a862b01's
    # fallback, unguarded: a fix-test check, session 68)
    ("training", "run_seeds", MemoryError(), "out of memory while training (MemoryError);"),
])
def test_out_of_memory_is_one_line_and_exit_1(stage, target, error, words, tmp_path, capsys,
                                              monkeypatch):
    """--features 10**12 (numpy's MemoryError while the synthetic graph is drawn) or --hidden
    30000000 (torch's CPU allocator, building the model) ended in a traceback: sizes the
    options accept can still exceed memory. Now one line naming the stage and what failed,
    exit 1 as a diverged run (a run's outcome, not a refused option), and no --json; the
    stand-ins raise the messages seen here with those options under an 8 GB ulimit."""
    import hiertail_fast._train_cli as cli

    out = tmp_path / "res.json"

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(cli, target, fail)
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--json", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"python -m hiertail_fast.train: error: {words}"), line
    assert line.endswith("Fewer nodes or features, a smaller --hidden or a device with more "
                         "memory may fit")
    assert ("nothing was written" if stage == "data" else f"--json {out} not written") in line
    assert not out.exists()


def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch):
    """Only allocation failures get the out-of-memory line: any other RuntimeError from a run
    is a bug to see whole, with its traceback (mutant: every RuntimeError caught)."""
    import hiertail_fast._train_cli as cli

    def fail(*args, **kwargs):
        raise RuntimeError("shape mismatch in some op")

    monkeypatch.setattr(cli, "run_seeds", fail)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        main(TINY)


def test_ctrl_c_while_the_data_loads_is_one_line(tmp_path, capsys, monkeypatch):
    """Ctrl-C before training (a large .npz loading, PyG downloading): one line and exit 130
    as during training, not a traceback, and no --json written."""
    import hiertail_fast._train_cli as cli

    out = tmp_path / "res.json"
    err = ctrl_c_line(monkeypatch, capsys, cli, "_load_data",
                      lambda: main(TINY + ["--json", str(out)]))
    assert "interrupted before training; nothing was written" in err and not out.exists()


def test_table_names_the_size_setting_hyper_parameters(capsys):
    # the paper preset's hidden size depends on the dataset's name (64 on email / wiki /
    # blogcatalog, else 128): the table showed none of it, only --json did (a CLI audit)
    main(TINY)
    assert "HierTail config=paper seeds=1 hidden=8 lr=" in capsys.readouterr().out
    main(TINY[:TINY.index("--hidden")] + TINY[TINY.index("--hidden") + 2:])
    assert " hidden=128 " in capsys.readouterr().out


def test_every_option_has_help():
    # --nodes, --epochs, --config ... had none (a CLI audit)
    from hiertail_fast._train_cli import build_parser
    from hiertail_fast.experiments.cli import build_parser as experiments_parser
    for parser in (build_parser(), experiments_parser()):
        bare = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
        assert not bare, (parser.prog, bare)


def test_cli_options_reach_the_config_and_the_graph():
    """--augment-a2 on / off and --fix-cluster-labels reach the HierTail config, the paper's
    per-dataset hidden width applies to --config paper only, and --homophily / --data-seed
    reach the synthetic graph: each could be dropped or inverted without a test failing (a
    mutation audit)."""
    from hiertail_fast._train_cli import _config_from_args, _load_source, build_parser

    parse = build_parser().parse_args
    assert _config_from_args(parse(["--synthetic", "--augment-a2", "on"]), None).augment_a2
    assert not _config_from_args(parse(["--synthetic", "--augment-a2", "off"]),
                                 None).augment_a2
    official = ["--synthetic", "--config", "official"]        # (the paper preset fixes them)
    assert _config_from_args(parse([*official, "--fix-cluster-labels"]), None).fix_cluster_labels
    assert not _config_from_args(parse(official), None).fix_cluster_labels
    official = _config_from_args(parse(["--dataset", "email", "--config", "official"]), "email")
    assert official.hidden == HierTailConfig.official().hidden
    assert _config_from_args(parse(["--dataset", "email"]), "email").hidden == 64
    # an explicit --hidden wins over the paper's per-dataset width (it was replaced by 64 with
    # every test passing; mutation audit, session 69)
    assert _config_from_args(parse(["--dataset", "email", "--hidden", "32"]), "email").hidden == 32
    assert _config_from_args(parse(["--data", "Email.npz", "--hidden", "8"]), "Email").hidden == 8
    # a --data file's stem in any case, as --dataset's name (Email.npz took 128: an audit)
    for stem, hidden in (("Email", 64), ("WIKI", 64), ("BlogCatalog", 64), ("BLOG", 64),
                         ("email_v2", 128), ("cora-full", 128), ("cora_full", 128)):
        assert _config_from_args(parse(["--data", f"{stem}.npz"]), stem).hidden == hidden
    args = parse(["--synthetic", "--nodes", "200", "--classes", "4", "--features", "8",
                  "--homophily", "0.3", "--data-seed", "7"])
    data, info = _load_source(args)
    want = make_synthetic_graph(200, num_classes=4, avg_degree=10.0, homophily=0.3,
                                num_features=8, seed=7)
    assert torch.equal(data.edge_index, want.edge_index) and torch.equal(data.x, want.x)
    assert (info["homophily"], info["data_seed"], info["avg_degree"]) == (0.3, 7, 10.0)


@pytest.mark.parametrize("extra, said", [
    (["--nodes", "50"], "--nodes only applies to --synthetic"),
    (["--classes", "5", "--homophily", "0.3", "--data-seed", "4"],
     "--classes, --homophily, --data-seed only apply to --synthetic"),
    (["--avg-degree", "4", "--features", "16"], "--avg-degree, --features only apply to "),
    (["--fix-cluster-labels"], "--fix-cluster-labels only applies to --config official"),
    (["--compound-pool-bug"], "--compound-pool-bug only applies to --config official"),
])
@pytest.mark.parametrize("source", [["--data", "g.npz"], ["--dataset", "email"]])
def test_options_that_do_not_apply_are_refused(extra, said, source, capsys, monkeypatch):
    """The generator's options with --data or --dataset, and --fix-cluster-labels on the paper
    config (which labels by the nearest prototype already), were silently ignored: same
    results, same recorded config (a fresh-user audit, session 66). Refused, one line."""
    last = _exit_2([*source, *extra], capsys, monkeypatch)
    assert said in last


@pytest.mark.parametrize("flag", ["--fix-cluster-labels", "--compound-pool-bug"])
def test_hiertails_config_flags_with_a_baseline_name_the_method(flag, capsys, monkeypatch):
    """With a baseline --method, HierTail's flags are refused as HierTail's (the baselines'
    check), not as "only applies to --config official", whose advice led to a second refusal
    (a review's find)."""
    last = _exit_2(["--synthetic", "--method", "graphsmote_t", flag], capsys, monkeypatch)
    assert f"{flag}: only for --method hiertail" in last


def test_the_generators_defaults_are_recorded_when_not_given(monkeypatch):
    """With --synthetic and no generator option, the run records the defaults it used."""
    from hiertail_fast._train_cli import SYNTHETIC_DEFAULTS, _load_source, build_parser

    _, info = _load_source(build_parser().parse_args(["--synthetic", "--nodes", "60",
                                                      "--classes", "3", "--features", "4"]))
    assert {k: info[k] for k in SYNTHETIC_DEFAULTS} == dict(SYNTHETIC_DEFAULTS, nodes=60,
                                                            classes=3, features=4)


def test_result_records_the_run_as_it_ran(monkeypatch):
    """The result's provenance: the threads torch used, the config's weight decay (its
    default when none was given), the argv given to main(), the edge count of the graph (each
    could change unnoticed: a mutation audit). The training itself is faked."""
    import hiertail_fast._train_cli as cli

    monkeypatch.setattr(cli, "run_seeds", lambda data, cfg, seeds, **kw: {
        "seeds": seeds, "split": "natural", "runs": [], "summary": {}})
    monkeypatch.setattr(cli, "format_table", lambda result: "")
    # (a large graph without --threads: torch's own thread count is recorded, not None)
    argv = ["--synthetic", "--nodes", "5000", "--classes", "4", "--features", "4",
            "--no-progress"]
    res = cli.main(argv)
    g = make_synthetic_graph(5000, num_classes=4, avg_degree=10.0, homophily=0.8,
                             num_features=4, seed=0)
    assert res["argv"] == argv and res["training"]["threads"] == torch.get_num_threads()
    assert res["training"]["weight_decay"] == HierTailConfig.paper().weight_decay
    assert res["data"]["num_edges"] == g.edge_index.shape[1]


MODEL_OPTIONS = [("--hidden", "24", "hidden", 24), ("--gamma", "0.3", "gamma", 0.3),
                 ("--tau", "0.7", "tau", 0.7), ("--dropout", "0.25", "dropout", 0.25),
                 ("--lr", "0.05", "lr", 0.05), ("--weight-decay", "0.125", "weight_decay", 0.125),
                 ("--loss-backend", "reference", "loss_backend", "reference")]


@pytest.mark.parametrize("preset", ["paper", "official"])
@pytest.mark.parametrize("flag, text, field, value", MODEL_OPTIONS)
def test_each_model_option_reaches_the_config(preset, flag, text, field, value):
    """Every numeric model option of the trainer reaches HierTailConfig on both presets:
    dropping --weight-decay, --dropout or --tau from the forwarded keys trained with the
    preset's value and passed the suite (a mutation audit)."""
    from hiertail_fast._train_cli import _config_from_args, build_parser

    args = build_parser().parse_args(["--synthetic", "--config", preset, flag, text])
    assert getattr(HierTailConfig.named(preset), field) != value     # (the test can tell)
    assert getattr(_config_from_args(args, None), field) == value


def _main_with_training_faked(monkeypatch, argv) -> dict:
    """main(argv) with run_seeds replaced by a recorder: its keyword arguments, cfg and seeds."""
    import hiertail_fast._train_cli as cli

    seen: dict = {}

    def fake(data, cfg, seeds, **kw):
        seen.update(kw, cfg=cfg, seeds=seeds)
        return {"seeds": seeds, "split": "natural", "runs": [], "summary": {}}

    monkeypatch.setattr(cli, "run_seeds", fake)
    monkeypatch.setattr(cli, "format_table", lambda result: "")
    cli.main(argv)
    return seen


def test_compound_pool_bug_and_the_run_options_reach_run_seeds(monkeypatch):
    """--compound-pool-bug (the official code's seed-dependent first pool ratio), --epochs,
    --patience and --seeds reach run_seeds; main() passing compound_pool_bug=False passed the
    suite, whose tests call run_seeds directly (a mutation audit)."""
    tiny = ["--synthetic", "--nodes", "60", "--classes", "3", "--features", "4", "--no-progress",
            "--config", "official"]
    seen = _main_with_training_faked(monkeypatch, [*tiny, "--compound-pool-bug", "--epochs", "7",
                                                   "--patience", "3", "--seeds", "2"])
    assert seen["compound_pool_bug"] is True and seen["cfg"].name == "official"
    assert (seen["epochs"], seen["patience"], seen["seeds"]) == (7, 3, [123, 124])
    assert _main_with_training_faked(monkeypatch, tiny)["compound_pool_bug"] is False


@pytest.mark.parametrize("preset, hidden", [("paper", 64), ("official", 128)])
def test_main_applies_the_paper_hidden_width_of_the_dataset(monkeypatch, data_dir, preset,
                                                           hidden):
    """main() hands the loaded dataset's name to the config: the paper preset trains Email with
    hidden 64 (--help: 'paper: 64 on email/wiki/blogcatalog'). Passing None silently trained it
    with 128 (a mutation audit; the existing test calls _config_from_args with the name)."""
    seen = _main_with_training_faked(monkeypatch, [
        "--data", str(data_dir / "email.npz"), "--config", preset, "--seeds", "1",
        "--epochs", "1", "--no-progress"])
    assert seen["cfg"].hidden == hidden


def test_download_reaches_load_dataset_and_needs_a_dataset(tmp_path, monkeypatch, capsys):
    """The missing-dataset error advised '--download', which the trainer did not have (a
    README audit: 'unrecognized arguments'). It passes download=True to load_dataset, and is
    refused without --dataset."""
    import hiertail_fast.data.datasets as datasets

    with pytest.raises(SystemExit) as exc:
        main(["--synthetic", "--download", "--epochs", "1"])
    assert exc.value.code == 2 and "--download only applies to --dataset" in (
        capsys.readouterr().err)
    seen = {}

    def fake_load(name, root, download=False, **kwargs):
        seen.update(name=name, download=download)
        raise FileNotFoundError("stop here (test)")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    for flag in ([], ["--download"]):
        with pytest.raises((SystemExit, FileNotFoundError)):
            main(["--dataset", "email", "--root", str(tmp_path), *flag, "--epochs", "1"])
        assert seen == {"name": "email", "download": bool(flag)}
    # and the error of a missing dataset names where the option is
    monkeypatch.undo()
    with pytest.raises(FileNotFoundError, match="--download option of python -m "
                                                "hiertail_fast.train"):
        datasets.load_dataset("cora_full", tmp_path)


def test_a_result_file_moved_away_during_the_rotation_is_not_a_crash(tmp_path, monkeypatch):
    """Another process moving the current result file between the rotation's check and its
    rename crashed the writer with FileNotFoundError after all the work (a concurrency audit:
    scale.py lost its sweep, experiments their summary): the file is taken as gone, the new
    one written, nothing kept."""
    from hiertail_fast import _files

    target = tmp_path / "r.json"
    target.write_text("old")
    real_replace = os.replace

    def racing_replace(src, dst):
        if Path(src) == target:              # the rotation: another process got there first
            target.unlink()
        return real_replace(src, dst)

    monkeypatch.setattr(_files.os, "replace", racing_replace)
    assert _files.replace_keeping_prev(target, "new") is None
    assert target.read_text() == "new" and not (tmp_path / "r.prev.json").exists()


@pytest.mark.parametrize("how, prog", [("m-train", "python -m hiertail_fast.train"),
                                       ("m-package", "python -m hiertail_fast"),
                                       ("console-script", "hiertail-train")])
def test_usage_and_errors_name_the_command_the_user_ran(how, prog, tmp_path):
    """`hiertail-train --help` printed `usage: python -m hiertail_fast.train` (one fixed name
    for three entry points); each now names itself, its error lines too. The console script is
    stood in for by a file named like it (argv[0] is the script's path, as pip's wrapper)."""
    script = tmp_path / "hiertail-train"
    script.write_text("import sys\nfrom hiertail_fast.__main__ import main\nsys.exit(main())\n")
    entry = {"m-train": ["-m", "hiertail_fast.train"], "m-package": ["-m", "hiertail_fast"],
             "console-script": [str(script)]}[how]
    proc = _python(entry + ["--help"])
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {prog} "), proc.stdout[:200]
    proc = _python(entry + ["--synthetic", "--lr", "-1"])
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith(f"{prog}: error: ") and err[-1].endswith(
        f"({prog} --help lists the options)"), err[-1]


def test_ctrl_c_while_writing_a_new_json_says_nothing_was_written(tmp_path, capsys,
                                                                  monkeypatch):
    # a Ctrl-C during the --json write with no file there before: it claimed "the existing
    # file is unchanged" (101bbce's no-file case, unguarded: a fix-test check, session 68)
    import hiertail_fast._train_cli as cli

    out = tmp_path / "res.json"

    def interrupted(path, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "replace_keeping_prev", interrupted)
    with pytest.raises(SystemExit) as exc:
        main(TINY + ["--json", str(out)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 130 and not out.exists()
    assert last.endswith(f"interrupted while writing --json {out}; nothing was written"), last


def test_program_name_of_an_embedding_program(monkeypatch):
    # usage and error lines name the module for a program launched as a .py file or by -c, the
    # console script by its own name, and a name given by the entry as it is (only -c was
    # tested; mutation audit, session 69)
    from hiertail_fast.__main__ import program_name

    for argv0, name in (("/home/u/my_driver.py", "python -m hiertail_fast.train"),
                        ("-c", "python -m hiertail_fast.train"),
                        ("", "python -m hiertail_fast.train"),
                        ("/usr/bin/hiertail-train", "hiertail-train")):
        monkeypatch.setattr("sys.argv", [argv0])
        assert program_name() == name, argv0
    assert program_name("python -m hiertail_fast") == "python -m hiertail_fast"


def test_the_result_records_the_training_options_it_ran_with(monkeypatch):
    """The result's ``training`` and ``data`` parts and the forwarded run options: --patience
    as given, the config's lr when --lr is not given, the generator's default homophily (0.8,
    as --help says), --no-progress reaching run_seeds (progress bars otherwise), and the
    command line read from sys.argv when main() is given none (the console script)."""
    import hiertail_fast._train_cli as cli

    tiny = ["--synthetic", "--nodes", "60", "--classes", "3", "--features", "4"]
    argv = [*tiny, "--epochs", "7", "--patience", "3", "--no-progress"]
    seen: dict = {}

    def fake(data, cfg, seeds, **kw):
        seen.update(kw)
        return {"seeds": seeds, "split": "natural", "runs": [], "summary": {}}

    monkeypatch.setattr(cli, "run_seeds", fake)
    monkeypatch.setattr(cli, "format_table", lambda result: "")
    monkeypatch.setattr(sys, "argv", ["hiertail-train", *argv])
    res = cli.main()
    assert res["argv"] == argv and seen["progress"] is False
    assert (res["training"]["epochs"], res["training"]["patience"]) == (7, 3)
    assert res["training"]["lr"] == HierTailConfig.paper().lr
    assert res["data"]["homophily"] == 0.8
    cli.main(tiny)
    assert seen["progress"] is True

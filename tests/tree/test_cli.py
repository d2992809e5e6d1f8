"""The command line: `crnet plan` output and errors, `crnet demo` end to end."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def crnet(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "crnet", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_plan_json_has_the_documented_shape():
    proc = crnet("plan", "--fanout", "4", "--layers", "2", "--stragglers", "1", "--samples",
                 "60000", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"workers", "optimal_load", "max_local_samples", "samples", "nodes"}
    assert doc["workers"] == 20 and doc["samples"] == 60000
    assert doc["optimal_load"] == pytest.approx(1 / (2 + 4))
    assert doc["max_local_samples"] == 10000
    assert doc["nodes"][0] == {"name": "", "layer": 0, "local": [],
                               "responsibility": [[0, 60000, 1.0]]}
    for node in doc["nodes"]:
        assert set(node) == {"name", "layer", "local", "responsibility"}
        assert all(len(r) == 3 for r in node["local"] + node["responsibility"])


def test_plan_table_and_per_layer_lists():
    proc = crnet("plan", "--fanout", "4,3", "--stragglers", "1,0", "--samples", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "N = 16" in proc.stdout
    assert "layer 2: any 0 of the 3 children" in proc.stdout
    assert "0.2" in proc.stdout  # a node row


@pytest.mark.parametrize("args, message", [
    (["--fanout", "x", "--samples", "5"], "is not an integer or a comma list"),
    (["--fanout", "3", "--stragglers", "3", "--samples", "5"], "stragglers must be in 0..2"),
    (["--fanout", "3,3", "--layers", "3", "--samples", "5"], "lists 2 values but the tree has 3"),
    (["--fanout", "3"], "Missing option '--samples'"),
    (["--samples", "0"], "0 is not in the range x>=1"),
    (["--bogus"], "No such option"),
])
def test_plan_usage_errors(args, message):
    proc = crnet("plan", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_trains_exactly_with_stragglers():
    proc = crnet("demo", "--steps", "8", "--straggle-prob", "0.3", "--compute-ms", "5", "--json",
                 "--strict", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(proc.stdout) == summary   # stdout carries only the JSON: `| jq .` works
    assert set(summary) == {"steps", "mean_step_s", "max_rel_error", "stragglers_skipped",
                            "stragglers_injected", "final_loss"}
    assert summary["steps"] == 8
    assert summary["stragglers_injected"] > 0 and 0 < summary["final_loss"] < 0.6931  # < log 2
    assert summary["max_rel_error"] <= 1e-6
    assert summary["stragglers_skipped"] > 0
    assert summary["mean_step_s"] > 0


def test_help_lists_every_command_whole():
    proc = crnet("--help")
    assert proc.returncode == 0
    commands = proc.stdout.split("Commands:")[1].strip().splitlines()
    assert len(commands) >= 6 and not [c for c in commands if c.endswith("...")], commands


def test_demo_help_explains_every_option():
    from crnet.cli.demo import demo

    undocumented = [p.name for p in demo.params if not getattr(p, "help", None)]
    assert not undocumented
    assert "Features per sample" in crnet("demo", "--help").stdout


def test_plan_warns_when_workers_get_no_samples():
    proc = crnet("plan", "--fanout", "3", "--layers", "2", "--samples", "1")
    assert proc.returncode == 0
    assert ("warning: --samples 1 leaves 10 of the 12 workers with no samples to compute "
            "(fewer samples than workers)") in proc.stderr
    assert "warning" not in crnet("plan", "--fanout", "3", "--layers", "2", "--samples",
                                  "600").stderr


def test_plan_counts_in_words():
    proc = crnet("plan", "--fanout", "2", "--layers", "1", "--samples", "1")
    assert "stragglers 1, 1 layer\n" in proc.stdout
    assert "(1.0 of 1 sample)" in proc.stdout and "receives 2 vectors per step" in proc.stdout


def test_the_installed_cli_does_not_reach_for_the_benchmarks():
    """The benchmarks live in the clone (``python -m benchmarks``): the installed CLI neither
    has a command for them nor imports benchmarks/ or edits sys.path for it."""
    proc = crnet("bench", "--preset", "quick")
    assert proc.returncode == 2 and "No such command 'bench'" in proc.stderr
    probe = ("import sys; before = list(sys.path); import crnet.cli; "
             "assert sys.path == before; assert 'benchmarks' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", probe], timeout=60).returncode == 0


@pytest.mark.parametrize("command", [["plan", "--samples", "600"], ["model", "--trials", "10"]])
def test_default_stragglers_fit_a_fanout_of_one_as_in_crnetd(command):
    """--stragglers's default (1) is capped at fanout - 1 by one rule, crnetd's and every command's;
    typed, it is checked."""
    proc = crnet(*command, "--fanout", "1")
    assert proc.returncode == 0, proc.stderr
    typed = crnet(*command, "--fanout", "1", "--stragglers", "1")
    assert typed.returncode == 2 and "stragglers must be in 0..0 for fanout 1, got 1" in typed.stderr


def test_model_warns_of_a_step_over_an_hour_and_says_how_compute_is_read():
    """shifted-exp:1e-5,1 is a mean of 1 s per sample (MU is a rate per second): ~5 h steps."""
    proc = crnet("model", "--compute", "shifted-exp:1e-5,1", "--trials", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "over an hour" in proc.stderr and "MU is a rate per second" in proc.stderr
    sane = crnet("model", "--compute", "shifted-exp:10us,1e5/s", "--trials", "20")
    assert sane.returncode == 0, sane.stderr
    assert "warning" not in sane.stderr


def test_the_compute_help_says_the_units_of_a_and_mu():
    proc = crnet("model", "--help")
    text = " ".join(proc.stdout.split())
    assert "A = time per sample (20us" in text and "rate MU per second" in text


def help_examples():
    """Every example command line in every command's --help (indented lines that start with
    crnetd or crnet; a trailing backslash continues one), as (command name, argv)."""
    import shlex

    from crnet.cli import main

    examples = []
    for name in sorted(main.commands):
        text = crnet(name, "--help").stdout
        lines = iter(text.splitlines())
        for line in lines:
            if not line.startswith(" ") or line.split()[:1] not in (["crnetd"], ["crnet"]):
                continue
            while line.rstrip().endswith("\\"):
                line = line.rstrip()[:-1] + " " + next(lines).strip()
            examples.append((name, shlex.split(line)))
    return examples


def test_every_example_in_every_help_runs_as_printed(tmp_path):
    """crnetd's with --check-config (it would start); crnet's parsed by the command itself.
    The one path replaced is the cluster secret's, which the README's first step creates."""
    from crnet.cli import main

    secret = tmp_path / "secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    examples = help_examples()
    assert [argv[0] for _, argv in examples].count("crnetd") >= 2, examples
    for name, argv in examples:
        argv = [str(secret) if a == "/etc/crnet/secret" else a for a in argv]
        if argv[0] == "crnetd":
            proc = crnet("daemon", *argv[1:], "--check-config")
            assert proc.returncode == 0, (argv, proc.stderr)
        else:
            assert argv[1] == name, argv
            with main.commands[name].make_context(name, argv[2:]):   # a usage error raises
                pass

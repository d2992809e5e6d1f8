"""crnetd's configuration (crnet/config/effective.py): precedence, --check-config, the CLI's messages,
SIGHUP re-reading the log level of a running daemon, the parent's name that never resolves."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from crnet import AsyncClient, defaults
from crnet.cli import crnetd
from crnet.client.aio import client_socket_path
from crnet.coding.plan import Tree
from crnet.config.effective import effective_config
from crnet.node.client_socket import ClientSocket
from crnet.tools.launch import MASTER, LocalTree

from ..helpers import REPO
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)

# --insecure: crnetd listens without a secret, even on loopback, only when told (issue 26).
MASTER_ARGS = ["--role", "master", "--listen", "127.0.0.1:0", "--samples", "4", "--fanout", "2",
               "--layers", "1", "--stragglers", "1", "--insecure"]


def check(args, env=None):
    """``crnetd --check-config`` in-process: (exit code, output)."""
    env = {k: None for k in os.environ if k.startswith("CRNET_")} | (env or {})
    got = CliRunner().invoke(crnetd, [*args, "--check-config"], env=env)
    return got.exit_code, got.output


def entry(output: str, key: str) -> tuple[str, str]:
    """The value and source --check-config printed for ``key``."""
    for line in output.splitlines():
        if line.startswith(f"{key} = "):
            value, _, source = line[len(key) + 3:].partition("  # ")
            return value.strip(), source.strip()
    raise AssertionError(f"no {key} in\n{output}")


@pytest.mark.parametrize("flag, env, in_file, want, source", [
    (None, None, None, "30.0", "default"),
    (None, None, 5, "5.0", "file"),
    (None, 9, 5, "9.0", "env CRNET_TIMEOUT"),
    (7, 9, 5, "7.0", "flag"),
    (7, None, None, "7.0", "flag"),
    (None, 9, None, "9.0", "env CRNET_TIMEOUT"),
])
def test_flag_beats_env_beats_file_beats_default(tmp_path, monkeypatch, flag, env, in_file, want,
                                                 source):
    config = tmp_path / "crnetd.toml"
    config.write_text("role = 'master'\nlisten = '127.0.0.1:0'\nsamples = 4\nfanout = [2]\n"
                      "insecure = true\n" + (f"timeout = {in_file}\n" if in_file is not None else ""))
    args = ["--config", str(config)] + (["--timeout", str(flag)] if flag is not None else [])
    code, out = check(args, {"CRNET_TIMEOUT": str(env)} if env is not None else {})
    assert code == 0, out
    assert entry(out, "timeout") == (want, f"file {config}" if source == "file" else source)
    assert entry(out, "fanout") == ("[2]", f"file {config}")
    # The same through click's own parsing into the Settings run_node gets.
    for k in [k for k in os.environ if k.startswith("CRNET_")]:
        monkeypatch.delenv(k)
    if env is not None:
        monkeypatch.setenv("CRNET_TIMEOUT", str(env))
    ctx = crnetd.make_context("crnetd", args)
    assert effective_config(ctx).settings.timeout == float(want)


def test_config_file_from_crnet_config_and_the_stragglers_default(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('role = "master"\nlisten = "127.0.0.1:7070"\nsamples = 60000\n'
                      'fanout = [3, 2]\nstragglers = "1,0"\nresult_memory = "2GiB"\n'
                      'insecure = true\n')
    code, out = check([], {"CRNET_CONFIG": str(config)})
    assert code == 0, out
    assert entry(out, "listen") == ('"127.0.0.1:7070"', f"file {config}")
    assert entry(out, "stragglers") == ("[1, 0]", f"file {config}")
    assert entry(out, "result_memory") == (str(2 << 30), f"file {config}")
    assert entry(out, "client_socket") == (f'"{defaults.CLIENT_SOCKET}"', "default")
    assert "# parent is not set" in out


def test_check_config_never_prints_the_secret(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("f00d" * 16)
    secret.chmod(0o600)
    code, out = check(["--role", "master", "--listen", "0.0.0.0:7070", "--samples", "4",
                       "--secret-file", str(secret)])
    assert code == 0, out
    assert entry(out, "secret_file") == (f'"{secret}"', "flag")
    assert "f00d" not in out


@pytest.mark.parametrize("text, message", [
    ("fanuot = 3", "unknown key 'fanuot'"),
    ("client-socket = '/x'", "unknown key 'client-socket' (did you mean 'client_socket'? keys use _)"),
    ("check_config = true", "unknown key 'check_config'"),
    ("timeout = 'soon'", "timeout: 'soon' is not a valid float range"),
    ("timeout = true", "timeout must be a string or a number, not true"),
    ("strict = 1", "strict must be true or false, not 1"),
    ("fanout = [3, 'x']", 'fanout must be an integer or a list of integers, not [3, "x"]'),
    ("listen = '127.0.0.1:70000'", "listen: port 70000 is out of range 0..65535"),
    ("log_level = 'loud'", "log_level: 'loud' is not one of"),
    ("timeout = [", "is not valid TOML"),
])
def test_bad_config_file_exits_2_naming_the_key_and_the_file(tmp_path, text, message):
    config = tmp_path / "crnetd.toml"
    config.write_text(text + "\n")
    code, out = check(["--config", str(config), *MASTER_ARGS])
    assert code == 2, out
    assert f"Error: {config}" in out and message in out, out


def test_missing_config_file_exits_2(tmp_path):
    code, out = check(["--config", str(tmp_path / "none.toml"), *MASTER_ARGS])
    assert code == 2 and f"cannot read the config file {tmp_path / 'none.toml'}" in out


@pytest.mark.parametrize("args, env, message", [
    (["--role", "master"], {}, "--role master needs --listen and --samples"),
    (["--role", "master", "--samples", "4"], {}, "--role master needs --listen\n"),
    (["--role", "master", "--listen", ":7070"], {}, "--role master needs --samples\n"),
    (["--role", "master", "--listen", "127.0.0.1:70000"], {},
     "port 70000 is out of range 0..65535"),
    (["--role", "node", "--parent", "master:0"], {}, "port 0 is out of range 1..65535"),
    (["--role", "master", "--listen", ":1", "--samples", "4", "--chunk-bytes", "512"], {},
     "'512' is below 1 KiB (or say auto)"),
    (["--role", "master", "--listen", ":1", "--samples", "4", "--chunk-bytes", "big"], {},
     "Invalid value for '--chunk-bytes'"),
    (["--role", "node", "--parent", "master"], {}, "'master' is not HOST:PORT"),
    (["--role", "node", "--parent", "m:7070", "--fanout", "3", "--code", "crc"], {},
     "--fanout (flag), --code (flag): only the master takes these options"),
    (["--role", "node", "--parent", "m:7070"], {"CRNET_SAMPLES": "8"},
     "--samples (env CRNET_SAMPLES): only the master takes this option"),
    (["--role", "master", "--listen", ":1", "--samples", "4", "--fanout", "1",
      "--stragglers", "1"], {}, "stragglers must be in 0..0 for fanout 1, got 1"),
    (["--role", "master", "--listen", "127.0.0.1:1", "--samples", "4", "--tls-key", __file__], {},
     "--tls-key needs --tls-cert, --tls-key and --tls-ca"),
    (["--role", "master", "--listen", "127.0.0.1:1", "--samples", "4", "--client-group", "no-such-grp"],
     {}, "no group 'no-such-grp'"),
])
def test_crnetd_names_what_is_wrong(args, env, message):
    code, out = check(args, env)
    assert code == 2, out
    assert message in out + "\n", out


def test_node_refuses_every_master_only_option():
    code, out = check(["--role", "node", "--parent", "m:7070", "--chunk-bytes", "4096",
                       "--scheme", "gc", "--workers", "3", "--layers", "2", "--stragglers", "0",
                       "--samples", "9"])
    assert code == 2
    for option in ("--layers", "--stragglers", "--samples", "--chunk-bytes", "--scheme",
                   "--workers"):
        assert f"{option} (flag)" in out, out


def test_fanout_1_takes_the_default_stragglers_as_0():
    code, out = check(["--role", "master", "--listen", "127.0.0.1:1", "--samples", "4",
                       "--fanout", "1", "--layers", "1", "--insecure"])
    assert code == 0, out
    assert entry(out, "stragglers") == ("[0]", "default, at most the fanout - 1")


def test_crnetd_and_client_agree_on_the_default_socket(monkeypatch):
    monkeypatch.delenv("CRNET_CLIENT_SOCKET", raising=False)
    code, out = check(MASTER_ARGS)
    assert code == 0
    assert entry(out, "client_socket") == (f'"{client_socket_path(None)}"', "default")
    assert client_socket_path(None) == "/run/crnet/client.sock"


async def test_client_socket_directory_is_made_or_named(tmp_path):
    async def accept(sock):
        sock.close()

    made = ClientSocket(str(tmp_path / "run" / "client.sock"), accept)
    await made.start()
    try:
        assert (tmp_path / "run" / "client.sock").exists()
        assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
        assert (tmp_path / "run").stat().st_uid == os.geteuid()
    finally:
        made.close()
    deep = tmp_path / "a" / "b" / "client.sock"
    with pytest.raises(OSError, match=f"cannot create the client socket {deep}: its directory "
                                      f"{deep.parent} is missing and could not be created"):
        await ClientSocket(str(deep), accept).start()
    assert not (tmp_path / "a").exists()


def test_parent_name_that_does_not_resolve_warns_then_exits_2(tmp_path):
    got = subprocess.run(
        [sys.executable, "-m", "crnet", "daemon", "--role", "node", "--parent",
         "no-such-host.invalid:7070", "--resolve-timeout", "1", "--client-socket",
         str(tmp_path / "n.sock")], capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, got.stderr
    lines = got.stderr.splitlines()
    warned = [line for line in lines if "level=warning" in line and "does not resolve" in line]
    assert warned and "'no-such-host.invalid'" in warned[0], got.stderr
    assert any("level=error" in line and "'no-such-host.invalid' does not resolve" in line
               and "giving up" in line for line in lines), got.stderr


async def test_sighup_rereads_the_log_level_of_a_running_daemon(tmp_path):
    """Master and one worker; the master's level comes from its config file (info: no
    "step N done" lines); after the file says debug and a SIGHUP, they appear."""
    config = tmp_path / "crnetd.toml"
    config.write_text('log_level = "info"\n')
    # No log_level option: a flag would win over the file.
    lt = LocalTree(Tree((1,), (0,)), 4, workdir=tmp_path / "tree", strict=True, config=config)
    lt.start()
    try:
        async def steps(first):
            async def run(name):
                async with await AsyncClient.connect(lt.socket_path(name), timeout=30) as c:
                    c.mark_current()   # (its vectors depend on no parameters)
                    for t in range(first, first + 3):
                        await c.allreduce(np.ones(4), step=t, timeout=30)
            await gather_or_cancel(run(MASTER), run("0"))

        log = lt.log_path(MASTER)
        await steps(0)
        assert "step 2 done" not in log.read_text()
        config.write_text('log_level = "debug"\n')
        lt.signal(MASTER, signal.SIGHUP)
        await wait_until(lambda: "SIGHUP: log level info -> debug" in log.read_text(),
                         "the master to take the new level")
        await steps(3)
        await wait_until(lambda: "step 5 done" in log.read_text(), "a debug line")
        line = next(x for x in log.read_text().splitlines() if "step 5 done" in x)
        assert "level=debug" in line and "node=master" in line and "step=5" in line
        assert lt.alive(MASTER) and lt.alive("0")
    finally:
        lt.stop()
    assert lt.problems() == []


def test_example_config_names_every_key_and_checks(tmp_path):
    """scripts/systemd/crnetd.toml: every option is there (set or commented), and what
    it sets passes --check-config (with a secret file that exists here)."""
    import re

    from crnet.config.effective import file_options

    example = REPO / "scripts" / "systemd" / "crnetd.toml"
    text = example.read_text()
    listed = set(re.findall(r"^#? ?([a-z_]+) = ", text, re.M))
    assert listed == set(file_options(crnetd)), set(file_options(crnetd)) ^ listed
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32)
    secret.chmod(0o600)
    code, out = check(["--config", str(example), "--secret-file", str(secret)])
    assert code == 0, out
    assert entry(out, "parent") == ('"master.example:7070"', f"file {example}")
    assert entry(out, "secret_file") == (f'"{secret}"', "flag")


def test_chunk_bytes_auto_is_shown_as_auto_and_read_back(tmp_path):
    """The default chunk size is auto (0 inside): --check-config prints "auto", which a
    file can say; a size stays a size."""
    code, out = check(MASTER_ARGS)
    assert code == 0 and entry(out, "chunk_bytes") == ('"auto"', "default"), out
    config = tmp_path / "crnetd.toml"
    config.write_text('chunk_bytes = "auto"\n')
    code, out = check(["--config", str(config), *MASTER_ARGS])
    assert code == 0 and entry(out, "chunk_bytes") == ('"auto"', f"file {config}"), out
    code, out = check([*MASTER_ARGS, "--chunk-bytes", "4MiB"])
    assert code == 0 and entry(out, "chunk_bytes") == ("4194304", "flag"), out


# ---- every option declared once (crnet/config/options.py): the two timeouts as the example
def test_link_and_connect_timeouts_are_options_with_help_defaults_and_a_file(tmp_path):
    help_text = CliRunner().invoke(crnetd, ["--help"]).output
    assert "--link-timeout" in help_text and "[default: 8.0; x>=1]" in help_text
    assert "--connect-timeout" in help_text and "[default: 4.0; x>=0.1]" in help_text
    code, out = check(MASTER_ARGS)
    assert code == 0, out
    assert entry(out, "link_timeout") == (str(defaults.LINK_TIMEOUT), "default")
    assert entry(out, "connect_timeout") == (str(defaults.CONNECT_TIMEOUT), "default")
    config = tmp_path / "crnetd.toml"
    config.write_text("link_timeout = 3\nconnect_timeout = 1.5\n")
    code, out = check(["--config", str(config), *MASTER_ARGS])
    assert code == 0, out
    assert entry(out, "link_timeout") == ("3.0", f"file {config}")
    assert entry(out, "connect_timeout") == ("1.5", f"file {config}")
    code, out = check(["--config", str(config), *MASTER_ARGS, "--connect-timeout", "2"],
                      {"CRNET_LINK_TIMEOUT": "5"})
    assert entry(out, "link_timeout") == ("5.0", "env CRNET_LINK_TIMEOUT")
    assert entry(out, "connect_timeout") == ("2.0", "flag")
    settings = effective_config(crnetd.make_context(
        "crnetd", ["--config", str(config), *MASTER_ARGS])).settings
    assert (settings.link_timeout, settings.connect_timeout) == (3.0, 1.5)


@pytest.mark.parametrize("args, text, message", [
    (["--link-timeout", "0.5"], "", "Invalid value for '--link-timeout': 0.5 is not in the range x>=1"),
    (["--connect-timeout", "soon"], "", "Invalid value for '--connect-timeout': 'soon' is not a valid float"),
    ([], "link_timeout = 0", "link_timeout: 0.0 is not in the range x>=1"),
    ([], "connect_timeout = 'x'", "connect_timeout: 'x' is not a valid float"),
    ([], "connect_timeout = true", "connect_timeout must be a string or a number, not true"),
])
def test_a_bad_timeout_is_a_usage_error(tmp_path, args, text, message):
    config = tmp_path / "crnetd.toml"
    config.write_text(text + "\n")
    code, out = check(["--config", str(config), *MASTER_ARGS, *args])
    assert code == 2, out
    assert message in out and "Traceback" not in out, out


async def test_the_timeouts_reach_the_links_and_the_engine_its_options(tmp_path, monkeypatch):
    """A daemon (in this process) with --link-timeout 2: a connection to its listener gets
    2 s silence limits; its engine has the table's engine options by keyword."""
    import asyncio

    from crnet.node import Node, Settings
    from crnet.protocol import transport

    limits = []
    monkeypatch.setattr(transport, "silence_limits", lambda sock, seconds: limits.append(seconds))
    node = Node(Settings.of("master", tree=Tree((1,), (0,)), samples=4,
                            listen=("127.0.0.1", 0), client_socket=str(tmp_path / "m.sock"),
                            link_timeout=2.0, connect_timeout=1.5, step_window=5,
                            max_send_queue=1 << 20, result_memory=1 << 20))
    await node.start()
    try:
        host, _, port = str(node.membership.listen_address).rpartition(":")
        _, writer = await asyncio.open_connection(host, int(port))
        await wait_until(lambda: limits, "the daemon to accept the connection")
        writer.close()
    finally:
        await node.shutdown()
    assert limits == [2.0]
    assert node.settings.connect_timeout == 1.5
    engine = node.engine.settings
    assert (engine.window, engine.send_queue_bytes, engine.result_memory) == (5, 1 << 20, 1 << 20)
    assert (engine.timeout, engine.keep_results) == (defaults.TIMEOUT, defaults.KEEP_RESULTS)


# Values for the options whose default is None (LocalTree gives every other one its default).
SAMPLES = {"workers": 2, "layers": 1, "client_group": "nogroup", "max_send_queue": 1 << 20,
           "secret_file": "secret", "tls_cert": __file__, "tls_key": __file__, "tls_ca": __file__,
           "metrics": ("127.0.0.1", 9464), "metrics_token_file": "token", "host_id": "h1",
           "patience": 0.5}


def test_every_option_of_the_table_is_a_flag_a_file_key_and_a_launcher_argument(tmp_path):
    """Derived, so nothing can drift: each entry of DAEMON_OPTIONS is a click option of
    crnetd, a config file key, and either set by LocalTree itself or a keyword of it that
    reaches the daemons that take it, by flag, as the value given."""
    from click.core import ParameterSource

    from crnet.config.effective import file_options
    from crnet.config.options import DAEMON_OPTIONS

    params = {p.name for p in crnetd.params}
    keys = file_options(crnetd)
    given = {}
    for o in DAEMON_OPTIONS:
        assert o.name in params, o.name
        assert keys[o.key].name == o.name, o.key
        if o.name in LocalTree.SETS:
            continue
        default = o.parse(o.default)
        given[o.name] = (True if o.is_flag else SAMPLES[o.name] if default is None
                         else default)
    lt = LocalTree(Tree((2,), (1,)), 4, workdir=tmp_path, **given)
    for name, role in ((MASTER, "master"), ("0", "node")):
        argv = lt.command(name)
        ctx = crnetd.make_context("crnetd", argv[argv.index("daemon") + 1:])
        for o in DAEMON_OPTIONS:
            source = ctx.get_parameter_source(o.name)
            if o.name in LocalTree.SETS:
                continue
            if not o.takes(role):
                assert source is ParameterSource.DEFAULT, (role, o.name)
                continue
            assert source is ParameterSource.COMMANDLINE, (role, o.name)
            assert ctx.params[o.name] == o.parse(given[o.name]), (role, o.name)
        assert ctx.params["role"] == role
    with pytest.raises(TypeError, match="no crnetd option window"):
        LocalTree(Tree((2,), (1,)), 4, workdir=tmp_path, window=3)
    with pytest.raises(TypeError, match="role follow from the tree"):
        LocalTree(Tree((2,), (1,)), 4, workdir=tmp_path, role="node")


def test_settings_has_a_typed_field_per_option_of_the_table_in_its_order():
    """``Settings`` is a typed dataclass (a misspelt ``settings.<name>`` is mypy's error):
    its fields without a default are the table's options, in its order, so an option added
    to one and not the other fails here; each option's default, and a value for those whose
    default is None (SAMPLES), fits its field's type. The fields after them are derived."""
    import dataclasses
    import types
    import typing

    from crnet.config.options import BY_NAME, DAEMON_OPTIONS, defaults_of
    from crnet.node import Settings

    fields = dataclasses.fields(Settings)
    options = [f.name for f in fields if f.default is dataclasses.MISSING]
    assert options == [o.name for o in DAEMON_OPTIONS]
    assert all(f.default is None for f in fields[len(options):])

    def fits(value, hint) -> bool:
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            return any(fits(value, arg) for arg in typing.get_args(hint))
        return isinstance(value, origin or hint)

    hints = typing.get_type_hints(Settings)
    for role in ("master", "node"):
        for name, value in defaults_of(role=role).items():
            assert fits(value, hints[name]), (name, value, hints[name])
    for name, value in SAMPLES.items():
        assert fits(BY_NAME[name].parse(value), hints[name]), (name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings.of("master").timeout = 1.0


def test_the_scheme_help_names_every_scheme_crnetd_runs():
    """--scheme's help is made of the scheme table (``plan.SCHEME_SUMMARIES``): it names
    every scheme (spread was missing), in the table's order."""
    from crnet.coding.plan import SCHEMES

    [scheme] = [p for p in crnetd.params if p.name == "scheme"]
    assert [part.partition(":")[0] for part in scheme.help.rstrip(".").split("; ")] == list(SCHEMES)

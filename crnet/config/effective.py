"""crnetd's effective configuration: flags, ``CRNET_*`` variables, a TOML file, defaults.

click merges the four and remembers where each value came from (``ParameterSource``):
a flag wins over ``CRNET_<OPTION>``, which wins over the ``--config`` file, whose values
are handed to click as the context's ``default_map`` (read here, before any other
option), which wins over the option's default. This module reads and checks the file,
turns the merged values into the ``Settings`` that ``run_node`` takes (every rule that
spans several options lives here, not in the CLI), says what it did
(``crnetd --check-config``) and, on SIGHUP, re-reads the file's log level.

The options are the table in ``crnet.config.options`` (``DAEMON_OPTIONS``): the file's keys are
their ``Option.key``, the long option names with ``_`` for ``-`` (``client_socket``,
``step_window``, ``code``): the spelling of the ``CRNET_*`` variables, lower case; which
role refuses which option is the table's ``roles``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from dataclasses import dataclass

import click
from click.core import ParameterSource

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from .. import defaults
from ..node import Settings
from .options import BY_NAME, DAEMON_OPTIONS, MASTER, NODE
from .tree import stragglers_in_effect, tree_for_scheme
from .types import IntList

log = logging.getLogger("crnet.config.effective")


def file_options(command: click.Command) -> dict[str, click.Option]:
    """Config file key -> the option it sets: every option of the table
    (``crnet.config.options.DAEMON_OPTIONS``), by ``Option.key``."""
    params = {p.name: p for p in command.params if isinstance(p, click.Option)}
    return {o.key: params[o.name] for o in DAEMON_OPTIONS}


def load_toml(path: str) -> dict:
    """The file's table, or a usage error (exit 2) that names the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise click.UsageError(f"cannot read the config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise click.UsageError(f"{path} is not valid TOML: {e}") from None


def read_config(ctx: click.Context, path: str | None) -> None:
    """``--config`` (an eager option: read before the others): check every key of the
    file and hand the values to click as defaults, so that flags and ``CRNET_*`` still
    win over them."""
    if path is None:
        return
    table = load_toml(path)
    options = file_options(ctx.command)
    values = {}
    for key, value in table.items():
        param = options.get(key)
        if param is None:
            hint = key.replace("-", "_")
            raise click.UsageError(f"{path}: unknown key {key!r}" + (
                f" (did you mean {hint!r}? keys use _)" if hint in options else ""))
        values[param.name] = _checked(ctx, param, key, value, path)
    ctx.default_map = {**(ctx.default_map or {}), **values}
    ctx.meta["crnet.config.effective"] = path


def _checked(ctx: click.Context, param: click.Option, key: str, value: object, path: str):
    """The file's ``value`` converted as the option converts a flag's, or a usage error
    naming the key and the file."""
    def wrong(what: str):
        return click.UsageError(f"{path}: {key} must be {what}, not {_toml(value)}")

    if param.is_flag:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(param.type, IntList) and isinstance(value, list):   # fanout = [3, 2]
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise wrong("an integer or a list of integers")
        value = ",".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise wrong("a string or a number")
    try:
        return param.type_cast_value(ctx, value)
    except click.BadParameter as e:
        raise click.UsageError(f"{path}: {key}: {e.message}") from None


# ---------------------------------------------------------------- the effective configuration
@dataclass
class Config:
    settings: Settings
    lines: list[tuple[str, object, str]]        # key, value, where it came from

    def describe(self) -> str:
        """What ``--check-config`` prints: valid TOML, each value and its source."""
        out = ["# crnetd: the effective configuration (flag > CRNET_* > file > default)"]
        width = max(len(k) + len(_toml(v)) for k, v, _ in self.lines if v is not None) + 3
        for key, value, source in self.lines:
            if value is None:
                out.append(f"# {key} is not set".ljust(width) + f"  # {source}")
            else:
                out.append(f"{key} = {_toml(value)}".ljust(width) + f"  # {source}")
        return "\n".join(out)


def effective_config(ctx: click.Context) -> Config:
    """The daemon's ``Settings`` from the parsed options, or a usage error (exit 2)
    naming what is wrong."""
    from ..protocol.tls import TlsFiles, contexts

    p = ctx.params
    given = {name: _given(ctx, name) for name in p}
    shown: dict[str, tuple[object, str]] = {}   # values in effect that differ from p's
    values = {o.name: p[o.name] for o in DAEMON_OPTIONS}   # what Settings gets, by name
    role, listen, parent = p["role"], p["listen"], p["parent"]
    if role == MASTER:
        missing = [o for o, v in (("--listen", listen), ("--samples", p["samples"])) if v is None]
        if missing:
            raise click.UsageError(f"--role master needs {' and '.join(missing)}")
        node_only = [o for o in DAEMON_OPTIONS if o.roles == NODE]
        if any(p[o.name] is not None for o in node_only):
            raise click.UsageError(f"{' and '.join(o.spelling for o in node_only)} are for --role node")
        stragglers = stragglers_in_effect(p["fanout"], p["stragglers"])
        if stragglers != p["stragglers"]:   # the default (1) fits no fanout of 1: there it is 0
            shown["stragglers"] = (stragglers, "default, at most the fanout - 1")
            values["stragglers"] = stragglers
        tree = tree_for_scheme(p["scheme"], p["workers"], p["fanout"], p["layers"], stragglers)
    else:
        if parent is None:
            raise click.UsageError("--role node needs --parent HOST:PORT")
        # A node learns the tree from its parent: given to it, these would be silently
        # ignored, so they are refused.
        ignored = [f"{o.spelling} ({given[o.name]})" for o in DAEMON_OPTIONS
                   if o.roles == MASTER and given[o.name]]
        if ignored:
            raise click.UsageError(f"{', '.join(ignored)}: only the master takes "
                                   f"{'this option' if len(ignored) == 1 else 'these options'}; "
                                   "a node learns the tree from its parent")
        tree = None
    gid = None
    if p["client_group"] is not None:
        import grp

        try:
            gid = grp.getgrnam(p["client_group"]).gr_gid
        except KeyError:
            raise click.BadParameter(f"no group {p['client_group']!r}",
                                     param_hint="--client-group") from None
    # The training processes' group (they run untrusted code) must not read the secret or key.
    secret = _credential(
        p["secret_file"], "--secret-file", listen, p["insecure"],
        f"refusing to listen on {listen and listen[0]} without --secret-file: any host that "
        "reaches the port could join the tree and read or corrupt every gradient "
        "(--insecure to do it anyway)", shared_gid=gid)
    tls = None
    named = [o for o in ("tls_cert", "tls_key", "tls_ca") if p[o] is not None]
    if named and len(named) < 3:
        raise click.UsageError(f"{', '.join(BY_NAME[o].spelling for o in named)} needs "
                               "--tls-cert, --tls-key and --tls-ca")
    if named:
        tls = TlsFiles(p["tls_cert"], p["tls_key"], p["tls_ca"])
        try:
            contexts(tls, shared_gid=gid)
        except (OSError, ValueError) as e:     # ssl.SSLError is an OSError
            raise click.BadParameter(f"cannot load the TLS files: {e}",
                                     param_hint="--tls-cert/--tls-key/--tls-ca") from None
    if p["tls_names"] and tls is None:
        raise click.UsageError("--tls-names needs --tls-cert, --tls-key and --tls-ca: the names "
                               "it checks are those of each host's TLS certificate")
    metrics = p["metrics"]
    metrics_token = _credential(
        p["metrics_token_file"], "--metrics-token-file", metrics, p["insecure"],
        f"refusing to serve metrics on {metrics and metrics[0]} without --metrics-token-file: "
        "they show the tree's hosts and state to anyone who reaches the port (--insecure to "
        "do it anyway)", what="the metrics token")
    if secret is None and listen is not None and not p["insecure"]:
        # On loopback too: the client socket admits only this user (and --client-group),
        # and a tree link without a secret would admit every user of this host.
        raise click.UsageError(
            f"refusing to listen on {listen[0]}:{listen[1]} without --secret-file: every user "
            "of this host could join the tree and read or corrupt every gradient. Give the "
            "tree a secret (every daemon the same --secret-file, mode 600), or --insecure if "
            "every local user may join")
    host_id = p["host_id"]
    if host_id is None:   # the master's too: crnet status shows it
        import socket

        host_id = socket.gethostname()
        shown["host_id"] = (host_id, "default, this host's name")
        values["host_id"] = host_id
    if p["chunk_bytes"] == defaults.CHUNK_AUTO:   # 0 inside; what a file says is "auto"
        shown["chunk_bytes"] = ("auto", given["chunk_bytes"] or "default")
    if p["exit_with_stdin"] and not _is_pipe(0):
        raise click.BadParameter("standard input is not a pipe or socket, so it cannot tell "
                                 "this daemon its launcher is gone", param_hint="--exit-with-stdin")
    from ..protocol.fields import check_host_id

    problem = check_host_id(host_id)
    if problem:
        raise click.BadParameter(problem, param_hint="--host-id")
    if p["tls_names"]:
        _check_named(tls, host_id)
    path = ctx.meta.get("crnet.config.effective")
    choices = list(getattr(BY_NAME["log_level"].type, "choices", ()))
    source = given["log_level"]
    fixed_by = source if source is not None and not source.startswith("file ") else None
    settings = Settings(**values, tree=tree, client_gid=gid, secret=secret, tls=tls,
                        metrics_token=metrics_token,
                        reread_log_level=lambda: reread_log_level(path, fixed_by, choices))
    lines = [(o.key, *shown.get(o.name, (p[o.name], given[o.name] or "default")))
             for o in DAEMON_OPTIONS]
    return Config(settings, lines)


def _check_named(tls, host_id: str) -> None:
    """--tls-names: this host's certificate must name its host id (``crnet.protocol.tls.own_names``),
    or every peer would refuse it."""
    from ..protocol.tls import own_names

    try:
        named = own_names(tls)
    except OSError as e:     # ssl.SSLError is an OSError
        raise click.BadParameter(f"cannot check the certificate's names: {e}",
                                 param_hint="--tls-cert") from None
    if host_id not in named:
        raise click.BadParameter(
            f"--tls-names: this host's certificate ({tls.cert}) does not name its host id "
            f"{host_id!r} (it names {', '.join(map(repr, named)) or 'no host'}): give it a "
            f"subjectAltName DNS:{host_id}, or start crnetd with the --host-id it names",
            param_hint="--tls-cert/--host-id")


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _credential(path: str | None, option: str, address: tuple[str, int] | None,
                insecure: bool, refusal: str, shared_gid: int | None = None,
                what: str = "the cluster secret") -> bytes | None:
    """The secret in ``path`` (``option``'s file), or None where none is needed: a usage
    error when ``address`` reaches beyond loopback without one (unless ``insecure``).
    ``shared_gid``: a group that must not read the file (``crnet.protocol.private_files``)."""
    from ..protocol.auth import is_loopback, load_secret

    if path is not None:
        try:
            return load_secret(path, shared_gid, what)
        except (OSError, ValueError) as e:
            raise click.BadParameter(str(e), param_hint=option) from None
    if address is not None and not is_loopback(address[0]) and not insecure:
        raise click.UsageError(refusal)
    return None


def _given(ctx: click.Context, name: str) -> str | None:
    """Where option ``name``'s value came from, unless it is the option's default."""
    source = ctx.get_parameter_source(name)
    if source is ParameterSource.COMMANDLINE:
        return "flag"
    if source is ParameterSource.ENVIRONMENT:
        param = next(o for o in ctx.command.params if o.name == name)
        return f"env {param.envvar or f'{ctx.auto_envvar_prefix}_{name.upper()}'}"
    if source is ParameterSource.DEFAULT_MAP:
        return f"file {ctx.meta.get('crnet.config.effective')}"
    return None


def _toml(value: object) -> str:
    """``value`` as TOML writes it (an address as "HOST:PORT")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):         # an address
        host, port = value
        return json.dumps(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1024:
        return str(int(value))           # a size in bytes
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


# ---------------------------------------------------------------- SIGHUP
def reread_log_level(path: str | None, fixed_by: str | None, choices: list[str]) -> None:
    """SIGHUP: take the config file's ``log_level`` (nothing else changes). A flag or a
    ``CRNET_LOG_LEVEL`` given at start still wins over the file, as it did then."""
    from ..node.observe.logs import set_log_level

    now = logging.getLevelName(logging.getLogger().level).lower()
    if fixed_by is not None:
        log.warning("SIGHUP: the log level stays %s: set by %s, which wins over the config "
                    "file", now, fixed_by)
        return
    if path is None:
        log.warning("SIGHUP: no --config file to re-read; the log level stays %s", now)
        return
    try:
        level = load_toml(path).get("log_level", "info")
    except click.UsageError as e:
        log.error("SIGHUP: %s; the log level stays %s", e.message, now)
        return
    if level not in choices:
        log.error("SIGHUP: %s: log_level must be one of %s, not %s; the log level stays %s",
                  path, ", ".join(choices), _toml(level), now)
        return
    set_log_level(level, announce=f"SIGHUP: log level {now} -> {level} (from {path})")

"""crnetd's options, each declared once.

``DAEMON_OPTIONS`` is the table: one ``Option`` record per daemon option (its name, the
kind of value, default, help, the roles that take it). Everything else is derived from it:

- ``crnetd``'s click options (``crnet/cli/daemon.py``: ``Option.click``), so ``--help``
  and ``CRNET_<NAME>`` too;
- the ``--config`` file's keys and their checks, and ``--check-config``'s lines
  (``crnet/config/effective.py``: ``Option.key``, the same click conversion as a flag's);
- the refusals: an option only the master takes, given to a node, and the reverse;
- the daemon's ``Settings`` (``crnet/node/lifecycle.py``: a typed field per ``name``, in
  this order; ``tests/unit/test_config.py`` fails when they differ) and the engine's
  (``engine_values``: the records with an ``engine`` field);
- a launcher's command line (``crnet.tools.launch.LocalTree``: ``argv``).

Adding an option is one record here, its field in ``Settings``, and the code that reads
``settings.<name>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from .. import defaults
from ..coding.plan import SCHEME_SUMMARIES, SCHEMES
from .types import Address, ChunkSize, IntList, MetricsAddress, Size, address_text

MASTER, NODE, BOTH = "master", "node", "both"     # the roles that take an option


def _text(value: Any) -> str:
    """An option's value as a flag takes it back."""
    if isinstance(value, tuple):
        return address_text(value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _chunk_text(value: Any) -> str:
    return "auto" if value == defaults.CHUNK_AUTO else str(value)


@dataclass(frozen=True)
class Option:
    """One option: ``name`` is its Python name, its ``Settings`` attribute and (with ``_``
    for ``-``) its flag, config key and ``CRNET_*`` variable, unless ``flag`` says otherwise."""

    name: str
    type: Any                          # a click type: click.ParamType, int, float, str
    default: Any = None                # as click takes it (and --help shows it): "1GiB", "auto"
    help: str = ""
    roles: str = BOTH                  # MASTER: refused on a node; NODE: refused on the master
    flag: str = ""                     # the long flag, if not --<name with ->
    short: str = ""                    # e.g. -n
    is_flag: bool = False
    required: bool = False
    envvar: str | None = None          # if not CRNET_<NAME>
    engine: str = ""                   # the EngineSettings field it fills (node/steps/settings.py)
    text: Callable[[Any], str] = _text  # a value -> the flag's argument (launchers)

    @property
    def spelling(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """Its key in a config file: the long flag with ``_`` for ``-``."""
        return self.spelling.lstrip("-").replace("-", "_")

    def takes(self, role: str) -> bool:
        return self.roles in (BOTH, role)

    def click(self, **overrides) -> Callable:
        """The click option decorator."""
        decls = [self.spelling, *([self.short] if self.short else [])]
        if self.flag:
            decls.append(self.name)
        kwargs: dict[str, Any] = dict(help=self.help, required=self.required)
        if self.is_flag:
            kwargs["is_flag"] = True
        else:
            kwargs.update(type=self.type, show_default=self.default is not None)
            if self.default is not None:   # click 8.3+: an explicit None counts as a value given
                kwargs["default"] = self.default
        if self.envvar:
            kwargs["envvar"] = self.envvar
        kwargs.update(overrides)
        return click.option(*decls, **kwargs)

    def parse(self, value: Any) -> Any:
        """``value`` converted as a flag's argument is (a usage error if it is not one)."""
        if self.is_flag:
            return bool(value)
        if value is None:
            return None
        return click.types.convert_type(self.type).convert(value, None, None)


# ---- shared with crnet plan/demo/run/model (crnet/config/tree.py makes them a Tree)
SCHEME = Option("scheme", click.Choice(SCHEMES), "cr", roles=MASTER,
                help="; ".join(f"{name}: {what}" for name, what in SCHEME_SUMMARIES.items()) + ".")
WORKERS = Option("workers", click.IntRange(min=1), None, roles=MASTER, short="-N",
                 help="gc/rar: number of workers (default: the tree's worker count).")
FANOUT = Option("fanout", IntList(), "3", roles=MASTER, short="-n",
                help="Children per parent (one value, or one per layer).")
LAYERS = Option("layers", click.IntRange(min=1), None, roles=MASTER, short="-L",
                help="Tree depth (default: the length of the --fanout list, else 2).")
STRAGGLERS = Option("stragglers", IntList(), "1", roles=MASTER, short="-s",
                    help="Stragglers tolerated per parent (one value, or one per layer).")
TREE_OPTIONS = (FANOUT, LAYERS, STRAGGLERS)
SCHEME_OPTIONS = (SCHEME, WORKERS)


def apply(options: Iterable[Option], **overrides: dict[str, Any]) -> Callable:
    """A decorator adding ``options`` to a click command, in this order in --help
    (``overrides``: click keywords by option name)."""
    chosen = list(options)

    def decorate(f):
        for o in reversed(chosen):
            f = o.click(**overrides.get(o.name, {}))(f)
        return f
    return decorate


# ---- the daemon's table, in --help's and --check-config's order
DAEMON_OPTIONS: tuple[Option, ...] = (
    Option("role", click.Choice([MASTER, NODE]), required=True,
           help="master: the tree's root; node: every other host."),
    Option("listen", Address(),
           help="Where children connect (master, and nodes that have children)."),
    Option("parent", Address(min_port=1), roles=NODE, help="The parent's --listen (nodes)."),
    Option("resolve_timeout", click.FloatRange(min=0), defaults.RESOLVE_TIMEOUT,
           help="Node: seconds the parent's host name may fail to resolve before the node "
                "gives up (exit 2)."),
    Option("name", str, roles=NODE,
           help="Node: the tree slot to (re)claim, e.g. 0.2; default: any free slot."),
    *SCHEME_OPTIONS,
    *TREE_OPTIONS,
    Option("samples", click.IntRange(min=1), roles=MASTER, short="-m",
           help="Master: samples in the global batch."),
    Option("code_kind", click.Choice(["auto", "frc", "crc"]), "auto", roles=MASTER,
           flag="--code", envvar="CRNET_CODE", help="Master: gradient code at every parent."),
    Option("beyond_s", click.Choice(["fail", "approximate"]), "fail", roles=MASTER,
           help="Master: a parent short of n - s children fails the step (fail), or decodes "
                "the best combination of those there once its patience runs out "
                "(approximate: every result then says its coverage; docs/client.md)."),
    Option("patience", click.FloatRange(min=0.001), roles=MASTER,
           help="Master, with --beyond-s approximate: seconds a parent waits for its quorum "
                "before it decodes from the children there, per layer of parents below it "
                "(default: 4 x the median of its recent step times, at least 0.05 s; "
                "always well within --timeout)."),
    Option("client_socket", click.Path(dir_okay=False), defaults.CLIENT_SOCKET,
           help="Unix socket for the local training processes (mode 600: this user's; "
                "its directory is created if missing)."),
    Option("client_group", str,
           help="Also let this group's members' training processes connect (mode 660)."),
    Option("chunk_bytes", ChunkSize(), "auto", roles=MASTER, text=_chunk_text,
           help="Pipelining unit (master; the tree uses the master's): a size, or auto: "
                "1 MiB up to 16 MiB vectors, then 1/16 of the vector, at most 4 MiB."),
    Option("spread_sum", click.Choice(["ring", "direct"]), "ring", roles=MASTER,
           help="Master, spread: how a vector's sum reaches every host where owners' shares are "
                "large: round the ring of ranks, every host relaying (ring: where links bound a "
                "step, each host then receives from one host at a time), or straight from each "
                "owner to every host (direct: where the CPUs bound it, fast links or hosts on "
                "one machine; no relayed copy to check). docs/spread.md."),
    Option("timeout", click.FloatRange(min=0.01), defaults.TIMEOUT, engine="timeout",
           help="Seconds a step may wait for its quorum at a node before it fails there."),
    Option("keep_results", click.IntRange(min=1), defaults.KEEP_RESULTS, engine="keep_results",
           help="Finished steps' results kept for children that missed them."),
    Option("local_processes", click.IntRange(1, defaults.LOCAL_PROCESSES_MAX), 1,
           help="Training processes on this host (one per accelerator, say): the host's "
                "share is cut among them and their vectors are summed here. Every host of "
                "a tree runs as many as the master."),
    Option("result_memory", Size(), "1GiB", engine="result_memory",
           help="Results kept for this host's training processes until they take them "
                "(they catch up on every step they missed, up to this much)."),
    Option("step_window", click.IntRange(min=1), defaults.STEP_WINDOW, engine="window",
           help="Steps further than this ahead of the tree's newest result are refused "
                "(StepRefused) to whoever asks for them."),
    Option("plan", click.Choice(["fixed", "auto"]), "fixed", roles=MASTER,
           help="Master: auto: when a new job starts (Client(job=...)), re-plan from what the "
                "last job measured (crnet tune's ranking; docs/tune.md): the scheme and the "
                "stragglers per layer, and, if clearly faster, another shape or rar or spread, to "
                "which every host moves (start every node with --listen); fixed: the configured "
                "plan."),
    Option("tune_window", click.IntRange(1, defaults.TUNE_WINDOW_MAX), defaults.TUNE_WINDOW,
           help="How many steps' times (compute, children's arrivals, step period) this "
                "daemon keeps, for the tune command (and status --json)."),
    Option("max_send_queue", Size(), engine="send_queue_bytes",
           help="Cut off a child that stopped reading once this much is queued for it "
                "(default: the larger of 64MiB and 4 vectors)."),
    Option("link_timeout", click.FloatRange(min=1), defaults.LINK_TIMEOUT,
           help="Drop a tree link once data sent on it goes unacknowledged this many "
                "seconds, or an idle link's keepalive probes go unanswered about as long."),
    Option("connect_timeout", click.FloatRange(min=0.1), defaults.CONNECT_TIMEOUT,
           help="Seconds a dial to the parent or a ring successor may go unanswered before "
                "it is tried again."),
    Option("secret_file", click.Path(dir_okay=False),
           help="The cluster secret (the same file on every host, mode 600): every tree "
                "link is mutually authenticated with it (HMAC-SHA256 challenge-response)."),
    Option("tls_cert", click.Path(dir_okay=False, exists=True),
           help="Mutual TLS on every tree link: this host's certificate (PEM; with "
                "--tls-key and --tls-ca)."),
    Option("tls_key", click.Path(dir_okay=False, exists=True),
           help="This host's private key (PEM)."),
    Option("tls_ca", click.Path(dir_okay=False, exists=True),
           help="The cluster CA that signed every host's certificate (PEM)."),
    Option("tls_names", bool, is_flag=True,
           help="With --tls-*: this host's certificate names its --host-id (a DNS "
                "subjectAltName), checked at startup; a parent checks that a child's names "
                "the host id it says, and spread's peer links that each host's names the "
                "host id the master gives its rank. Every host of a tree gives it, or none."),
    Option("trust_relays", bool, is_flag=True,
           help="spread: take the chunks of the sum other hosts relay round the ring without "
                "checking them against their owners' digests (one SHA-256 pass over most of "
                "the vector a step at every host, 0.6 ns a byte on one core here; docs/spread.md). "
                "Faster where the CPUs bound a step, but a host that holds the secret could then "
                "give the hosts after it any sum."),
    Option("insecure", bool, is_flag=True,
           help="Listen without --secret-file: any host that reaches the port (on "
                "127.0.0.1: any user of this host) can join the tree."),
    Option("metrics", MetricsAddress(),
           help="Serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: on "
                "127.0.0.1). Beyond loopback it needs --metrics-token-file (or --insecure)."),
    Option("metrics_token_file", click.Path(dir_okay=False),
           help="The bearer token scrapers must send (mode 600; Prometheus' "
                "authorization: {credentials_file: ...})."),
    Option("host_id", str,
           help="Node: this host's stable identity, sent to the parent, which gives it "
                "the same slot whenever it comes back (default: the hostname; --name wins)."),
    Option("strict", bool, is_flag=True,
           help="Exit with code 70 on any internal error instead of dropping the "
                "connection it happened on (the tests run this way)."),
    Option("exit_with_stdin", bool, is_flag=True,
           help="Stop, as on SIGTERM, when standard input (a pipe) closes: a launcher "
                "holding the pipe's other end takes its daemons with it when it dies."),
    Option("log_level", click.Choice(["debug", "info", "warning", "error"]), "info",
           help="Re-read from the config file on SIGHUP."),
    Option("log_format", click.Choice(["kv", "json"]), "kv",
           help="One event per line: key=value pairs, or a JSON object."),
)
BY_NAME: dict[str, Option] = {o.name: o for o in DAEMON_OPTIONS}


def defaults_of(**values: Any) -> dict[str, Any]:
    """Every daemon option's default, parsed, with ``values`` (by name) instead."""
    unknown = set(values) - set(BY_NAME)
    if unknown:
        raise TypeError(f"no daemon option {', '.join(sorted(unknown))}")
    return {o.name: values[o.name] if o.name in values else o.parse(o.default)
            for o in DAEMON_OPTIONS}


def engine_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``EngineSettings`` keywords among the options' ``values``."""
    return {o.engine: values[o.name] for o in DAEMON_OPTIONS if o.engine}


def argv(values: Mapping[str, Any], role: str) -> list[str]:
    """The flags that give a daemon of ``role`` these option ``values`` (by name; None
    and false flags are left out, and so are the options ``role`` does not take)."""
    out: list[str] = []
    for o in DAEMON_OPTIONS:
        value = values.get(o.name)
        if value is None or value is False or not o.takes(role):
            continue
        out += [o.spelling] if o.is_flag else [o.spelling, o.text(value)]
    return out

"""How the suite is split: which tests form the quick tier, and which run on both event loops.

The quick tier (``python -m pytest -q -m quick``, the README's first test command) answers
"does my install work" in a few minutes on 2 cores: the pure layers whole, one real tree
end to end, and the README's loop. Everything else is the full tier only (``python -m
pytest -q``, what CI runs). ``tests/conftest.py`` marks the tests named here ``quick``;
``tests/test_tiers.py`` fails when a test file is in neither list, or when a test named
below is no longer collected, so the lists cannot drift from the files.
"""

from __future__ import annotations

# Quick tier, whole files: the pure layers (no daemon process), and the README's loop.
QUICK_FILES = frozenset({
    "test_approximate.py",   # beyond s: the decode from fewer than n - s children
    "test_codes.py",
    "test_config.py",
    "test_engine.py",        # the step engine over fake links
    "test_errors.py",
    "test_guard.py",         # the guard hands an accepted connection to its link
    "test_kernels.py",
    "test_layout.py",
    "test_links.py",         # the link state machines over fake links
    "test_loop.py",          # the README's training loop, on a real tree
    "test_measured.py",      # crnet tune's windows in a daemon, and their status section
    "test_membership.py",    # joins and losses over fake links
    "test_messages.py",
    "test_model.py",
    "test_model_spread.py",
    "test_moves.py",         # where hosts go when --plan auto moves them to another shape
    "test_peer_check.py",     # a spread peer's rank, confirmed by its host (fake links)
    "test_plan.py",
    "test_scheme_registration.py",   # a scheme is its module and its DRIVERS entry
    "test_schemes.py",
    "test_sends_in_turn.py",
    "test_spread_step.py",
    "test_state_answers.py",  # the master's choice among state answers (pure)
    "test_tiers.py",
    "test_tune_fit.py",      # crnet tune's fit: known compute laws and links recovered
    "test_tune_write.py",    # crnet tune --write: the choice read back as the master's --config
    "test_wire.py",
    "test_workload.py",
    "test_workload_grouped.py",   # correlated stragglers: whole groups of workers slow together
})

# Quick tier, single tests (pytest's test names, parameters included): one real tree of
# crnetd processes end to end, through the async and the blocking client.
QUICK_TESTS = {
    "test_e2e.py": frozenset({
        "test_every_client_gets_the_exact_sum_despite_stragglers[float64-cr]",
        "test_every_client_gets_the_exact_sum_despite_stragglers[float32-cr]",
        "test_blocking_client_errors",
    }),
}

# Full tier only: real daemon trees, subprocesses, soak and benchmark runs.
FULL_FILES = frozenset({
    "test_beyond_s.py",      # beyond s: approximate results on real daemons
    "test_auth.py",
    "test_barriers.py",
    "test_batches.py",
    "test_bench.py",
    "test_bench_model.py",
    "test_bench_correlated.py",   # the benchmark's cr-approx row on real daemons (loopback)
    "test_bench_tune.py",         # bench_tune: a poor start, crnet tune, its pick (loopback)
    "test_bench_frames.py",
    "test_bench_hop.py",
    "test_bench_step.py",
    "test_broadcast.py",
    "test_broadcasts.py",
    "test_chunk_path.py",
    "test_cli.py",
    "test_client_bugs.py",
    "test_client_socket.py",
    "test_direct_results.py",
    "test_e2e.py",           # apart from QUICK_TESTS
    "test_e2e_failures.py",
    "test_faults.py",
    "test_fuzz.py",
    "test_gloo_peer.py",
    "test_handshake.py",
    "test_host_names.py",
    "test_jobs.py",
    "test_launch.py",
    "test_local_processes.py",
    "test_logs.py",
    "test_metrics.py",
    "test_netns.py",
    "test_notify.py",
    "test_procs.py",
    "test_run.py",
    "test_shm.py",
    "test_soak.py",
    "test_spread.py",
    "test_spread_faults.py",
    "test_status.py",
    "test_systemd.py",
    "test_tls.py",
    "test_torch.py",
    "test_torch_cuda.py",   # CUDA tensors through pinned staging (a fake device here; GPU tests skip)
    "test_torch_ddp.py",    # dist.init_process_group("crnet") and DDP with the crnet hook
    "test_torch_ddp_hosts.py",  # torchrun and a crnetd on every emulated host (network namespaces)
    "test_torch_ddp_slurm.py",  # docs/torch.md's srun command on a throwaway Slurm cluster of such hosts
    "test_train_digits.py",
    "test_transport.py",
    "test_trust.py",
    "test_trust_claims.py",   # issue 26: a child's claims (tree_step, OPEN, listen, sizes)
    "test_trust_deploy.py",   # issue 26: separate users, escaped status, credential files, TLS binding
    "test_trust_floods.py",   # issue 26: connection floods, exhausted descriptors, local clients
    "test_trust_fuzzed.py",   # issue 26: what the authenticated fuzzer found, one attack each
    "test_trust_host_identity.py",   # --tls-names: a spread host's identity its parent cannot lend
    "test_trust_keys.py",     # issue 26: jobs, barrier and broadcast keys, state answers, slots
    "test_trust_liveness.py", # issue 26: every wait keeps its bound through a master restart
    "test_trust_ring_predecessor.py",   # rar: a claimed ring predecessor, confirmed by its host
    "test_trust_state_answers.py",      # a state answer: the master's own host's first
    "test_tune.py",           # issue 28: crnet tune gathers a real tree's windows, authenticated
    "test_tune_probe.py",     # crnet tune --probe: a cold tree's links and compute, authenticated, bounded
    "test_plan_auto.py",      # issue 28: crnetd --plan auto: job 2 runs the plan tuned from job 1
})

# Async tests in these files run twice, on asyncio's loop and on uvloop's: they test the
# client side (AsyncClient, the transport it shares with the daemons, the README's loop),
# whose loop is the training process's choice. Any other async test runs once, on uvloop,
# unless it is marked ``both_loops`` (see the conftest's loop-factory hook).
BOTH_LOOPS_FILES = frozenset({
    "test_client_bugs.py",
    "test_client_socket.py",
    "test_loop.py",
    "test_shm.py",
    "test_transport.py",
})


def is_quick(file: str, name: str) -> bool:
    """Whether test ``name`` (with its parameters) of ``tests/<file>`` is in the quick tier."""
    return file in QUICK_FILES or name in QUICK_TESTS.get(file, ())

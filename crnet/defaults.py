"""Defaults shared by crnetd, the client, the launcher and the CLI: one place each.

Change a default here and every user of it follows; the CLI shows these values
in ``--help``.
"""

from __future__ import annotations

CHUNK_AUTO = 0                     # --chunk-bytes auto: grows with the vector (crnet/schemes/chunks.py)
CHUNK_BYTES = CHUNK_AUTO           # the pipelining unit; the whole tree uses the master's
TIMEOUT = 30.0                     # seconds a step may wait for its quorum at one node
KEEP_RESULTS = 4                   # finished steps' results a daemon keeps for its children
RESULT_MEMORY = 1 << 30            # bytes of results kept for training processes catching up
LOCAL_PROCESSES_MAX = 1024         # --local-processes: training processes one daemon may seat
TUNE_WINDOW = 64                   # --tune-window: steps whose times a daemon keeps for crnet tune
TUNE_WINDOW_MAX = 256
# crnet tune --probe (crnet/node/observe/probe.py): what each node sends to each child, in frames of at most
# PROBE_FRAME bytes, PROBE_ROUNDS times; the tree's answer within PROBE_DEADLINE seconds.
PROBE_BYTES = 4 << 20              # when the tree's vector size is not known yet
PROBE_BYTES_MIN, PROBE_BYTES_MAX = 64 << 10, 64 << 20
PROBE_FRAME = 1 << 20
PROBE_ROUNDS = 3
PROBE_DEADLINE = 20.0
PROBE_DUTY = 0.1                  # of the time, at most, in probes a status client asks for
STEP_WINDOW = 16                   # steps further ahead of the tree's newest result are refused
MAX_VECTOR_BYTES = 1 << 40         # the largest vector a peer may claim, where the host's
                                   # memory cannot be read (else: that memory)
OPEN_DELAY = 0.05                  # a step that began below a node and sent nothing up yet
                                   # this long after is announced (OPEN): the master's clock
# A node cut off from the master gives up on a step this long after --timeout:
# GRACE_SHARE of the timeout, between GRACE_MIN and GRACE_MAX seconds.
GRACE_SHARE, GRACE_MIN, GRACE_MAX = 0.25, 0.5, 5.0
# A peer link that takes none of the bytes queued for it this share of --timeout is cut
# off: the sends in turn behind it still make the step's deadline (spread).
STALL_SHARE = 0.25
CLIENT_SOCKET = "/run/crnet/client.sock"
CLIENT_CONNECT_TIMEOUT = 120.0     # a training process waits this long for the tree's assignment
CLIENT_RECONNECT = 60.0            # ... and this long for its daemon to come back when it died
CLIENT_RECONNECT_PAUSE = 0.1       # seconds between tries to reach a daemon that is restarting
RESOLVE_TIMEOUT = 300.0            # a node whose parent's host name stays unknown this long exits
RECONNECT_BACKOFF = (0.1, 2.0)     # first and longest pause between attempts to reach a peer
# A tree link that goes silent (a cable pulled, a switch port down) is dropped once data
# sent on it is unacknowledged this long (TCP_USER_TIMEOUT), or once an idle link's
# keepalive probes go unanswered about as long; and a dial that gets no answer in
# CONNECT_TIMEOUT is tried again. Without them TCP retransmits with doubling pauses (up
# to 2 minutes) and a link that came back stays silent for as long.
LINK_TIMEOUT = 8.0
CONNECT_TIMEOUT = 4.0
# spread, with a cluster secret: a peer link is taken as the rank it claims once that rank's
# host confirms it, over this host's own link there (crnet/node/peers/check.py). The check waits at
# most this long (for that link too, if it is still being dialed); then the link is closed
# and its dialer dials again.
PEER_CHECK_TIMEOUT = LINK_TIMEOUT
SHUTDOWN_GRACE = 5.0               # seconds an orderly shutdown may take before it is cut short
# Control payloads (ASSIGN) are small next to gradients; cap what a peer can make us hold.
MAX_CONTROL_PAYLOAD = 64 << 20
# A child that stops reading is cut off once this much is queued for it and more than
# SEND_QUEUE_VECTORS of the step's vectors (results keep coming whether or not it reads).
SEND_QUEUE_BYTES = 64 << 20
SEND_QUEUE_VECTORS = 4
# A peer that connected has this long to get through HELLO (and the authentication; TLS
# first, with --tls-*); at most this many strangers in there at once, this many more from
# addresses that proved the secret here before (up to MAX_KNOWN_ADDRESSES of them are
# remembered), and this many from one address (crnet/node/admission/doorway.py).
HANDSHAKE_DEADLINE = 10.0
MAX_HANDSHAKES = 64
MAX_HANDSHAKES_KNOWN = 64
MAX_HANDSHAKES_PER_ADDRESS = 8
MAX_KNOWN_ADDRESSES = 4096

# Sends in turn (``node.neighbours.Neighbours.in_turn``): the kernel holds at most this much
# of a paced link's bytes unsent, and in its send buffer this much or four segments, whichever
# is more (``transport.Connection.pace``: loopback's segments are larger), so the next send starts
# as the last one leaves, and no two links of a host fill its queue at once. Measured on the emulated cluster
# (bandwidth preset, spread): 128 KiB, 9,400 segments dropped at the hosts' own queues and
# 1.93 s steps; 32 KiB, none and 0.83 s; at 1 Gbit/s (large preset) 32 KiB was as fast.
PACED_UNSENT = 32 << 10

"""The consumer's network side, run by its network thread ("consumer-net", started by `Server`).

What it owns: every socket of the control plane (control ROUTER, rollouts PULL, announce PUB),
the lease book and its ledger, producer identities (which key may speak for which id), the
admission queue that hands validated groups to the training thread, parked lease requests, and
the run-directory files of that bookkeeping (leases.jsonl, ledger.json, producers.json/jsonl).
Leases are cut from the prompt order of consumer/data/, read at start.

- server.py: `Server`, the typed handle other threads hold; the sockets; wire_terms.py: the run
  spec producers are welcomed with and the limits a group is decoded within;
- loop.py: the thread itself (one poller, handlers, housekeeping); calls.py: work other threads
  queue to it, answered by futures;
- state.py: what the thread knows (`NetState`: each attribute written by one module) and the
  status every reply carries;
- control.py: registration, heartbeats, lease requests, fetch plans, goodbyes; parked.py: lease
  requests waiting for leases to free up; intake.py: groups decoded, checked, admitted;
  handshakes.py: connections whose security handshake failed, counted and said;
- leases.py: leases and the ledger as a pure state machine; admission.py: backpressure;
  identity.py: which key may speak for which producer id; liveness.py: who went silent;
- books.py: leases.jsonl, and what changed handed to book_writer.py's thread (`consumer-books`),
  which writes ledger.json and roster.py's producers' files.

Other threads reach it only through `Server`'s typed methods (consumer/server/server.py), which
run their work on the network thread; nothing here imports the training side (consumer/train/):
the learner (consumer/learner.py) is the only module that touches both.
"""

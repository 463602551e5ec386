"""The consumer's network side, run by its network thread ("consumer-net", started by `Server`).

What it owns: every socket of the control plane (control ROUTER, rollouts PULL, announce PUB),
the lease book and its ledger, producer identities (which key may speak for which id), the
admission queue that hands validated groups to the training thread, parked lease requests, the
prompts leases are cut from, and the run-directory files of that bookkeeping (leases.jsonl,
ledger.json, producers.json/jsonl).

Other threads reach it only through `Server`'s typed methods (consumer/server/server.py), which
run their work on the network thread; nothing here imports the training side (consumer/train/):
the learner (consumer/learner.py) is the only module that touches both.
"""

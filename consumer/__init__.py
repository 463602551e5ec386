"""The consumer: one learner process (under torchrun, rank 0 of several) that receives scored
groups, trains on them and publishes weights.

Rooms follow the threads that run them:
- learner.py: the process and its main (training) thread: wires the rooms, runs the step loop
  (staleness.py decides which groups a step keeps; evaluate.py scores held-out problems) and
  owns shutdown;
- data/: a task's data, read once at start (sources, rows, the prompt order);
- server/: the network thread (sockets, leases, admission, producers, the ledger);
- train/: one optimizer step on the training thread (or on every rank of an FSDP2 learner);
- snapshots/: weights out (the publisher's writer thread, fetch plans, the data plane's thread);
- key_gate.py: the CurveZMQ authenticator's thread (which keys may connect at all).
"""

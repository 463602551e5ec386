"""The consumer: one learner process (under torchrun, rank 0 of several) that receives scored
groups, trains on them and publishes weights.

Rooms follow the threads that run them:
- learner.py: the process and its main (training) thread: wires the rooms, collects each step's
  groups (staleness.py decides which a step keeps; reward_tally.py sums their rewards;
  episode_tally.py a multi-turn run's episodes;
  no_signal.py watches whether they carry a learning signal at all) and owns shutdown;
  model_checks.py checks the model when it starts (it loads; a chat template if needed);
- step.py: one optimizer step, the learner's and a replay's alike: train a batch, publish, the
  stream's entry, the metrics line;
- replay.py: the replaying learner: a recorded run's batches in order, no network;
- data/: a task's data, read once at start (sources, rows, the prompt order);
- evaluation/: every way of evaluating a model, one entry point each (`[eval]`);
- server/: the network thread (sockets, leases, admission, producers, the ledger);
- train/: one optimizer step on the training thread (or on every rank of an FSDP2 learner);
- snapshots/: weights out (the publisher's writer thread, fetch plans, the data plane's thread);
- stream/: the recorded stream (RUN/stream/) its recorder thread writes, read back for replay;
- loggers/: trackers and completions samples on their own thread, never blocking training;
- core_share.py: the learner's seat on its host's core board (torch threads per pass);
- key_gate.py: the CurveZMQ authenticator's thread (which keys may connect at all).
"""

"""The rewards: what scores a lease's completions, in the producer and in the worker processes
it spawns (a reward that hangs or crashes costs a worker, never the producer).

- scoring.py: the `Rewards` protocol the worker calls per group (the run's task rewards, or
  the fake engine's coin) and `make_rewards`, which picks one;
- runner.py: `RewardRunner`, the group's calls in one round trip to a killable process pool
  (bounded built-ins inline), timeouts, counters and rate-limited reasons;
- worker.py: the reward worker process: each call under its timer, failures with the reason;
- calls.py: a spec resolved to a function, and how its signature says it is called;
- builtins.py: the built-in reward functions, by name;
- judge.py: the prompt format and rewards lent to an evaluation that scores as training does
  (consumer/evaluation/heldout.py); row.py: what such a row carries to the rewards.
"""

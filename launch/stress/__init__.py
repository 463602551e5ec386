"""`asyncgrpo stress`: a grid of real pipeline runs under different staleness settings.

Every setting is a full run (consumer + producers as processes over ZeroMQ, launch/local.py) in
`OUT/runs/<setting>/`, on the user's own config (model, task, rewards, loss) with only what the
setting varies overridden: `staleness.max_staleness`, the importance correction, `run.seed`, and
the number of producers. plan.py builds the settings, run.py runs them one after another
(setting.py: one setting as processes; watch.py: while it runs) and keeps what each one ended
as; the numbers come from the runs' files (results.py) and the plots from the rows (plots.py).
Imports point one way: run imports setting, results and plots; setting imports watch,
results and plan; nothing here imports run.

Settings: every (seed, producers, IS mode, max_staleness), the `max_staleness = 0` setting of
each (seed, producers, IS mode) first: it is the synchronous baseline whose wall-clock time to
`--steps` is the "equal wall-clock" point of the others. An asynchronous setting then runs until
it has taken `--steps` steps AND run that long (watch.py stops it), so its reward
(and held-out score) can be read both at equal steps and at equal wall-clock.

Engines: `fake` measures scheduling and transport only (a simulated learner step of
`train.simulate_step_s`, fake generation of `fake.latency_s` per group, seeded coin rewards);
`hf` and `vllm` train the config's model (`demo` = `hf` on launch/configs/demo.toml unless a
config is given). Held-out scores come from consumer/evaluation/ when the config has a held-out
split, reward curves otherwise.

Where the processes run: local producers on the devices of launch/placement.py (recorded in
results.csv), or `external` producers the user started elsewhere with `asyncgrpo producer
--follow --connect ADDR`: each setting's consumer then binds a fixed address and waits for all of
them (`run.wait_for_producers`) before it grants a lease or starts its clock.

Ending: every setting leaves `runs/<setting>/result.json` (its results.csv row, "ok" or "failed"
with the error: the sweep goes on after a failure). Ctrl-C stops the setting in progress cleanly
and ends the sweep; `--resume` re-runs the same command, skipping every setting that ended "ok"
(a setting that failed or was interrupted starts again from scratch). results.py reads a
setting's numbers from its run files, verdict.py writes summary.md's verdict and plots.py the
sweep's plots.
"""

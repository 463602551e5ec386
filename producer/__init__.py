"""The producer: one generation process on one asyncio event loop, serving one consumer run at a
time.

- main.py: the process: signals, the follow loop, exit codes;
- worker.py: one consumer run: register, heartbeat, lease, keep the newest weights, goodbye;
- lease_task.py: one lease's task: weights good enough, sample, score, send;
- session.py: what a run is served with (engine, tokenizer, rewards, outbox), from its run spec;
- base_model.py: the consumer's model fetched once, each file verified, on a host without a copy;
- state.py: what the event loop's tasks share, and a change counter to wait on;
- control.py: the control DEALER (requests matched to replies); outbox.py: the group sender
  (PUSH), every group kept until acknowledged; announcements.py: snapshot announcements (SUB);
- weights.py: keep the newest verified snapshot loaded; pins.py: eval leases pin it;
- groups.py: a lease's sampling parameters and the group message it becomes;
- tokenizer.py: prompt text to ids, completion ids to text;
- core_share.py: an hf producer's seat on its host's core board (torch threads per token step);
- worker_pool.py: the spawned processes rewards and environments run in, replaced when a job
  hangs or kills its worker;
- backoff.py: pauses between lease requests that got nothing; endpoint_file.py: a consumer's
  endpoints.json; stall.py: a stress-test fault;
- engines/: generation engines (fake, hf, vllm) behind one contract, made by a lazy factory;
- fetch/: snapshots over the network: fetcher, chunk client, relay;
- rewards/: scoring completions: the runner, its worker processes, the built-ins;
- episodes/: multi-turn episodes: the environment contract, its calls (inline or in worker
  processes), the turns as token deltas, the episode loop, the built-in `guess` task.
- sandbox/: model-written code run contained (the code_tests reward, environments' Python tool).
"""

"""One optimizer step, run by the consumer's main (training) thread: on one device, or on every
rank of an FSDP2 learner under torchrun (ranks > 0 run nothing else).

What it owns: the `Trainer` protocol (consumer/train/protocol.py) and its implementations (one
device: trainer.py; FSDP2: sharded.py with ranks.py; no model: simulated.py), the loss (pure
tensor functions), batching, the forward over completion tokens with its LM head and attention
choice, and checkpoints (plain and sharded). What it does not do: sockets, leases or snapshots
on disk (consumer/server/, consumer/snapshots/); only the learner (consumer/learner.py) calls it.
"""

"""Weights on disk and in flight: the formats the publisher writes and producers verify.

- snapshot.py: snapshot layout, manifest, writing while hashing (BLAKE3), verification, fit;
- tensor_table.py: the safetensors layout of a tensor table: header once, a range per tensor;
- delta.py: sparse deltas between two snapshots, bitwise per element, applied only on their base;
- chunk_manifest.py: per-chunk BLAKE3 hashes of a snapshot's files (what lets anyone relay them);
- adapter.py: a LoRA adapter as a snapshot: its file's header (spec, base hash), peft's names;
- adapter_merge.py: an adapter merged into a model's linear weights (engine, eval, export).
"""

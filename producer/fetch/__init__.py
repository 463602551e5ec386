"""Snapshots over the network, on the producer's event loop: the `fetcher` (a plan from the
consumer, chunks from the sources it names, each checked, a delta applied on exactly its base),
its `chunk_client` (one DEALER per source: the consumer's data socket or a relay) and the
`relay` (a ROUTER serving the files this producer fetched and verified to other producers).

The producer's weights keeper (producer/weights.py) calls the fetcher when the consumer's own
snapshot file is not readable on this host.
"""

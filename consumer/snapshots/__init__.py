"""Weights out: from the trainer's tensors to files producers load and fetch.

Threads: the training thread only submits (`Publisher.submit`: one device-to-host copy into a host
buffer, weights_buffer.py); the publisher's writer thread writes, fsyncs and announces each snapshot
(publisher.py), then prepares what network fetchers need (chunk hashes and deltas, fetch_files.py);
the network thread plans fetches (fanout.py) and the data plane's own thread serves chunks
(dataplane.py), also of the model directory's files the run spec lists for producers without a
copy (base_model.py). Nothing here imports the network or training side.
"""

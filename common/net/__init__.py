"""The network's shared rules, for both sides' sockets.

- endpoints.py: which addresses never leave this machine; what a control endpoint is;
- sockets.py: ZeroMQ sockets per role: high-water marks, size limits, linger, CurveZMQ;
- keys.py: CurveZMQ key files: the consumer's, one pair per producer host, the allowlist;
- heartbeat.py: the heartbeat period for N live producers and the silences it allows;
- log_limit.py: rate-limited log lines (a flood of bad messages is counted, not written out).
"""

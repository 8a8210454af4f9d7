"""End-to-end benchmark harness: keyshared against pulsar-lite with the official client.

The entry point is ``bench/run_e2e.py``; this package holds its parts, one job per module:
``brokers`` starts and stops broker processes, ``workers`` is the client code that runs in
spawned processes, ``pool`` drives those processes, ``workloads`` names the configurations,
``stats`` summarises samples and ``report`` renders JSON and Markdown.
"""

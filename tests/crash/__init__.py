"""Crash tests: SIGKILL the broker under load, restart it, audit what survived."""

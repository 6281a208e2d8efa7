"""The library's tests. The configuration all three suites share (``tests``,
``examples/tests``, ``experiments/tests``) is the repository root's ``conftest.py``."""

# tests/multidevice needs 8 devices; tests/test_sharding.py runs its two files in one
# subprocess that has them.
collect_ignore = ["multidevice"]

"""The library's tests. The configuration all three suites share (``tests``,
``examples/tests``, ``experiments/tests``) is the repository root's ``conftest.py``."""

# tests/multidevice needs 8 devices; tests/test_sharding.py and tests/test_lowrank.py run
# its two files in subprocesses.
collect_ignore = ["multidevice"]

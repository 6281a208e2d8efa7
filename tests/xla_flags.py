"""The XLA flags of the test session (why: conftest.py), in a module of their own so
that a test starting a subprocess with XLA's default code generation can take them out."""

TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")

import os

# Tests run on the CPU; keep XLA from grabbing every core for one test's compile.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

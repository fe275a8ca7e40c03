"""Build of the optional C extension; metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    # Batched ZeroMQ receive/send for the node's hot paths (peermesh/zmqbatch.py).
    # Optional: without a C compiler peermesh installs and runs on pyzmq alone.
    Extension("_peermesh_zmqbatch", ["peermesh/_zmqbatch.c"], optional=True),
])

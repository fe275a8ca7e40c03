"""Build of the optional C extension; metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    # Batched ZeroMQ receive/send for the node's hot paths (peermesh/io/zmqbatch.py).
    # Optional: without a C compiler peermesh installs and runs on pyzmq alone.
    Extension("peermesh.io._zmqbatch", ["peermesh/io/_zmqbatch.c"], optional=True),
])

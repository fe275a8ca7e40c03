"""Build of the optional C extension; metadata lives in pyproject.toml.

The extension is optional: without a C compiler it is skipped and peermesh
runs on pyzmq alone. The wheel's tag follows what was built: with the
extension it is platform-specific (cp311-cp311-linux_x86_64, say); without
it the wheel holds only Python and is tagged py3-none-any.
"""

import os

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel

# the module (libzmq, batched reads and sends), then each protocol's fast path
EXTENSION = Extension(
    "peermesh.io._zmqbatch",
    [f"peermesh/io/_zmqbatch{part}.c" for part in ("", "_shared", "_zre", "_sada", "_flux")],
    depends=["peermesh/io/_zmqbatch.h"], optional=True)


class BdistWheel(bdist_wheel):
    """A pure wheel when the optional extension was not built."""

    def run(self) -> None:
        self.run_command("build")
        build_ext = self.get_finalized_command("build_ext")
        if not os.path.exists(build_ext.get_ext_fullpath(EXTENSION.name)):
            self.root_is_pure = True  # tagged py3-none-any, files in purelib
        super().run()


setup(
    # Batched ZeroMQ receive/send for the node's hot paths (peermesh/io/zmqbatch.py).
    ext_modules=[EXTENSION],
    cmdclass={"bdist_wheel": BdistWheel},
)

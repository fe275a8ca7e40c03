"""Every error peermesh raises on purpose derives from ``PeermeshError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import peermesh
from peermesh.errors import PeermeshError

#: exceptions that are not errors: a cancellation thrown into a running task
NOT_ERRORS = {"peermesh.nfp.tasks.JobCancelled",
              "peermesh.nfp.tasks.Interrupt"}


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(peermesh.__path__, "peermesh."):
        if info.name.startswith("peermesh.spark"):
            try:  # needs pyspark only where it is installed
                importlib.import_module(info.name)
            except ImportError:
                continue
        names.append(info.name)
    return names


def test_every_public_exception_class_derives_from_peermesh_error() -> None:
    wrong = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == name and not attr.startswith("_")
                    and f"{name}.{attr}" not in NOT_ERRORS
                    and not issubclass(obj, (PeermeshError, KeyboardInterrupt))):
                wrong.append(f"{name}.{attr}")
    assert wrong == []

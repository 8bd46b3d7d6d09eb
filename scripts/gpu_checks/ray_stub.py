"""Ray's stand-ins for a machine without it (see ``stub_missing_ray``)."""

from __future__ import annotations

import sys


def stub_missing_ray() -> bool:
    """Make ``import ray`` (and its submodules) succeed with inert stand-ins when Ray is not installed.

    ``import verl`` imports Ray at module level (its single-controller and protocol modules), but the
    advantage-estimator registry this check exercises never calls it. Ray's wheel (~70 MB) would not fit
    the wheel folder, so its names are stubbed: attributes are placeholders, decorators return what they
    decorate. Anything that really uses Ray would fail loudly. Returns whether the stub was installed.
    """
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    if importlib.util.find_spec("ray") is not None:
        return False

    class Placeholder:
        def __init__(self, name):
            self._name = name

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{self._name}.{name}")

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and not kwargs and callable(args[0]):
                return args[0]  # used as a decorator (@ray.remote)
            return Placeholder(f"{self._name}()")

        def __getitem__(self, item):
            return self

        def __or__(self, other):
            return self

        __ror__ = __or__

        def __mro_entries__(self, bases):
            return (object,)

        def __repr__(self):
            return f"<ray stub {self._name}>"

    class StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Placeholder(f"{self.__name__}.{name}")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname == "ray" or fullname.startswith("ray."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = StubModule(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())
    return True

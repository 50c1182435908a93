"""Run a function with a module the moment it is imported (now, if it already is), without importing it."""

import importlib.abc
import importlib.util
import sys


def when_imported(name, then):
    """``then(module)`` now if module *name* is imported, else the moment it is."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    elif not any(isinstance(finder, _Finder) and finder.name == name and finder.then == then
                 for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, then))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: lets the other finders find module *name*, then calls *then* with it once loaded."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            execute, then = spec.loader.exec_module, self.then

            def exec_module(module):
                execute(module)
                then(module)

            spec.loader.exec_module = exec_module
        return spec

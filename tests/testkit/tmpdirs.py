"""Folders that outlive one test: a module fixture's project, removed when the module's tests passed.

pytest removes a passed test's ``tmp_path`` when it ends, but a ``tmp_path_factory.mktemp`` folder only at the end
of the session; a module's tiny project (with its checkpoints, 50-150 MB a run) would then take disk for the rest
of the suite. ::

    @pytest.fixture(scope="module")
    def root(tmp_path_factory, request):
        with module_folder(tmp_path_factory, request, "kill") as root:
            ...                # build and train
            yield root         # kept for reading when a test of the module failed
"""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def module_folder(tmp_path_factory, request, name: str) -> Iterator[Path]:
    """A new folder ``<basetemp>/<name>N``, removed on leaving the ``with`` unless a test failed meanwhile (or the
    body raised)."""
    folder = tmp_path_factory.mktemp(name)
    failed = request.session.testsfailed
    yield folder
    if request.session.testsfailed == failed:
        shutil.rmtree(folder, ignore_errors=True)

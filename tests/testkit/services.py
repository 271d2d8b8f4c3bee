"""A service a test starts for real (SLURM, PostgreSQL, ``mlflow server``): a context manager that stops whatever
part of it did start, also when starting it fails half way."""
from __future__ import annotations


class Service:
    """Subclasses define :meth:`start` (returns self) and :meth:`stop` (safe to call on a half-started service)."""

    def start(self) -> "Service":
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

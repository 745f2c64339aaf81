"""The tests of this folder that talk to a server share the module-scoped in-process tiny one."""

from tests.support.server import tiny_server  # noqa: F401  (the fixture)

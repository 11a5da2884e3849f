"""Moved to ``deploy/redis_server.py`` (benchmarks use it too, and bench/ may not import tests).

Kept only so test files written before the move still import; new code imports
``deploy.redis_server``. Delete this file once no test imports ``tests.support.redis_server``.
"""

from deploy.redis_server import *  # noqa: F401,F403

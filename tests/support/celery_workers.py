"""Moved to ``deploy/celery_workers.py`` (benchmarks use it too, and bench/ may not import tests).

Kept only so test files written before the move still import; new code imports
``deploy.celery_workers``. Delete this file once no test imports ``tests.support.celery_workers``.
"""

from deploy.celery_workers import *  # noqa: F401,F403

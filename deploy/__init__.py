"""Running irbench for real on one machine, as plain processes (stdlib only, nothing of ours).

``local_cluster`` (also a script: ``python deploy/local_cluster.py up``) starts a whole cluster;
``redis_server.RedisServer`` (a private redis-server on a free loopback port) and
``celery_workers.CeleryWorkers`` (N ``celery worker`` processes, each in its own process group)
are the launchers the distributed tests and benchmarks share; ``processes`` is what they have in
common (spawn in a process group, liveness by pid and start time, tiered stop, free port, Redis PING).
"""

__all__ = ["celery_workers", "local_cluster", "processes", "redis_server", "seaweed_server"]

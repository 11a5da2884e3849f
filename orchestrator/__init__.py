"""Campaign spec, corpus loading, planning, dispatch/resume/status, executors and the ``irbench``
CLI (imports workers, storage, analysis, and simulator for ``irbench simulate``/``demo``)."""

__all__ = [
    "analysis_jobs",
    "analysis_tasks",
    "artifact_import",
    "audit_cli",
    "availability",
    "campaign",
    "celery_executor",
    "celery_options",
    "cli",
    "corpus",
    "demo",
    "distributed_campaign",
    "distributed_cli",
    "instruction",
    "local",
    "ops_cli",
    "plan",
    "probe",
    "progress",
    "report_cli",
    "spec",
    "status_report",
    "store_cursor",
    "worker_app",
]

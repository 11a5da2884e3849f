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
    "cli",
    "corpus",
    "demo",
    "instruction",
    "local",
    "ops_cli",
    "plan",
    "probe",
    "progress",
    "report_cli",
    "spec",
    "worker_app",
]

"""Campaign spec, corpus loading, planning, dispatch/resume/status, executors and the ``irbench``
CLI (imports workers, storage, analysis, and the simulator and viewer it hosts: ``irbench
simulate``, ``demo``, ``view``)."""

__all__ = [
    "analysis_jobs",
    "analysis_progress",
    "analysis_tasks",
    "artifact_import",
    "audit_cli",
    "availability",
    "campaign",
    "celery_executor",
    "celery_options",
    "cli",
    "cli_errors",
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
    "view_cli",
    "worker_app",
]

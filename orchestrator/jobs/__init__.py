"""Jobs beside campaigns: analysis runs and tasks, probes, availability checks, artifact import."""

__all__ = [
    "analysis",
    "analysis_plan",
    "analysis_progress",
    "analysis_tasks",
    "artifact_import",
    "availability",
    "probe",
]

"""Jobs beside campaigns: analysis runs and tasks, probes, availability checks, artifact import, scheduled waves."""

__all__ = [
    "analysis",
    "analysis_plan",
    "analysis_progress",
    "analysis_tasks",
    "artifact_import",
    "availability",
    "probe",
    "scheduled_wave",
    "wave_schedule",
]

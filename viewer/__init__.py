"""``irbench view``: a local, read-only web app over the run store and the analysis outputs
(campaigns → leaderboard → a model's cells → one cell's runs side by side → one run)."""

from viewer.app import create_app
from viewer.config import ViewerConfig, find_analysis_dir, find_report
from viewer.index import RunIndex, RunPage
from viewer.outputs import AnalysisOutputs
from viewer.query import QueryError, RunQuery

__all__ = ["AnalysisOutputs", "QueryError", "RunIndex", "RunPage", "RunQuery", "ViewerConfig",
           "build_app", "create_app", "find_analysis_dir", "find_report"]


def build_app(config: ViewerConfig):
    """Load the store and outputs named by ``config`` and return the ASGI app."""
    outputs = AnalysisOutputs.load(config.analysis_dir)
    index = RunIndex.load(config.data_dir, outputs, threads=config.threads,
                          memory_limit_mb=config.memory_limit_mb, work_dir=config.work_dir)
    return create_app(index, config)

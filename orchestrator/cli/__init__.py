"""The ``irbench`` command line: typer commands that parse options, call one function and print."""

__all__ = [
    "app",
    "audit",
    "demo",
    "distributed",
    "envfile",
    "interrupts",
    "launch",
    "llama_server",
    "ops",
    "rates",
    "real",
    "real_demo",
    "report",
    "run_command",
    "shell",
    "status_command",
    "status_report",
    "summary_tables",
    "user_errors",
    "view",
]

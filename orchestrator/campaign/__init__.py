"""What a campaign is: its spec and checks, corpus, plan, ad-hoc campaigns and retry selection."""

__all__ = [
    "adhoc",
    "corpus",
    "instruction",
    "limits",
    "plan",
    "prepared",
    "retry",
    "spec",
    "spec_checks",
    "status",
]

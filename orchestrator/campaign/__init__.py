"""What a campaign is: its spec and checks, corpus, plan, ad-hoc campaigns and retry selection."""

__all__ = [
    "adhoc",
    "corpus",
    "driver",
    "instruction",
    "limits",
    "plan",
    "retry",
    "spec",
    "spec_checks",
]

"""What a campaign is: its spec and checks, corpus, plan, ad-hoc campaigns, retry selection, which wave runs, and how it ended."""

__all__ = [
    "adhoc",
    "cap_preview",
    "corpus",
    "cost",
    "instruction",
    "limits",
    "outcome",
    "plan",
    "prepared",
    "preview",
    "prices",
    "retry",
    "spec",
    "spec_checks",
    "spend_cap",
    "status",
    "tokens",
    "waves",
]

"""What a campaign is: its spec and checks, corpus, plan (lazy, its state a bitmap), ad-hoc campaigns, retry selection, which wave runs, and how it ended."""

__all__ = [
    "adhoc",
    "cap_preview",
    "corpus",
    "cost",
    "instruction",
    "limits",
    "outcome",
    "plan",
    "plan_state",
    "prepared",
    "preview",
    "prices",
    "retry",
    "run_bitmap",
    "spec",
    "spec_checks",
    "spend_cap",
    "status",
    "tokens",
    "waves",
]

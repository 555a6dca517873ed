"""The kernel's authority: who may run what, and how much. ``policies`` writes a principal's
policy and its history, ``binding`` ties jobs to the policy revision they were checked
against, ``budgets`` keeps the usage windows, and ``reservations`` authorizes a claim (or a
run) against them in the claim's own transaction.
"""

"""The scheduler's rules, stated once and written nowhere else: the occurrence lifecycle table
(``lifecycle``), the events of the audit trail (``events``), triggers and the misfire rules
(``triggers``, ``schedules``), what a handler's outcome is and what of it is stored
(``outcomes``), chain specs (``chains``), what a follow-up or a batch's callback is told of
its cause (``causes``), authority envelopes and principals (``authority``),
occurrence identity (``identity``) and input validation (``validation``).

No module here writes occurrence state: the kernel applies these rules
(``docs/design.md``, "The code's layers").
"""

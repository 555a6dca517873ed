"""Handlers and the jobs declared beside them: ``@scheduler.handler`` registers the function
that runs a kind (``registry``); ``job={...}`` and ``declare_job`` declare jobs in code, which
``runscheduler`` and ``scheduler_sync`` write through the kernel (``declared``).
"""

"""Autonomous runs an operator defines: SOPs on schedules, on demand and from webhooks.

- ``config``: the ``automation.sops`` YAML section (pydantic, validated like the rest);
- ``schedule``: pure schedule arithmetic (cron with a time zone, every, at; catch-up);
- ``models`` / ``store``: SOP definitions, run history, Teams conversation references;
- ``runner``: one run through the one turn handler, as cron-system / sop-system / webhook-system;
- ``scheduler``: the loop that fires due runs (exactly once across processes);
- ``payload``: how a webhook payload reaches the model (as data) and what it may not become;
- ``api``: the plain async functions the CLI and the dashboard call;
- ``service``: the object the Gateway owns.

This package's ``__init__`` imports nothing, so ``gateway.config`` can import
``gateway.automation.config`` without a cycle.
"""
